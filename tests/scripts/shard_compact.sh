#!/usr/bin/env bash
# `ferry compact` of a sharded run (docs/SHARDING.md "Compaction"), on a
# file:// store with rl-a steps 0..6 published by 4 trainer ranks under
# real MPI (mpirun -np 4 build/ferry-shard-mpi --tile-words 256
# --anchor-every 4: versions 1..7, anchors 1 and 5):
#   - `ferry compact --from 2 --to 6 --json` writes one object per rank
#     (RUN/c/2-6-ID-rRANK.patch) listed in RUN/compactions.json; its bytes
#     are below the deltas 3..6 it replaces and below the anchor (printed:
#     the measure of docs/SHARDING.md);
#   - `ferry log` lists it by its rank objects (count, rank 0's key);
#   - an island holding version 2 (`ferry shard-pull --out`) pulls 6 through
#     it ("compacted 2..6"): fewer tile bytes and fewer bytes in all than an
#     island that took the chain 2..6 before the compaction existed, and its
#     slices are bit-identical to the slices of step-005.safetensors and to
#     the chain's; to HEAD (7) it takes "compacted 2..6 + chain 6..7";
#   - every tile's first payload byte flipped in every rank object, a broken tile index
#     (magic), a root changed in the compaction index: the island refuses
#     the compacted objects and takes the chain ("chain 2..6 (compacted 2..6
#     refused)"), still bit-identical;
#   - `ferry mirror` copies the index and the sharded compaction's rank
#     objects (each verified: a flipped byte fails the mirror, no index
#     written), also those a mirror with the same index lacks; an island
#     at 2 on a mirror pulls 6 through them;
#   - a single-rank run is compacted by the single-rank path (no "sharded"
#     in the JSON); (the old-form refusal is test_shard t_compact's: the
#     CLI publishes only the index form);
#   - `ferry gc --keep 2` (retained: 5..7) keeps the compaction 2..6 and its
#     4 objects, drops the compaction 1..3 from the index and deletes its
#     objects; a fresh island still pulls HEAD, exact (an island past a gone
#     chain: test_shard t_compact_gc; `--out` restarts from scratch once the
#     manifest of the version it holds is gone).
# Skips when mpirun or the programs are absent (NO_MPI=1 builds).
set -u
TEST_NAME=shard_compact
source tests/tools/sync_env.sh
PUB=${FERRY_BUILD:-$PWD/build}/ferry-shard-mpi
command -v mpirun >/dev/null 2>&1 || skip_all "no mpirun"
[ -x "$PUB" ] && [ -x "$FERRY" ] || skip_all "no $PUB or $FERRY (NO_MPI=1?)"
[ -f "$DATA/rl-a/step-006.safetensors" ] || skip_all "no rl-a data in $DATA"
source tests/tools/mpi_env.sh
S=$WORK/store
RUN=shard/compact
mkdir -p "$S"
step() { printf '%s/rl-a/step-%03d.safetensors' "$DATA" "$1"; }
files=()
for i in 0 1 2 3 4 5 6; do files+=("$(step $i)"); done
timeout 300 mpirun -np 4 --oversubscribe "${MPIENV[@]}" "$PUB" "$S" --run $RUN --tile-words 256 --anchor-every 4 -q "${files[@]}" \
    >"$WORK/pub.out" 2>&1
check "4 ranks publish rl-a steps 0..6 (versions 1..7)" test $? = 0
jget() { $PY -c "import json,sys; print(json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])[sys.argv[2]])" "$1" "$2"; }
SLICES=(--slice 'model.layers.0.self_attn.q_proj.weight@64:128' --slice 'model.layers.1.mlp.down_proj.weight@:,0:96'
    --slice 'lm_head.weight@:,96:192' --slice model.norm.weight --slice 'model.embed_tokens.weight@1024:1088')
sp() { fy shard-pull "$S" --run $RUN "${SLICES[@]}" "$@"; }
# slices_equal OUT STEP: every 2-D tensor NAME@R0:R1,C0:C1 of OUT is those
# rows and columns of NAME in rl-a's step-STEP (BF16 both), byte for byte
slices_equal() {
    $PY - "$1" "$(step "$2")" <<'EOF'
import json, struct, sys
def load(p):
    f = open(p, "rb"); n = struct.unpack("<Q", f.read(8))[0]; h = json.loads(f.read(n)); h.pop("__metadata__", None)
    return h, f.read()
oh, od = load(sys.argv[1]); sh, sd = load(sys.argv[2])
ok = len(oh) == 5
for k, v in oh.items():
    name, b = k.split("@"); (r0, r1), (c0, c1) = [map(int, x.split(":")) for x in b.split(",")]
    t = sh[name]; cols = 1
    for d in t["shape"][1:]: cols *= d
    a = sd[t["data_offsets"][0]:t["data_offsets"][1]]
    want = b"".join(a[(r * cols + c0) * 2:(r * cols + c1) * 2] for r in range(r0, r1))
    got = od[v["data_offsets"][0]:v["data_offsets"][1]]
    ok = ok and t["dtype"] == v["dtype"] == "BF16" and got == want
sys.exit(0 if ok else 1)
EOF
}
export -f jget slices_equal step
export PY DATA
C=$WORK/chain.safetensors
I=$WORK/island.safetensors

