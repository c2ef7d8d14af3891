#!/usr/bin/env bash
# ferry mirror and store lists on file:// and http:// stores (no network
# namespaces; wan_netns.sh puts the same pieces behind shaped links):
# verbatim copies, a mirror of a mirror, catch-up through the anchor, a
# mirror killed mid-copy (no half version; the next run reuses what was
# copied), corrupt objects upstream (refused) and in the mirror (islands
# fall back), a mirror that is down or behind, refusals (DST ahead, another
# lineage), GC of the mirror.
set -u
TEST_NAME=wan_mirror
source tests/tools/sync_env.sh
source tests/tools/wan_env.sh
sync_built || skip_all "sync layer or tools not built (NO_NET=1?)"

st gen "$WORK/m" 12 40000 3 >/dev/null || { bad "generate models"; finish; exit 1; }
model() { printf '%s/m/m-%03d.safetensors' "$WORK" "$1"; }
O=$WORK/origin M=$WORK/mirror M2=$WORK/mirror2
pub() { fy publish "$O" --run r "$(model "$1")" --anchor-every 4 -q || bad "publish $1"; }
head_ver() { sed -nE 's/^ *"version": *([0-9]+).*/\1/p' "$1/r/HEAD"; }
jfield() { sed -E "s/.*\"$1\": *([0-9]+).*/\1/" <<<"$2"; }

pub 0
fy mirror "$O" "$WORK/early" --run r -q || bad "mirror version 1"
for i in 1 2; do pub "$i"; done
check "mirror copies versions 1..3" fy mirror "$O" "$M" --run r -q
check "... HEAD byte-identical to the upstream's" cmp -s "$O/r/HEAD" "$M/r/HEAD"
check "... every object byte-identical" diff -r "$O/r" "$M/r"
out=$(fy mirror "$O" "$M" --run r --json)
check "a second run copies nothing" test "$(jfield versions_copied "$out")" = 0
pub 3; pub 4
check "mirror of a mirror (tree)" bash -c "fy mirror '$O' '$M' --run r -q && fy mirror '$M' '$M2' --run r -q"
check "... the leaf's HEAD is the origin's" cmp -s "$O/r/HEAD" "$M2/r/HEAD"
check "an island pulls from the leaf" fy pull "$M2" --run r --to "$WORK/i1.safetensors" -q
check "... bit-identical to the published model" same_model "$(model 4)" "$WORK/i1.safetensors"

# a DC a few versions behind copies the chain; one cut off across an
# anchor starts at the anchor, not the chain
for i in 5 6 7 8 9; do pub "$i"; done   # anchors: 1 5 9
out=$(fy mirror "$O" "$M" --run r --json)
check "a mirror at 5, HEAD 10: the chain 6..10 is copied (less than anchor 9)" test "$(jfield first_copied "$out")" = 6
out=$(fy mirror "$O" "$WORK/early" --run r --json)
check "a mirror at 1, HEAD 10: the copy starts at the anchor of HEAD (9)" test "$(jfield first_copied "$out")" = 9
check "... and the island follows through the mirror" bash -c "fy pull '$WORK/early' --run r --to '$WORK/i1.safetensors' -q"
check "... bit-identical" same_model "$(model 9)" "$WORK/i1.safetensors"

# a corrupt object upstream is refused; DST stays on its version
pub 10
d=$(ls "$O"/r/v/00000000000000000011-*.patch)
cp "$d" "$WORK/good.patch"
printf '\xff' | dd of="$d" bs=1 seek=200 conv=notrunc status=none
check_rc "a corrupt delta upstream: the mirror refuses it (exit 6)" 6 fy mirror "$O" "$M" --run r -q
check "... DST's HEAD is still version 10" test "$(head_ver "$M")" = 10
cp "$WORK/good.patch" "$d"
check "... repaired upstream: copied" fy mirror "$O" "$M" --run r -q
check "... now 11" test "$(head_ver "$M")" = 11

