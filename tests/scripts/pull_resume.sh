#!/usr/bin/env bash
# Transfers that fill long links, end to end, against
# tests/tools/s3_strict_server.py (which counts what it serves):
#   - ferry publish --concurrency: the anchor goes up as a multipart upload
#     with several parts in flight;
#   - ferry pull fetches the anchor as parallel ranged GETs (--concurrency,
#     --chunk-size); killed (SIGKILL) in the middle of a rate-capped
#     download, the next pull continues from PATH.ferry-download.ID.part and
#     fetches only the chunks that were missing (bytes served are counted),
#     and the result is bit for bit the published model;
#   - a .part altered on disk between the two runs is caught by the hash
#     check (exit 6, PATH untouched), and the pull after that starts over.
set -u
TEST_NAME=pull_resume
source tests/tools/sync_env.sh

sync_built || skip_all "sync layer or tools not built (NO_NET=1?)"
KEY=AKIARESUME
SECRET='resume/secret+key'
start_strict "$KEY" "$SECRET"
export AWS_ACCESS_KEY_ID=$KEY AWS_SECRET_ACCESS_KEY=$SECRET AWS_REGION=us-east-1 AWS_ENDPOINT_URL=$EP
export AWS_CONFIG_FILE=$WORK/none AWS_SHARED_CREDENTIALS_FILE=$WORK/none AWS_EC2_METADATA_DISABLED=true
unset AWS_SESSION_TOKEN AWS_ENDPOINT_URL_S3 AWS_PROFILE
U=s3://bkt/resume
CHUNK=524288

st gen "$WORK/m" 1 3000000 17 >/dev/null
M=$WORK/m/m-000.safetensors
SIZE=$(stat -c %s "$M")
check "a checkpoint of $SIZE bytes" [ "$SIZE" -gt $((8 * CHUNK)) ]

# --- publish: a multipart upload, 4 parts in flight --------------------------
strict_ctl "reset=1&part_delay=100"
fy publish $U --run r "$M" --part-size 1048576 --concurrency 4 -q
check "ferry publish --concurrency 4 --part-size 1 MiB: published" [ $? -eq 0 ]
parts=$(strict_stat upload_parts) inflight=$(strict_stat parts_in_flight_max)
echo "    $parts parts uploaded, at most $inflight at once"
check "the anchor went up in parts, several in flight at once (at most 4)" \
    [ "$parts" -ge 6 -a "$inflight" -ge 2 -a "$inflight" -le 4 ]
check "no multipart upload left open" [ "$(strict_stat uploads)" = 0 ]
strict_ctl "part_delay=0"

# --- pull, killed mid-download --------------------------------------------------
P=$WORK/island.safetensors
strict_ctl "reset=1"
# run directly (not through fy's timeout) so that the kill reaches ferry
# itself; bounded by the loop below, which kills it in any case
"$FERRY" pull $U --run r --to "$P" --concurrency 2 --chunk-size $CHUNK --rate 300000 -q 2>"$WORK/pull1.err" &
pullpid=$!
PIDS+=($pullpid)
# the state file records each chunk done ('1'); wait for two of them
done_chunks() { tail -n +2 "$WORK"/island.safetensors.ferry-download.*.part.state 2>/dev/null | tr -cd 1 | wc -c; }
for ((i = 0; i < 300; i++)); do
    [ "$(done_chunks)" -ge 2 ] && break
    sleep 0.1
done
kill -9 "$pullpid" 2>/dev/null
wait "$pullpid" 2>/dev/null
sleep 0.2 # the server notices the closed connections
D=$(done_chunks)
N=$(( (SIZE + CHUNK - 1) / CHUNK ))
echo "    pull killed with $D of $N chunks done, $(strict_stat range_bytes) bytes served"
check "the pull was killed mid-download (2..$((N - 1)) chunks done)" [ "$D" -ge 2 -a "$D" -lt "$N" ]
check "PATH was not written" [ ! -e "$P" ]
check "the download is kept beside PATH (.part and .part.state)" \
    bash -c "ls '$WORK'/island.safetensors.ferry-download.*.part.state && ls '$WORK'/island.safetensors.ferry-download.*.part" >/dev/null

