#!/usr/bin/env bash
# bench/transfer.sh — what parallel transfers buy under a per-stream cap.
#
# One object of SIZE_MIB (default 128) through the s3:// backend against
# tests/tools/s3_strict_server.py on 127.0.0.1 (every request SigV4-checked,
# every payload hashed), each stream capped at RATE bytes/s (default
# 16000000, ferry's max_bytes_per_s, as --rate does): the cap stands for
# what one TCP stream gets over a long link.  Upload: a multipart upload in
# 8 MiB parts, upload_concurrency 1 then 4.  Download:
# ferry_store_get_file_parallel in 8 MiB chunks, concurrency 1 then 4
# (resume on, as ferry pull uses it).  Every result is compared byte for
# byte.  Prints a Markdown table.  Needs `make tests` (build/tools/store_tool).
#
#   bench/transfer.sh [SIZE_MIB] [RATE]
set -u
SIZE_MIB=${1:-128}
RATE=${2:-16000000}
TEST_NAME=bench_transfer
source tests/tools/store_env.sh
[ -x "$STORE_TOOL" ] || { echo "missing $STORE_TOOL (make tests)"; exit 1; }
start_strict AKIABENCH bench-secret
S="timeout 600 $STORE_TOOL --endpoint $EP --access-key AKIABENCH --secret-key bench-secret --rate $RATE --part-size 8388608"
head -c $((SIZE_MIB << 20)) /dev/urandom >"$WORK/obj"

now() { date +%s.%N; }
secs() { $PY -c "print('%.2f' % ($2 - $1))"; }
declare -A T
for c in 1 4; do
    t0=$(now); $S --upload-conc $c s3://bkt put obj$c "$WORK/obj" >/dev/null || exit 1; t1=$(now)
    T[up$c]=$(secs "$t0" "$t1")
    t0=$(now); $S --conc $c --chunk 8388608 --resume s3://bkt pgetfile obj$c "$WORK/back$c" || exit 1; t1=$(now)
    T[down$c]=$(secs "$t0" "$t1")
    cmp -s "$WORK/obj" "$WORK/back$c" || { echo "concurrency $c: the object did not round-trip"; exit 1; }
done
mbps() { $PY -c "print('%.1f' % ($SIZE_MIB * 1.048576 / $1))"; }
echo "$SIZE_MIB MiB object, each stream capped at $RATE B/s, s3:// (strict server, loopback)"
echo
echo "| transfer | concurrency 1 | concurrency 4 | speed-up |"
echo "|---|---|---|---|"
for d in up down; do
    name=$([ $d = up ] && echo "upload (multipart, 8 MiB parts)" || echo "download (ranged GETs, 8 MiB chunks)")
    echo "| $name | ${T[${d}1]} s ($(mbps ${T[${d}1]}) MB/s) | ${T[${d}4]} s ($(mbps ${T[${d}4]}) MB/s) | $($PY -c "print('%.2fx' % (${T[${d}1]} / ${T[${d}4]}))") |"
done