# --- the chain 2..6, before any compaction ----------------------------------------
sp --out "$C" --exact-version 2 -q || bad "pull version 2 (chain island)"
sp --out "$C" --exact-version 6 --json >"$WORK/chain.json" || bad "pull 2..6 by the chain"
check "before compacting: the island at 2 takes the chain 2..6" test "$(jget "$WORK/chain.json" path)" = "chain 2..6"
sp --out "$I" --exact-version 2 -q || bad "pull version 2"
cp "$I" "$WORK/at2.safetensors"; cp "$I.ferry.json" "$WORK/at2.safetensors.ferry.json"
at2() { cp "$WORK/at2.safetensors" "$1"; sed "s#$WORK/at2.safetensors#$1#g" "$WORK/at2.safetensors.ferry.json" >"$1.ferry.json"; }

# --- compaction ---------------------------------------------------------------------
fy compact "$S" --run $RUN --from 2 --to 6 --json >"$WORK/compact.json" 2>"$WORK/compact.err"
check "ferry compact --from 2 --to 6 of the sharded run (exit $?)" test -s "$WORK/compact.json"
cat "$WORK/compact.json"
check "... sharded, 4 rank objects, fewer bytes than the deltas 3..6 and than the anchor" $PY - "$WORK/compact.json" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
print("  measure: compacted 2..6 %d B, deltas 3..6 %d B (%.2f), anchor %d B (%.2f), %d tiles" % (
    d["bytes"], d["chain_bytes"], d["bytes"] / d["chain_bytes"], d["anchor_bytes"], d["bytes"] / d["anchor_bytes"], d["tiles"]))
sys.exit(0 if d["sharded"] and d["world"] == 4 and d["from"] == 2 and d["to"] == 6 and 0 < d["bytes"] < d["chain_bytes"]
         and d["bytes"] < d["anchor_bytes"] and d["key"].endswith("-r000000.patch") else 1)
EOF
id=$(jget "$WORK/compact.json" id)
objs=("$S/$RUN/c/"*"-$id-r"*.patch)
check "... its 4 objects are in RUN/c/, named by the index" bash -c "[ ${#objs[@]} -eq 4 ] && grep -q '\"objects\"' '$S/$RUN/compactions.json'"

fy log "$S" --run $RUN --json >"$WORK/log.json" 2>&1
check "ferry log --json lists it by its 4 rank objects and rank 0's key" $PY - "$WORK/log.json" "${objs[0]#$S/}" <<'EOF'
import json, sys
c = json.load(open(sys.argv[1]))["compactions"]
sys.exit(0 if len(c) == 1 and c[0]["objects"] == 4 and c[0]["sharded"] and c[0]["key"] == sys.argv[2] else 1)
EOF
fy log "$S" --run $RUN >"$WORK/log.txt" 2>&1
check "... and its text names the 4 rank objects" grep -q "2\.\.6: [0-9]* bytes in 4 rank objects .*-$id-r000000\.\.r000003\.patch" "$WORK/log.txt"
grep -A1 "compacted deltas" "$WORK/log.txt"

sp --out "$I" --exact-version 6 --json >"$WORK/comp.json" || bad "pull 2..6 with the compaction"
check "the island at 2 pulls 6 through the compaction" test "$(jget "$WORK/comp.json" path)" = "compacted 2..6"
co=$(jget "$WORK/comp.json" object_bytes); cc=$(jget "$WORK/chain.json" object_bytes)
ba=$(jget "$WORK/comp.json" bytes_fetched); bc=$(jget "$WORK/chain.json" bytes_fetched)
echo "  island 2 -> 6: tile bytes $co (chain $cc), bytes read $ba (chain $bc), GETs $(jget "$WORK/comp.json" requests) (chain $(jget "$WORK/chain.json" requests))"
check "... fewer tile bytes ($co < $cc) and fewer bytes in all ($ba < $bc) than the chain" test "$co" -lt "$cc" -a "$ba" -lt "$bc"
check "... its slices are bit-identical to step-005's" slices_equal "$I" 5
check "... and to the chain's" cmp -s "$I" "$C"
K=$WORK/head.safetensors
at2 "$K"
sp --out "$K" --json >"$WORK/head.json" || bad "pull 2..HEAD"
check "to HEAD: compacted 2..6 + chain 6..7, exact" \
    bash -c "[ \"\$(jget '$WORK/head.json' path)\" = 'compacted 2..6 + chain 6..7' ] && slices_equal '$K' 6"

