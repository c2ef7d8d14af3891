#!/usr/bin/env bash
# bench/wan_dock.sh — trajectories across the WAN: islands put batches, the
# trainer takes them (include/ferry_dock.h), measured with bench/wan_dock.c.
#
# Rows:
#   file   all on this machine, a file:// store (no link: the baseline)
#   s3     the strict S3 test server in the trainer's DC ("t"), islands in
#          two DCs behind tbf links of A_MBIT and B_MBIT (tests/tools/
#          wan_env.sh) reaching it through bench/wan_proxy.py, which adds
#          DELAY_MS of one-way delay each way (no netem on this kernel)
# N islands per DC each put COUNT batches of BYTES, one every INTERVAL_MS;
# the trainer takes 2N batches per step.  Printed per row: batches/s,
# put -> admit latency p50/p99, the trainer's wait per step, and the dock's
# listings / gets / cursor writes per admitted batch.
#
# Usage: bash bench/wan_dock.sh [--islands N] [--count C] [--bytes B]
#                               [--interval MS] [--delay MS] [--out DIR]
set -u
N=2 COUNT=40 BYTES=65536 INTERVAL=50 DELAY=20 A_MBIT=200 B_MBIT=50 OUT=bench/results
while [ $# -gt 0 ]; do
    case $1 in
    --islands) N=$2; shift ;;
    --count) COUNT=$2; shift ;;
    --bytes) BYTES=$2; shift ;;
    --interval) INTERVAL=$2; shift ;;
    --delay) DELAY=$2; shift ;;
    --out) OUT=$2; shift ;;
    *) echo "usage: bash bench/wan_dock.sh [--islands N] [--count C] [--bytes B] [--interval MS] [--delay MS] [--out DIR]" >&2; exit 2 ;;
    esac
    shift
done
source tests/tools/sync_env.sh
source tests/tools/wan_env.sh
trap 'cleanup; wan_down' EXIT
DOCK=${FERRY_BUILD:-$PWD/build}/bench/wan_dock
wan_bench_init bench/wan_dock.sh "$DOCK" || exit 1
mkdir -p "$OUT"
TOTAL=$((2 * N * COUNT))
TMAX=$((COUNT * INTERVAL / 1000 + 120))
res=$WORK/results.txt
: >"$res"

# file://: every process on this machine
pids=()
for k in $(seq 0 $((2 * N - 1))); do
    timeout $TMAX "$DOCK" put "$WORK/fstore" file "$k" "$COUNT" "$BYTES" "$INTERVAL" >/dev/null &
    pids+=($!)
done
line=$(timeout $TMAX "$DOCK" take "$WORK/fstore" file "$TOTAL" $((2 * N)) $TMAX)
for p in "${pids[@]}"; do wait "$p"; done
echo "file $line" >>"$res"

# s3:// across the links
wan_dcs "$A_MBIT" "$B_MBIT" || exit 1
export AWS_ACCESS_KEY_ID=WANBENCH AWS_SECRET_ACCESS_KEY=wanbenchsecret AWS_REGION=us-east-1
export AWS_CONFIG_FILE=$WORK/none AWS_SHARED_CREDENTIALS_FILE=$WORK/none AWS_EC2_METADATA_DISABLED=true
ip netns exec "${WAN_TAG}t" $PY tests/tools/s3_strict_server.py --bucket bkt --access-key WANBENCH --secret-key wanbenchsecret \
    --port 0 >"$WORK/s3.log" 2>&1 &
PIDS+=($!)
wait_for "$WORK/s3.log" "listening" 100 || exit 1
P=$(sed -nE 's/.*listening ([0-9]+).*/\1/p' "$WORK/s3.log" | head -1)
wan_proxy t 9000 "$P" "$DELAY" proxy || exit 1
pids=()
for dc in a b; do
    ep=http://10.77.1.1:9000; [ $dc = b ] && ep=http://10.77.2.1:9000
    for k in $(seq 0 $((N - 1))); do
        id=$k; [ $dc = b ] && id=$((N + k))
        AWS_ENDPOINT_URL=$ep ip netns exec "${WAN_TAG}$dc" timeout $TMAX "$DOCK" put s3://bkt/d s3 "$id" "$COUNT" "$BYTES" "$INTERVAL" \
            >/dev/null &
        pids+=($!)
    done
done
line=$(AWS_ENDPOINT_URL=http://127.0.0.1:$P ip netns exec "${WAN_TAG}t" timeout $TMAX "$DOCK" take s3://bkt/d s3 "$TOTAL" $((2 * N)) $TMAX)
for p in "${pids[@]}"; do wait "$p"; done
echo "s3 $line" >>"$res"

{
    echo "bench/wan_dock.sh: $N islands per DC x $COUNT batches of $BYTES bytes every $INTERVAL ms; links $A_MBIT / $B_MBIT Mbit/s (tbf) + $DELAY ms one-way (proxy) for s3://"
    cat "$res"
} | tee "$OUT/wan_dock.txt"
