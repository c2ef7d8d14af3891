#!/usr/bin/env bash
# Runs the bench programs on the data sets and keeps their results under
# bench/results/.  Builds nothing: `make bench` builds first, then calls this.
#   BUILD       build directory (default build)
#   FERRY_DATA  data directory (default ../shared/data)
# Exit status: non-zero if any bench fails (a patch that does not round-trip,
# a missing file, ...); each bench says why on stderr.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
export FERRY_DATA=${FERRY_DATA:-../shared/data}
out=bench/results
mkdir -p "$out"

codec="$BUILD/bench/codec"
if [ ! -x "$codec" ]; then
    echo "bench/run.sh: $codec is not built (make benches)" >&2
    exit 1
fi
# Patch sizes of ferry, the four peer formats, the order-0 bound and the
# generic baselines, for every consecutive checkpoint pair.
echo "== codec: $codec --json $out/codec.json  (FERRY_DATA=$FERRY_DATA)"
"$codec" --json "$out/codec.json" | tee "$out/codec.txt"

# Throughput and memory on a large synthetic run (issue: codec at memory
# speed): adamw_sim writes >= 2 GB BF16 checkpoints whose change statistics
# follow ../shared/data (see examples/adamw_sim.c), cached under
# bench/data/ (ignored by git).  FERRY_BENCH_PARAMS picks the size (default
# 1G params = 2.2 GB BF16 per step); FERRY_BENCH_SKIP_LARGE=1 skips it.
tp="$BUILD/bench/throughput"
if [ "${FERRY_BENCH_SKIP_LARGE:-0}" != 1 ]; then
    params=${FERRY_BENCH_PARAMS:-1G}
    syn="bench/data/synthetic-$params"
    if [ ! -f "$syn/master-003.safetensors" ]; then
        echo "== generating $syn (adamw_sim --params $params --steps 3 --masters; needs ~14 bytes/param of RAM)"
        rm -rf "$syn" && mkdir -p "$syn"
        "$BUILD/examples/adamw_sim" --out "$syn" --params "$params" --steps 3 --masters --quiet
    fi
    echo "== throughput: $tp $syn/step-002 $syn/step-003 --masters $syn/master-003 --json $out/throughput.json"
    "$tp" "$syn/step-002.safetensors" "$syn/step-003.safetensors" --masters "$syn/master-003.safetensors" \
        --json "$out/throughput.json" | tee "$out/throughput.txt"
fi