# --- what does not verify is refused; the chain is taken --------------------------
for o in "${objs[@]}"; do cp "$o" "$o.orig"; done
cp "$S/$RUN/compactions.json" "$WORK/index.orig"
restore() { for o in "${objs[@]}"; do cp "$o.orig" "$o"; done; cp "$WORK/index.orig" "$S/$RUN/compactions.json"; }
refused() { # CASE: an island at 2 pulls 6: the chain, exact
    local f=$WORK/ref-$1.safetensors
    at2 "$f"
    sp --out "$f" --exact-version 6 --json >"$WORK/ref-$1.json" 2>"$WORK/ref-$1.err" || { cat "$WORK/ref-$1.err"; return 1; }
    [ "$(jget "$WORK/ref-$1.json" path)" = "chain 2..6 (compacted 2..6 refused)" ] && slices_equal "$f" 5 && cmp -s "$f" "$C"
}
idx=$($PY -c "import json,sys; print(' '.join(str(o['index']) for o in json.load(open(sys.argv[1]))['compactions'][0]['objects']))" \
    "$S/$RUN/compactions.json")
nth() { cut -d' ' -f$(($2 + 1)) <<<"$1"; }
k=0
for o in "${objs[@]}"; do # objs and the index's objects are both in rank order; every tile's code byte flipped
    $PY - "$o" "$(nth "$idx" $k)" <<'EOF'
import struct, sys
p, ix = sys.argv[1], int(sys.argv[2])
d = bytearray(open(p, "rb").read())
assert d[ix:ix + 8] == b"FSHIDX01"
n = struct.unpack_from("<Q", d, ix + 8)[0]
off = 0
for i in range(n):
    d[off] ^= 0x40
    off += struct.unpack_from("<I", d, ix + 16 + 20 * i)[0]
assert off == ix
open(p, "wb").write(d)
EOF
    k=$((k + 1))
done
check "every tile payload's first byte flipped in every rank object: refused, the chain taken, exact" refused payload
restore
k=0
for o in "${objs[@]}"; do
    $PY -c "import sys; p=sys.argv[1]; o=int(sys.argv[2]); d=bytearray(open(p,'rb').read()); assert d[o:o+8]==b'FSHIDX01'; d[o]^=1; open(p,'wb').write(d)" "$o" "$(nth "$idx" $k)"
    k=$((k + 1))
done
check "a broken tile index in every rank object: refused, the chain taken, exact" refused index
restore
$PY - "$S/$RUN/compactions.json" <<'EOF'
import json, sys
p = sys.argv[1]; d = json.load(open(p))
for o in d["compactions"][0]["objects"]:
    o["root"] = ("0" if o["root"][0] != "0" else "1") + o["root"][1:]
json.dump(d, open(p, "w"))
EOF
check "another root in the compaction index: refused, the chain taken, exact" refused root
restore

# --- a mirror copies the sharded compaction's objects, verified ------------------
fy mirror "$S" "$WORK/mirror" --run $RUN --json >"$WORK/mirror.out" 2>&1
rcm=$?
nm=$(ls "$WORK/mirror/$RUN/c/" 2>/dev/null | grep -c -- "-$id-r.*\.patch$")
check "ferry mirror of the run (exit $rcm; versions 5..7): the index and the compaction's 4 rank objects ($nm), its target 6 held" \
    bash -c "[ $rcm = 0 ] && grep -q '\"objects\"' '$WORK/mirror/$RUN/compactions.json' && [ $nm -eq 4 ] && \
        [ \"\$(jget '$WORK/mirror.out' compactions_copied)\" = 4 ]"
for o in "${objs[@]}"; do cmp -s "$o" "$WORK/mirror/$RUN/c/${o##*/}" || bad "mirrored ${o##*/} differs"; done
# the index already there, its objects not (a pass that copied the index
# before it held the target, or a mirror older than sharded compactions)
rm -f "$WORK/mirror/$RUN/c/"*
fy mirror "$S" "$WORK/mirror" --run $RUN --json >"$WORK/mirror-b.out" 2>&1
nm=$(ls "$WORK/mirror/$RUN/c/" 2>/dev/null | grep -c -- "-$id-r.*\.patch$")
check "a pass with the same index copies the objects it lacks ($nm) and not the index" \
    bash -c "[ $nm -eq 4 ] && [ \"\$(jget '$WORK/mirror-b.out' compactions_copied)\" = 4 ] && [ \"\$(jget '$WORK/mirror-b.out' index_copied)\" = 0 ]"
