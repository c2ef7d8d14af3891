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
