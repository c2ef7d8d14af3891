#!/usr/bin/env bash
# Trajectory dock against s3rver 3.7.1 (tests/npm): the store cases of
# tests/unit/test_dock.c (round trip, blocking take, sequential and async
# policies, future batches, duplicates across restarts, every rejection
# code, grace period, other runs, resume_seq, regress, budget, gaps, forked
# islands accounted exactly once; issue 23: the signed cursor deleted, put
# back older and forged, junk that resume_seq and stale names must not
# believe, planted objects read once and within their island's share) on
# s3://bkt/dock, with 7-key listing pages;
# then what the store holds afterwards, checked from outside with
# store_tool.  The server is started here on a free 127.0.0.1 port and
# stopped on exit.
set -u
TEST_NAME=dock_s3
source tests/tools/store_env.sh

DOCK_TEST=${FERRY_BUILD:-$PWD/build}/tests/test_dock
command -v node >/dev/null || skip_all "node is not installed"
[ -f "$S3RVER_JS" ] || skip_all "s3rver is not installed (scripts/install-deps.sh runs npm install in tests/npm)"
[ -x "$DOCK_TEST" ] && [ -x "$STORE_TOOL" ] || { echo "missing $DOCK_TEST or $STORE_TOOL (make tests)"; echo "0 passed, 1 failed"; exit 1; }
store_built || skip_all "store layer not built (NO_NET=1)"

PORT=$(free_port)
EP=http://127.0.0.1:$PORT
mkdir -p "$WORK/data"
start_s3rver "$WORK/data" "$PORT" "$WORK/s3rver.log" || { echo "0 passed, 1 failed"; exit 1; }
export AWS_ACCESS_KEY_ID=S3RVER AWS_SECRET_ACCESS_KEY=S3RVER AWS_REGION=us-east-1 AWS_DEFAULT_REGION=us-east-1
export AWS_ENDPOINT_URL_S3=$EP
unset AWS_SESSION_TOKEN AWS_ENDPOINT_URL AWS_PROFILE
S="tool --endpoint $EP --retry-base-ms 50 --deadline-ms 20000"

# s3rver crashes on a DELETE/PUT race that the dock's traffic hits: a
# watchdog restarts it (tests/tools/store_env.sh); the clients' retries
# (deadline 20 s) carry their requests over the gap.
start_s3rver_watchdog "$WORK/data" "$PORT" "$WORK/s3rver.log"

# --- the unit cases on s3:// ------------------------------------------------
timeout 300 "$DOCK_TEST" s3://bkt/dock >"$WORK/dock.log" 2>&1
rc=$?
restarts=$(cat "$WORK/restarts" 2>/dev/null || echo 0)
echo "    s3rver restarts by the watchdog: $restarts"
[ -s "$WORK/crashes" ] && sed 's/^/      crash: /' "$WORK/crashes"
sed 's/^/    /' "$WORK/dock.log" | grep -vE '^    ok ' | head -60
while read -r line; do
    case $line in
        "ok   "*) ok "s3: ${line#ok   }" ;;
        "FAIL "*) bad "s3: ${line#FAIL }" ;;
    esac
done <"$WORK/dock.log"
check "test_dock on s3:// finished (exit $rc)" [ $rc -eq 0 ]
check "it ran every store case" grep -q '^ok   test_concurrent_islands' "$WORK/dock.log"

# --- seen from outside -------------------------------------------------------
# Every run the cases made left a cursor and no batch; quarantined copies
# are where docs/DOCK.md says.
$S s3://bkt/dock ls >"$WORK/ls.txt" 2>"$WORK/ls.err"
check "the dock prefix lists" [ $? -eq 0 ]
# (test_other_run leaves run B's batches alone, on purpose)
check "no batch left under traj/, but the other run's" bash -c "! grep -v '^runb-' '$WORK/ls.txt' | grep -q '/traj/'"
check "cursors under RUN/dock/cursor" grep -qE '^islands-[0-9]+-[0-9]+/dock/cursor ' "$WORK/ls.txt"
check "quarantined copies under RUN/quarantine/REASON/" \
    grep -qE '^corrupt-[0-9]+-[0-9]+/quarantine/checksum/v00000000000000000004/i0000000002-s[0-9]{20} ' "$WORK/ls.txt"
check "a future batch quarantined, not deleted" grep -qE '^future-[0-9]+-[0-9]+/quarantine/future/' "$WORK/ls.txt"

stop_s3rver_watchdog
finish
