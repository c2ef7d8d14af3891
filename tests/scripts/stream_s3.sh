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
    bash -c "[ $rc -eq 0 ] && grep -q '^3 passed, 0 failed, 2 skipped' '$WORK/unit.log'"

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

# a plain HTTP server that cuts the first GET of /obj in the middle, then
# answers the resumed request (Range + If-Match) in one of these ways:
#   ignore_range  200 with the whole body (Range ignored): bytes handed on
#                 cannot be taken back -> STORE_NET
#   wrong_start   206 from another byte than asked for -> STORE_CORRUPT
#   short206      206 "bytes N-M/T" with M + 1 < T, then the connection
#                 ends: fewer bytes than the object -> STORE_CORRUPT, never OK
#   other_etag    206 of another ETag (If-Match ignored, object replaced)
#                 -> STORE_NET, no byte of the second object handed on
#   honest        206 of the same object: resumed, every byte once -> OK
HTTP_PY=$WORK/fault_http.py
cat >"$HTTP_PY" <<'PY'
import http.server, os, random, sys
rnd = random.Random(7)
BODY = bytes(rnd.getrandbits(8) for _ in range(2000003))
OTHER = bytes(b ^ 0xFF for b in BODY)
MODE = sys.argv[1]
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a): pass
    def do_GET(self):
        rng = self.headers.get("Range")
        if not rng:
            self.send_response(200)
            self.send_header("ETag", '"e1"')
            self.send_header("Content-Length", str(len(BODY)))
            self.end_headers()
            self.wfile.write(BODY[:len(BODY) // 2])
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(2)
            return
        start = int(rng.split("=")[1].split("-")[0])
        body, etag, status, cr = BODY[start:], "e1", 206, None
        if MODE == "ignore_range":
            body, status = BODY, 200
        elif MODE == "wrong_start":
            body, cr = BODY[start + 1:], "bytes %d-%d/%d" % (start + 1, len(BODY) - 1, len(BODY))
        elif MODE == "short206":
            body, cr = BODY[start:start + 10], "bytes %d-%d/%d" % (start, start + 9, len(BODY))
        elif MODE == "other_etag":
            body, etag = OTHER[start:], "e2"
        self.send_response(status)
        self.send_header("ETag", '"%s"' % etag)
        if status == 206:
            self.send_header("Content-Range", cr or "bytes %d-%d/%d" % (start, len(BODY) - 1, len(BODY)))
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
print("listening", srv.server_address[1], flush=True)
srv.serve_forever()
PY
for mode in honest ignore_range wrong_start short206 other_etag; do
    $PY "$HTTP_PY" $mode >"$WORK/http-$mode.out" 2>&1 &
    hpid=$!
    PIDS+=($hpid)
    if wait_for "$WORK/http-$mode.out" '^listening [0-9]+' 100; then
        hport=$(awk '/^listening/ {print $2}' "$WORK/http-$mode.out")
        FERRY_TEST_HTTP=http://127.0.0.1:$hport FERRY_TEST_HTTP_MODE=$mode timeout 120 "$BIN" --case test_get_stream_http_fault \
            >"$WORK/http-$mode.log" 2>&1
        rc=$?
        sed 's/^/    /' "$WORK/http-$mode.log" | grep -v '^    ok' | head -5
        check "streamed GET over http://, resumed answer '$mode'" \
            bash -c "[ $rc -eq 0 ] && grep -q '^1 passed, 0 failed' '$WORK/http-$mode.log'"
    else
        bad "fault HTTP server ($mode) did not start"
    fi
    kill $hpid 2>/dev/null
    wait $hpid 2>/dev/null
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
