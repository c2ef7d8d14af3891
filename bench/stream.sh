#!/usr/bin/env bash
# Time-to-fresh of one delta, buffered against streamed (issue 26 item 3),
# over rate-capped loopback HTTP: the 1 GiB synthetic pair
# (examples/adamw_sim --params 512M --steps 1 --lr 1e-6, cached under
# $SYN), its patch written by `ferry diff`, served by python3's http.server
# on 127.0.0.1, then bench/stream per rate (the store's max_bytes_per_s).
#   BUILD=build bash bench/stream.sh [RATES] [REPS] [THREADS]
set -eu
BUILD=${BUILD:-build}
RATES=${1:-100,1000,0}
REPS=${2:-3}
THREADS=${3:-1}
SYN=${SYN:-bench/data/syn-512M-lr1e-6}
if [ ! -f "$SYN/step-001.safetensors" ]; then
    mkdir -p "$SYN"
    "$BUILD/examples/adamw_sim" --out "$SYN" --params 512M --steps 1 --lr 1e-6 --quiet
fi
DIR=$(mktemp -d)
trap 'kill $SRV 2>/dev/null; rm -rf "$DIR"' EXIT
"$BUILD/ferry" diff "$SYN/step-000.safetensors" "$SYN/step-001.safetensors" -o "$DIR/delta.patch" --threads 2 >/dev/null
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
python3 -m http.server "$PORT" --bind 127.0.0.1 --directory "$DIR" >/dev/null 2>&1 &
SRV=$!
for _ in $(seq 50); do curl -sf -o /dev/null "http://127.0.0.1:$PORT/delta.patch" && break; sleep 0.1; done
"$BUILD/bench/stream" "$SYN/step-000.safetensors" "$SYN/step-001.safetensors" "http://127.0.0.1:$PORT" delta.patch \
    --rates "$RATES" --reps "$REPS" --threads "$THREADS"
