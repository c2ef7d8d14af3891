#!/usr/bin/env bash
# Sharded FP8 runs (issue 25): `mpirun -np 2 ferry-shard-mpi --quantize
# fp8-block128` publishes rl-a steps 0..3 (anchors 1 and 4), each rank
# quantizing its own rows (cut on the 128-row grid); `ferry shard-pull` of
# every tensor of the FP8 model (codes, NAME_scale_inv, the BF16 tensors
# left alone) at every version is byte for byte `ferry quantize` of the
# step.  The sticky scheme is refused for sharded runs, and ranks without
# --quantize cannot continue the FP8 run (HEAD unchanged).
set -u
TEST_NAME=fp8_shard_mpi
source tests/tools/sync_env.sh
PUB=${FERRY_BUILD:-$PWD/build}/ferry-shard-mpi
command -v mpirun >/dev/null 2>&1 || skip_all "no mpirun"
[ -x "$PUB" ] || skip_all "no $PUB (NO_MPI=1?)"
sync_built || skip_all "sync layer or tools not built (NO_NET=1?)"
[ -f "$DATA/rl-a/step-004.safetensors" ] || skip_all "no rl-a data in $DATA"
source tests/tools/mpi_env.sh
S=$WORK/store
step() { printf '%s/rl-a/step-%03d.safetensors' "$DATA" "$1"; }
pub() { timeout 300 mpirun -np 2 --oversubscribe "${MPIENV[@]}" "$PUB" "$S" --run r "$@"; }
head_version() { sed -nE 's/^ *"version": *([0-9]+).*/\1/p' "$S/r/HEAD"; }

for i in 0 1 2 3 4; do
    fy quantize "$(step $i)" "$WORK/q$i.safetensors" >/dev/null || bad "ferry quantize step $i"
done
# every tensor of the FP8 model, whole: NAME@0:ROWS,0:COLS as shard-pull names it
slices=$($PY - "$WORK/q0.safetensors" <<'EOF'
import json, struct, sys
with open(sys.argv[1], "rb") as f:
    h = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
h.pop("__metadata__", None)
print(" ".join("--slice %s" % n for n in sorted(h)))
EOF
)
# same SLICES Q: each slice of OUT holds its tensor of Q, byte for byte
same() {
    $PY - "$1" "$2" <<'EOF'
import json, struct, sys
def read(p):
    with open(p, "rb") as f:
        d = f.read()
    n = struct.unpack("<Q", d[:8])[0]
    h = json.loads(d[8:8 + n]); h.pop("__metadata__", None)
    return {k: (v["dtype"], d[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]]) for k, v in h.items()}
got, want = read(sys.argv[1]), read(sys.argv[2])
base = {k.split("@")[0]: v for k, v in got.items()}
bad = [k for k in want if base.get(k) != want[k]]
sys.exit(1 if bad or len(base) != len(want) else 0)
EOF
}

err=$(pub --quantize fp8-block128-sticky "$(step 0)" 2>&1)
check "the sticky scheme is refused for a sharded run" grep -q "fresh scales" <<<"$err"
check "... nothing published" test ! -e "$S/r/HEAD"
pub --quantize fp8-block128 --anchor-every 3 "$(step 0)" "$(step 1)" "$(step 2)" "$(step 3)" >/dev/null ||
    bad "mpirun -np 2 ferry-shard-mpi --quantize fp8-block128"
check "four FP8 versions published" test "$(head_version)" = 4
for v in 1 2 3 4; do
    # shellcheck disable=SC2086
    fy shard-pull "$S" --run r $slices --exact-version $v --out "$WORK/p$v.safetensors" -q || bad "shard-pull version $v"
    check "version $v: every tensor pulled is ferry quantize of step $((v - 1)), byte for byte" \
        same "$WORK/p$v.safetensors" "$WORK/q$((v - 1)).safetensors"
done
# shellcheck disable=SC2086
fy shard-pull "$S" --run r $slices --out "$WORK/follow.safetensors" -q --exact-version 2 &&
    fy shard-pull "$S" --run r $slices --out "$WORK/follow.safetensors" -q ||
    bad "shard-pull 2 then the latest"
check "a second pull into the same file (version 4)" same "$WORK/follow.safetensors" "$WORK/q3.safetensors"
pub "$(step 4)" >/dev/null 2>&1
check "ranks without --quantize cannot continue the FP8 run: HEAD stays at 4" test "$(head_version)" = 4
finish