# bytes the missing chunks hold, from the state file (the last chunk may be short)
state=$(ls "$WORK"/island.safetensors.ferry-download.*.part.state)
missing=$($PY - "$state" <<'PYEOF'
import sys
head, flags = open(sys.argv[1]).read().split("\n", 1)
_, size, chunk, _ = head.split(" ")
size, chunk = int(size), int(chunk)
print(sum(min(chunk, size - i * chunk) for i, f in enumerate(flags) if f != "1"))
PYEOF
)
cp "$WORK"/island.safetensors.ferry-download.*.part "$WORK/saved.part"
cp "$state" "$WORK/saved.state"

strict_ctl "reset=1"
fy pull $U --run r --to "$P" --concurrency 2 --chunk-size $CHUNK -q
check "the next pull completes" [ $? -eq 0 ]
served=$(strict_stat range_bytes)
echo "    second pull: $served bytes of ranged GETs served, $missing missing after the kill, object $SIZE"
check "it fetched exactly the missing chunks ($missing bytes), not the whole object" [ "$served" = "$missing" ]
check "and the result is the published model, bit for bit" same_model "$P" "$M"
check "ferry pull --check confirms version 1" fy pull $U --run r --to "$P" --check -q
check "nothing is left beside PATH" bash -c "! ls '$WORK'/island.safetensors.ferry-download.* 2>/dev/null"
# a download a killed pull left while PATH already holds HEAD: no commit
# comes to drop it, so the pull with nothing to do removes it
cp "$WORK/saved.part" "$WORK/island.safetensors.ferry-download.$(printf '%016x' 1).part"
check "a pull at HEAD succeeds" fy pull $U --run r --to "$P" -q
check "and removes the stale download beside PATH" bash -c "! ls '$WORK'/island.safetensors.ferry-download.* 2>/dev/null"

# --- a .part altered on disk: caught, never used ----------------------------------
Q=$WORK/other.safetensors
id=${state##*.ferry-download.}; id=${id%.part.state}
cp "$WORK/saved.part" "$Q.ferry-download.$id.part"
cp "$WORK/saved.state" "$Q.ferry-download.$id.part.state"
# flip bytes inside the first chunk, which the state says is done
first=$(( $(head -n 1 "$WORK/saved.state" | wc -c) ))
$PY - "$Q.ferry-download.$id.part" "$(head -c $((first + 1)) "$WORK/saved.state" | tail -c 1)" <<'PYEOF'
import sys
f = open(sys.argv[1], "r+b")
f.seek(4096 if sys.argv[2] == "1" else 0)
b = f.read(16)
f.seek(f.tell() - 16)
f.write(bytes(x ^ 0x5A for x in b))
PYEOF
check_rc "a pull resuming from an altered .part: the object fails verification (exit 6)" 6 \
    fy pull $U --run r --to "$Q" --concurrency 2 --chunk-size $CHUNK -q 2>"$WORK/bad.err"
sed 's/^/    /' "$WORK/bad.err" | head -3
check "PATH was not written" [ ! -e "$Q" ]
strict_ctl "reset=1"
check "the pull after it starts over and succeeds" fy pull $U --run r --to "$Q" --concurrency 2 --chunk-size $CHUNK -q
check "fetching the whole object again" [ "$(strict_stat range_bytes)" = "$SIZE" ]
check "bit for bit" same_model "$Q" "$M"

# --- options ------------------------------------------------------------------------
check_rc "--concurrency 0 is refused (usage, exit 2)" 2 fy pull $U --run r --to "$WORK/x" --concurrency 0 2>/dev/null
check_rc "--chunk-size below 4096 is refused (exit 2)" 2 fy pull $U --run r --to "$WORK/x" --chunk-size 100 2>/dev/null
check_rc "publish --concurrency 65 is refused (exit 2)" 2 fy publish $U --run r "$M" --concurrency 65 2>/dev/null
finish