# a corrupt object in the mirror: islands fall back to the upstream
pub 11
fy mirror "$O" "$M" --run r -q || bad "mirror 12"
d=$(ls "$M"/r/v/00000000000000000012-*.patch)
printf '\xff' | dd of="$d" bs=1 seek=200 conv=notrunc status=none
check_rc "a corrupt mirror alone: the pull fails (exit 6)" 6 fy pull "$M" --run r --to "$WORK/i1.safetensors" -q
err=$(fy pull "$M" --run r --to "$WORK/i1.safetensors" --fallback "$O" 2>&1 >/dev/null)
check "with --fallback the island gets version 12 from the upstream" same_model "$(model 11)" "$WORK/i1.safetensors"
check "... and says so" grep -q "served by the fallback" <<<"$err"

# a mirror that is down (a dead http:// endpoint) or behind
PORT=$(free_port)
check "a mirror that is down: fallback" fy pull "http://127.0.0.1:$PORT" --run r --to "$WORK/i2.safetensors" --fallback "$O" \
    --deadline 2 -q
check "... bit-identical" same_model "$(model 11)" "$WORK/i2.safetensors"
check "a mirror behind (--min-version above its HEAD): fallback" fy pull "$M2" --run r --to "$WORK/i3.safetensors" \
    --min-version 12 --fallback "$O" -q
check "... bit-identical" same_model "$(model 11)" "$WORK/i3.safetensors"

# hostile first stores (review of issue 23): a mirror answering 416 to
# everything, one redirecting every request to ftp://, a file:// mirror
# whose HEAD is a symbolic link (to a valid HEAD) or a FIFO.  Each used to
# fail the pull (STORE_RANGE, STORE_URL, I/O, or a hang) without trying the
# next store; the island must get version 12 from the fallback.
cat >"$WORK/hostile.py" <<'PYEOF'
import http.server, sys
mode = sys.argv[1]
class H(http.server.BaseHTTPRequestHandler):
    def answer(self):
        if mode == "416":
            self.send_response(416)
            self.send_header("Content-Range", "bytes */0")
        else:
            self.send_response(302)
            self.send_header("Location", "ftp://127.0.0.1" + self.path)
        self.send_header("Content-Length", "0")
        self.end_headers()
    do_GET = do_HEAD = answer
    def log_message(self, *a): pass
srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
print("port", srv.server_address[1], flush=True)
srv.serve_forever()
PYEOF
for mode in 416 ftp; do
    $PY -u "$WORK/hostile.py" $mode >"$WORK/hostile-$mode.log" 2>&1 &
    PIDS+=($!)
    wait_for "$WORK/hostile-$mode.log" 'port [0-9]+' 100 || bad "start the $mode server"