fy mirror "$S" "$WORK/mirror" --run $RUN --json >"$WORK/mirror-c.out" 2>&1
check "... and the next pass nothing (no object reused: none was looked at twice)" \
    bash -c "[ \"\$(jget '$WORK/mirror-c.out' compactions_copied)\" = 0 ] && [ \"\$(jget '$WORK/mirror-c.out' objects_reused)\" = 0 ]"
# a mirror holding version 2 too (DST seeded with SRC's versions, no
# compaction): an island at 2 on it pulls 6 through the mirrored objects
M2=$WORK/mirror2
mkdir -p "$M2" && cp -r "$S/shard" "$M2/" && rm -rf "$M2/$RUN/c" "$M2/$RUN/compactions.json"
fy mirror "$S" "$M2" --run $RUN --json >"$WORK/mirror2.out" 2>&1
check "ferry mirror into a store already at HEAD copies the compaction (exit $?, 4 objects)" \
    test "$(jget "$WORK/mirror2.out" compactions_copied)" = 4
f=$WORK/onmirror.safetensors
at2 "$f"
fy shard-pull "$M2" --run $RUN "${SLICES[@]}" --out "$f" --exact-version 6 --json >"$WORK/onmirror.json" 2>"$WORK/onmirror.err"
check "an island at 2 on the mirror pulls 6 through the compaction, exact" \
    bash -c "[ \"\$(jget '$WORK/onmirror.json' path)\" = 'compacted 2..6' ] && slices_equal '$f' 5 && cmp -s '$f' '$C'"
# a corrupt rank object in SRC: the mirror refuses it and writes no index
M3=$WORK/mirror3
mkdir -p "$M3" && cp -r "$S/shard" "$M3/" && rm -rf "$M3/$RUN/c" "$M3/$RUN/compactions.json"
$PY -c "import sys; p=sys.argv[1]; d=bytearray(open(p,'rb').read()); d[0]^=0x40; open(p,'wb').write(d)" "${objs[1]}"
fy mirror "$S" "$M3" --run $RUN >"$WORK/mirror3.out" 2>&1
rc3=$?
check "a flipped byte in a rank object: the mirror fails (exit $rc3), no index and no object of it in DST" \
    bash -c "[ $rc3 != 0 ] && [ ! -e '$M3/$RUN/compactions.json' ] && [ ! -e '$M3/$RUN/c/${objs[1]##*/}' ]"
restore

# --- a single-rank run: the single-rank path --------------------------------------
for i in 0 1 2; do fy publish "$S" --run one/run -q "$(step $i)" || bad "ferry publish step $i"; done
fy compact "$S" --run one/run --from 1 --to 3 --json >"$WORK/one.json" 2>&1
check "a single-rank run is compacted by ferry_compact (exit $?, no 'sharded')" \
    bash -c "grep -q '\"chain_bytes\"' '$WORK/one.json' && ! grep -q sharded '$WORK/one.json'"

# --- GC ---------------------------------------------------------------------------
fy compact "$S" --run $RUN --from 1 --to 3 --json >"$WORK/c13.json" || bad "compact 1..3"
id13=$(jget "$WORK/c13.json" id)
fy gc "$S" --run $RUN --keep 2 --grace 0 --json >"$WORK/gc.json" 2>&1
check "gc --keep 2 (exit $?): retained 5..7, one compaction dropped" \
    $PY -c "import json,sys; d=json.load(open(sys.argv[1])); sys.exit(0 if d['oldest_retained']==5 and d['compactions_dropped']==1 else 1)" "$WORK/gc.json"
left=$(ls "$S/$RUN/c/" | grep -c -- "-$id-r.*\.patch$"); gone=$(ls "$S/$RUN/c/" | grep -c -- "-$id13-r" || true)
check "... the compaction 2..6 and its 4 objects kept ($left), 1..3's objects deleted ($gone left)" \
    bash -c "[ $left -eq 4 ] && [ $gone -eq 0 ] && $PY -c \"import json,sys; c=json.load(open(sys.argv[1]))['compactions']; sys.exit(0 if [(x['from'],x['to']) for x in c]==[(2,6)] else 1)\" '$S/$RUN/compactions.json'"
F=$WORK/fresh.safetensors
sp --out "$F" --json >"$WORK/fresh.json" || bad "fresh pull after GC"
check "... a fresh island pulls HEAD from anchor 5, exact" \
    bash -c "[ \"\$(jget '$WORK/fresh.json' path)\" = 'anchor 5 + chain 5..7' ] && slices_equal '$F' 6"
finish
