#!/usr/bin/env bash
# Checks ferry on checkpoint sequences it was not developed on: makes new
# RL fine-tune runs with ../shared/data/make_snapshots.py (other sizes,
# tied embeddings, learning rates from 5e-7 to 1e-5) under bench/data/unseen/
# and runs bench/codec on them: every patch must apply bit-exactly (codec
# verifies each against NEW's hash) and the ratios are printed against the
# peers and the order-0 bound.  Needs /usr/bin/python3 with torch.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
DATA=${FERRY_DATA:-../shared/data}
out=bench/data/unseen
mkdir -p "$out" bench/results
configs=(
    "lr5e-7   --dim 320 --layers 3 --lr 5e-7 --steps 3 --seed 11"
    "tied1e-5 --dim 192 --layers 2 --tied --lr 1e-5 --steps 3 --seed 12"
    "wide2e-6 --dim 256 --vocab 4096 --lr 2e-6 --steps 3 --seed 13"
)
for c in "${configs[@]}"; do
    set -- $c
    name=$1; shift
    if [ ! -f "$out/$name/step-003.safetensors" ]; then
        echo "== make_snapshots.py $out/$name $*"
        /usr/bin/python3 "$DATA/make_snapshots.py" "$out/$name" "$@" >/dev/null
    fi
done
echo "== $BUILD/bench/codec --data $out --json bench/results/unseen.json"
"$BUILD/bench/codec" --data "$out" --json bench/results/unseen.json | tee bench/results/unseen.txt