done
P416=$(sed -nE 's/^port ([0-9]+)/\1/p' "$WORK/hostile-416.log")
PFTP=$(sed -nE 's/^port ([0-9]+)/\1/p' "$WORK/hostile-ftp.log")
cp -r "$O" "$WORK/mlink" && rm "$WORK/mlink/r/HEAD" && ln -s "$O/r/HEAD" "$WORK/mlink/r/HEAD"
cp -r "$O" "$WORK/mfifo" && rm "$WORK/mfifo/r/HEAD" && mkfifo "$WORK/mfifo/r/HEAD"
for h in "416 to everything|http://127.0.0.1:$P416" "redirects to ftp://|http://127.0.0.1:$PFTP" \
         "HEAD a symbolic link|$WORK/mlink" "HEAD a FIFO|$WORK/mfifo"; do
    what=${h%%|*} url=${h#*|}
    rm -f "$WORK/i7.safetensors"*
    check_rc "a mirror alone whose $what: the pull fails at once" 1 \
        timeout 20 "$FERRY" pull "$url" --run r --to "$WORK/i7.safetensors" --deadline 5 -q
    err=$(timeout 20 "$FERRY" pull "$url" --run r --to "$WORK/i7.safetensors" --fallback "$O" --deadline 5 2>&1 >/dev/null)
    check "a mirror whose $what: the fallback serves version 12" same_model "$(model 11)" "$WORK/i7.safetensors"
    check "... and says so" grep -q "served by the fallback" <<<"$err"
done

# refusals: DST ahead of SRC, DST on another lineage
check_rc "DST ahead of SRC is refused (exit 3)" 3 fy mirror "$M2" "$O" --run r -q
fy publish "$WORK/other" --run r "$(model 0)" -q || bad "publish other"
fy publish "$WORK/other2" --run r "$(model 1)" -q || bad "publish other2"
check_rc "DST holding another version 1 is refused (exit 3)" 3 fy mirror "$WORK/other" "$WORK/other2" --run r -q

# a mirror killed mid-copy (rate-capped http:// upstream served by nginx):
# no half version, and the next pass resumes the full object's download
# nginx: ETags and ranges, so the full object is fetched in parallel chunks
command -v nginx >/dev/null || { bad "nginx is not installed (scripts/install-deps.sh installs nginx-light)"; finish; exit 1; }
chmod 755 "$WORK"
# the server caps each response at 128 KiB/s, so the 2 MB full object takes
# seconds in 256 KiB chunks whatever the machine's speed: the kill below
# lands mid-copy (a client-side cap alone let a quiet machine finish first)
wan_nginx "" "$O" "127.0.0.1:$PORT" origin 128k || bad "start nginx"
st gen "$WORK/b" 2 1000000 5 >/dev/null || bad "generate big models"
fy publish "$O" --run big "$WORK/b/m-000.safetensors" -q || bad "publish big 1"
fy mirror "$O" "$WORK/m3" --run big -q || bad "m3 at 1"
fy publish "$O" --run big "$WORK/b/m-001.safetensors" --anchor -q || bad "publish big 2 (anchor)"
mkdir -p "$WORK/mtmp"
"$FERRY" mirror "http://127.0.0.1:$PORT" "$WORK/m3" --run big --rate 200000 --chunk-size 262144 --tmp-dir "$WORK/mtmp" -q &
mp=$!
# killed as soon as one chunk of the full object is in (the state file says so)
for _ in $(seq 1 500); do
    grep -qs 1 <(tail -c 8 "$WORK"/mtmp/*.part.state 2>/dev/null) && break
    sleep 0.02
done
kill -9 $mp 2>/dev/null; wait $mp 2>/dev/null
big_head() { sed -nE 's/^ *"version": *([0-9]+).*/\1/p' "$WORK/m3/big/HEAD"; }
check "killed mid-copy: the delta of 2 landed, its manifest did not" \
    bash -c "ls '$WORK'/m3/big/v/00000000000000000002-*.patch >/dev/null && ! ls '$WORK'/m3/big/v/00000000000000000002-*.json >/dev/null 2>&1"
check "... DST's HEAD still names 1" test "$(big_head)" = 1
done_chunks=$(cat "$WORK"/mtmp/*.part.state 2>/dev/null | tail -n 1 | tr -cd 1 | wc -c)
check "... the full object's download left its state: $done_chunks chunks of 256 KiB done" test "$done_chunks" -gt 0
check "... an island on DST gets 1, verified" fy pull "$WORK/m3" --run big --to "$WORK/i4.safetensors" -q
check "... bit-identical to 1" same_model "$WORK/b/m-000.safetensors" "$WORK/i4.safetensors"
out=$(fy mirror "http://127.0.0.1:$PORT" "$WORK/m3" --run big --chunk-size 262144 --tmp-dir "$WORK/mtmp" --json)
check "the next run completes and reuses the delta" test "$(jfield objects_reused "$out")" = 1
check "... HEAD 2" test "$(big_head)" = 2
left=$(ls -A "$WORK/mtmp")
check "... the staged download is gone ($left)" test -z "$left"
check "... an island gets 2" fy pull "$WORK/m3" --run big --to "$WORK/i4.safetensors" -q
check "... bit-identical" same_model "$WORK/b/m-001.safetensors" "$WORK/i4.safetensors"

# GC of the mirror
pub 0   # 13, an anchor
out=$(fy mirror "$O" "$M" --run r --keep 1 --grace 0 --json)
check "--keep 1 GCs the mirror" test "$(jfield gc_deleted "$out")" -gt 0
check "... an island still reaches HEAD" fy pull "$M" --run r --to "$WORK/i5.safetensors" -q
check "... bit-identical" same_model "$(model 0)" "$WORK/i5.safetensors"

# --follow bounded by --until-version
fy mirror "$O" "$M2" --run r --follow --until-version 14 --poll-ms 50 --for 30 -q &
fp=$!
sleep 0.3
pub 1
wait $fp
check "--follow copies a new version and stops at --until-version" test "$(head_ver "$M2")" = 14
# signed runs (docs/SECURITY.md): the mirror copies HEAD and manifests with
# their signature trailers, so islands that trust the trainer's key pull
# from the mirror; a mirror that trusts another key refuses the upstream
fy keygen -o "$WORK/trainer" >/dev/null && fy keygen -o "$WORK/other-key" >/dev/null || bad "keygen"
for i in 0 1 2; do
    fy publish "$O" --run signed "$(model "$i")" --sign-key "$WORK/trainer.key" -q || bad "signed publish $i"
done
check "a mirror that trusts the trainer's key copies the signed run" \
    fy mirror "$O" "$WORK/ms" --run signed --trust-key "$WORK/trainer.pub" -q
check "... byte for byte, signatures included" diff -r "$O/signed" "$WORK/ms/signed"
check "... an island trusting the key pulls from the mirror" \
    fy pull "$WORK/ms" --run signed --to "$WORK/i6.safetensors" --trust-key "$WORK/trainer.pub" -q
check "... bit-identical" same_model "$(model 2)" "$WORK/i6.safetensors"
check_rc "a mirror trusting another key refuses the run (exit 7)" 7 \
    fy mirror "$O" "$WORK/ms2" --run signed --trust-key "$WORK/other-key.pub" -q
check "... and writes no HEAD" test ! -e "$WORK/ms2/signed/HEAD"
# the main job with its islands behind a mirror: same trajectories and
# weights as without (sequential mode is deterministic), policy from the mirror
# (ferry-demo, examples/rl/demo)
DEMO=${FERRY_BUILD:-$PWD/build}/ferry-demo
SMALL=(--islands 2 --steps 5 --dim 32 --prompts 4 --group 4 --seed 3 --mode sequential --json --no-cache)
timeout 120 "$DEMO" "${SMALL[@]}" --report "$WORK/d1.html" >"$WORK/d1.json" 2>"$WORK/d1.err" || bad "demo without a mirror"
timeout 120 "$DEMO" "${SMALL[@]}" --report "$WORK/d2.html" --mirror "$WORK/dmirror" >"$WORK/d2.json" 2>"$WORK/d2.err" || bad "demo with --mirror"
hashes() { grep -o '"traj_hash": *"[0-9a-f]*", *"masters_hash": *"[0-9a-f]*"' "$1"; }
h1=$(hashes "$WORK/d1.json") h2=$(hashes "$WORK/d2.json")
check "ferry-demo --mirror: trajectories and masters identical to the run without" test -n "$h1" -a "$h1" = "$h2"
mh=$(ls "$WORK"/dmirror/*/policy/HEAD 2>/dev/null | head -1)
check "... the mirror followed the policy run (HEAD at version 5 or 6 of 6)" test -n "$mh" -a "$(sed -nE 's/^ *"version": *([0-9]+).*/\1/p' "$mh")" -ge 5
finish
