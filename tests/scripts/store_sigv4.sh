#!/usr/bin/env bash
# s3:// backend against tests/tools/s3_strict_server.py, a strict S3 that
# verifies the SigV4 signature of every request (after checking its own
# signer against AWS's published vectors), requires x-amz-content-sha256 to
# match the body, requires the session token, and enforces conditional
# writes.  It proves what s3rver cannot: that what libcurl sends for ferry
# is correctly signed, and that CAS is atomic on a compliant store.  Its
# fault injection drives the retry paths: 503s, downloads cut mid-body
# (resumed with Range + If-Match), PUTs applied whose answer is lost.
set -u
TEST_NAME=store_sigv4
source tests/tools/store_env.sh

[ -x "$STORE_TOOL" ] || { echo "missing $STORE_TOOL (make tests)"; echo "0 passed, 1 failed"; exit 1; }
store_built || skip_all "store layer not built (NO_NET=1)"
KEY=AKIAFERRYTEST
SECRET='wJalr/K7MDENG+bPxRfi=ferry'
TOKEN='IQoJb3JpZ2luX2VjEFERRY/session+token=='
start_strict "$KEY" "$SECRET" --token "$TOKEN" --region eu-west-3
ok "server self-test against AWS's SigV4 vectors"
stats() { curl -s "$EP/__stats"; }
stat_of() { stats | $PY -c "import json,sys; print(json.load(sys.stdin)['$1'])"; }
ctl() { curl -s "$EP/__ctl?$1" >/dev/null; }

unset AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY AWS_SESSION_TOKEN AWS_ENDPOINT_URL AWS_ENDPOINT_URL_S3 AWS_DEFAULT_REGION
export AWS_REGION=eu-west-3
S="tool --endpoint $EP --access-key $KEY --secret-key $SECRET --session-token $TOKEN --retry-base-ms 20 --deadline-ms 20000"

# --- every request of the scenario is signed right ---------------------------
$S --part-size 65536 --list-page 2 s3://bkt selftest scenario >"$WORK/selftest.log" 2>&1
rc=$?
grep -E 'FAIL|CHECK|returned' "$WORK/selftest.log" | head -20 | sed 's/^/    /'
check "scenario: every request verified (puts, multipart, ranges, pages, cas)" [ $rc -eq 0 ]
check "no request was refused" [ "$(stat_of auth_failures)" = 0 ]
check "every payload hash matched its body" [ "$(stat_of sha_mismatch)" = 0 ]

# credentials and the endpoint from the environment
echo "from env" >"$WORK/env.txt"
check "credentials, token and endpoint from AWS_* variables" env AWS_ACCESS_KEY_ID="$KEY" \
    AWS_SECRET_ACCESS_KEY="$SECRET" AWS_SESSION_TOKEN="$TOKEN" AWS_ENDPOINT_URL="$EP" \
    timeout 60 "$STORE_TOOL" s3://bkt put env/x "$WORK/env.txt" >/dev/null
check "UNSIGNED-PAYLOAD is accepted" $S --unsigned-payload s3://bkt put env/unsigned "$WORK/env.txt" >/dev/null

# --- wrong credentials fail with FERRY_ERR_STORE_AUTH (64), quickly ---------
A="tool --endpoint $EP --deadline-ms 5000"
check_rc "wrong secret: auth error" 64 $A --access-key "$KEY" --secret-key wrong --session-token "$TOKEN" s3://bkt get env/x -
check_rc "wrong access key: auth error" 64 $A --access-key AKIAOTHER --secret-key "$SECRET" --session-token "$TOKEN" s3://bkt put env/y "$WORK/env.txt"
check_rc "missing session token: auth error" 64 $A --access-key "$KEY" --secret-key "$SECRET" s3://bkt get env/x -
check_rc "anonymous: auth error" 64 $A --anonymous s3://bkt get env/x -
check_rc "wrong region: refused" 66 $A --region us-east-1 --access-key "$KEY" --secret-key "$SECRET" --session-token "$TOKEN" s3://bkt get env/x -
$A --access-key "$KEY" --secret-key wrong --session-token "$TOKEN" s3://bkt get env/x - 2>"$WORK/auth.err"
check "the message names the server's code" grep -q 'HTTP 403 SignatureDoesNotMatch' "$WORK/auth.err"

# --- conditional writes are enforced: CAS is atomic ---------------------------
check "probe reports the store as atomic" bash -c "[ \"\$($S s3://bkt probe probe/cas)\" = atomic ]"
before=$(stat_of precondition_failed)
ipids=()
for i in 1 2 3 4; do $S s3://bkt incr race/counter 15 >"$WORK/incr$i" 2>&1 & ipids+=($!); done
wait "${ipids[@]}"
check "4 racing writers x 15 increments: no update lost" bash -c "[ \"\$($S s3://bkt get race/counter -)\" = 60 ]"
echo "    conflicts seen by the writers: $(cat "$WORK"/incr? | awk '{s += $2} END {print s}'), refused by the server's If-Match: $(( $(stat_of precondition_failed) - before ))"

# --- retries --------------------------------------------------------------------
head -c 3000000 /dev/urandom >"$WORK/big"
$S s3://bkt put f/big "$WORK/big" >/dev/null
ctl fail=3
$S s3://bkt get f/big "$WORK/b1"
check "three 503s, then the GET succeeds" cmp -s "$WORK/big" "$WORK/b1"
ctl cut=2
$S s3://bkt get f/big "$WORK/b2"
check "download cut twice mid-body: resumed, whole" cmp -s "$WORK/big" "$WORK/b2"
ctl cut=1
$S s3://bkt getfile f/big "$WORK/b3"
check "get_file cut mid-body: resumed, whole" cmp -s "$WORK/big" "$WORK/b3"
ctl cut=1
$S s3://bkt range f/big 1000 200000 >"$WORK/r1"
check "ranged read cut mid-body: resumed" cmp -s <(tail -c +1001 "$WORK/big" | head -c 200000) "$WORK/r1"
check "the cut downloads continued (Range + If-Match), not restarted" [ "$(stat_of resumed_gets)" -ge 4 ]
e=$($S s3://bkt head f/big | cut -d' ' -f2)
echo "new pointer" >"$WORK/ptr"
ctl lose=1
check "cas whose answer is lost: recognised as ours" bash -c "$S s3://bkt cas f/big '$e' '$WORK/ptr' >/dev/null"
check "and the object is the new one" bash -c "$S s3://bkt get f/big - | grep -q 'new pointer'"
ctl lose=1
check "put whose answer is lost: retried" bash -c "$S s3://bkt put f/lost '$WORK/ptr' >/dev/null"
ctl fail=1000
check_rc "503 past max_attempts: HTTP error" 66 $S --max-attempts 3 s3://bkt get f/lost -
check_rc "503 past the deadline: timeout" 65 tool --endpoint "$EP" --access-key "$KEY" --secret-key "$SECRET" \
    --session-token "$TOKEN" --deadline-ms 1000 s3://bkt get f/lost -
ctl fail=0
check "faults were injected" [ "$(stat_of faults)" -ge 8 ]

finish
