#!/usr/bin/env bash
# Streamed deltas over s3:// against s3rver 3.7.1 (tests/npm) on 127.0.0.1
# (issue 26 item 3): tests/unit/test_stream_sync with FERRY_TEST_S3 set runs
# ferry_store_get_stream on the bucket and a memory-mode subscriber whose
# delta steps are streamed into its model: the rl-a versions bit for bit; a
# corrupt, truncated or other-version delta in a mirror refused (unsigned
# and signed runs) with the model put back exactly, and the one bad object
# taken from the origin as second store.  Then the CLI pulls the same run
# (file mode: the buffered path) to the same bits.
set -u
TEST_NAME=stream_s3
source tests/tools/sync_env.sh

s3_rla_start
BIN=${FERRY_BUILD:-$PWD/build}/tests/test_stream_sync
[ -x "$BIN" ] || { echo "missing $BIN (make tests)"; echo "0 passed, 1 failed"; exit 1; }

FERRY_TEST_S3=s3://bkt/stream timeout 600 "$BIN" >"$WORK/unit.log" 2>&1
rc=$?
sed 's/^/    /' "$WORK/unit.log" | tail -40
check "test_stream_sync against s3rver (get_stream, streamed subscriber, corrupt/truncated/forged deltas, fallback)" \
    bash -c "[ $rc -eq 0 ] && grep -q '^3 passed, 0 failed, 1 skipped' '$WORK/unit.log'"

# a streamed GET cut in the middle by the strict server: resumed after the
# bytes handed on (object unchanged), or refused (object replaced meanwhile)
start_strict S3RVER S3RVER
for fault in cut cut_shrink cut_replace; do
    if [ $fault = cut_replace ]; then strict_ctl "reset=1&cut=1&no_get_if_match=1"; else strict_ctl "reset=1&no_get_if_match=0&$fault=1"; fi
    AWS_ENDPOINT_URL=$EP FERRY_TEST_S3=s3://bkt/resume FERRY_TEST_FAULT=$fault timeout 120 "$BIN" --case test_get_stream_fault \
        >"$WORK/fault-$fault.log" 2>&1
    rc=$?
    cut=$(strict_stat faults)
    sed 's/^/    /' "$WORK/fault-$fault.log" | grep -v '^    ok' | head -5
    check "streamed GET, $fault in the middle ($cut cut, $(strict_stat resumed_gets) resumed): $([ $fault = cut ] && echo 'resumed, every byte once' || echo 'refused (STORE_NET), no bytes of two objects')" \
        bash -c "[ $rc -eq 0 ] && [ '$cut' -ge 1 ] && grep -q '^1 passed, 0 failed' '$WORK/fault-$fault.log'"
done

# the buffered path on the same objects: a file-mode pull of the origin's
# unsigned run (s3rver keeps each key as a directory under its data dir)
run=$(grep -m1 -o 'run[0-9]*/v/' "$WORK/unit.log" | cut -d/ -f1)
P=$WORK/p.safetensors
if [ -n "$run" ]; then
    fy pull s3://bkt/stream/origin --run "$run" --to "$P" -q --deadline 20
    check "file-mode pull of the same run (buffered): the last rl-a step" same_tensors "$DATA/rl-a/step-005.safetensors" "$P"
else
    bad "no run named in the test's log"
fi
finish
