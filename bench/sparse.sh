#!/usr/bin/env bash
# Density sweep (issue 14): ferry against the seven peers and the order-0
# bound from 0.02% to ~25% of words changed per step, on runs made here:
#   - synthetic: build/examples/adamw_sim (8M params, AdamW on FP32 masters,
#     BF16 steps) at learning rates 3e-9 .. 1e-5, plus a tied-embedding run
#     with a 32k vocabulary; fast (seconds);
#   - torch: ../shared/data/make_snapshots.py (a real transformer trained
#     with RL-like updates) at learning rates 1e-8 .. 5e-8, one with an 8192
#     vocabulary and one with tied embeddings; slow (minutes each), cached.
# Everything is generated under bench/data/ (ignored by git) once, then
# build/bench/codec runs on each set and writes bench/results/sparse-*.json
# and sparse.txt.  Every patch of every format is decoded back to NEW.
#   BUILD       build directory (default build)
#   FERRY_DATA  where make_snapshots.py is (default ../shared/data)
#   SPARSE_SKIP_TORCH=1   synthetic runs only (no torch needed)
#   REPS        timing repetitions (default 3)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
DATA=${FERRY_DATA:-../shared/data}
REPS=${REPS:-3}
syn=bench/data/syn torch=bench/data/sparse res=bench/results
mkdir -p "$syn" "$torch" "$res"
for c in "lr3e-9 --lr 3e-9" "lr3e-8 --lr 3e-8" "lr3e-7 --lr 3e-7" "lr3e-6 --lr 3e-6" "lr1e-5 --lr 1e-5" \
         "tied32k3e-8 --lr 3e-8 --tied --vocab 32768"; do
    set -- $c; name=$1; shift
    [ -f "$syn/$name/step-002.safetensors" ] ||
        "$BUILD/examples/adamw_sim" --out "$syn/$name" --params 8M --steps 2 --seed 5 --quiet "$@" >/dev/null
done
sets=("$syn")
if [ "${SPARSE_SKIP_TORCH:-0}" != 1 ]; then
    for c in "t-lr5e-8 --dim 256 --layers 2 --lr 5e-8 --steps 2 --seed 21" \
             "s1e-8 --dim 256 --layers 2 --vocab 8192 --lr 1e-8 --steps 2 --seed 31" \
             "s2e-8t --dim 192 --layers 2 --tied --lr 2e-8 --steps 2 --seed 32"; do
        set -- $c; name=$1; shift
        [ -f "$torch/$name/step-002.safetensors" ] ||
            /usr/bin/python3 "$DATA/make_snapshots.py" "$torch/$name" "$@" >/dev/null
    done
    sets+=("$torch")
fi
: > "$res/sparse.txt"
for d in "${sets[@]}"; do
    echo "== $BUILD/bench/codec --reps $REPS --no-generic --data $d --json $res/sparse-$(basename "$d").json" | tee -a "$res/sparse.txt"
    "$BUILD/bench/codec" --reps "$REPS" --no-generic --data "$d" --json "$res/sparse-$(basename "$d").json" | tee -a "$res/sparse.txt"
done
