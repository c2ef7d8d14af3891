#!/usr/bin/env bash
# Racing publishers on s3:// against tests/tools/s3_strict_server.py, an S3
# that verifies SigV4 on every request and enforces conditional writes as
# AWS documents them (412 / 409, checked and applied atomically; its own
# test is tests/python/test_s3_conditional.py).  s3rver ignores If-Match and
# If-None-Match, so there compare-and-swap is only narrowed; here it must
# be exact:
#   - 3 rounds of 4 publishers, each on its own connection, opened on the
#     same HEAD and released together by a barrier (sync_tool race): in
#     every round exactly one wins and every other gets the conflict;
#   - the run is one lineage: HEAD at 3, each version based on the one
#     before (ferry log), every version signed by the trainer's key;
#   - a reader trusting that key pulls the last round's winner, bit for
#     bit; a reader trusting another key refuses the run (exit 7).
set -u
TEST_NAME=sync_s3_race
source tests/tools/sync_env.sh

sync_built || skip_all "sync layer or tools not built (NO_NET=1?)"
KEY=AKIARACE
SECRET='race/secret+key'
start_strict "$KEY" "$SECRET"
export AWS_ACCESS_KEY_ID=$KEY AWS_SECRET_ACCESS_KEY=$SECRET AWS_REGION=us-east-1 AWS_ENDPOINT_URL=http://127.0.0.1:$PORT
export AWS_CONFIG_FILE=$WORK/none AWS_SHARED_CREDENTIALS_FILE=$WORK/none AWS_EC2_METADATA_DISABLED=true
unset AWS_SESSION_TOKEN AWS_ENDPOINT_URL_S3 AWS_PROFILE
U=s3://bkt/race
json() { $PY -c "import json,sys; d=json.load(sys.stdin); sys.exit(0 if ($1) else 1)"; }

st gen "$WORK/m" 4 20000 11 >/dev/null
fy keygen -o "$WORK/trainer" >/dev/null
fy keygen -o "$WORK/other" >/dev/null
check "4 checkpoints and two key pairs" [ -f "$WORK/m/m-003.safetensors" -a -f "$WORK/trainer.key" -a -f "$WORK/other.pub" ]

st race $U run 3 "$WORK/trainer.key" "$WORK"/m/m-00{0,1,2,3}.safetensors >"$WORK/winners" 2>"$WORK/race.err"
rc=$?
sed 's/^/    /' "$WORK/race.err" | head -20
check "3 rounds of 4 racing publishers: one winner each, every other a conflict" \
    [ $rc -eq 0 -a "$(wc -l <"$WORK/winners")" -eq 3 ]
echo "    winners by round: $(tr '\n' ' ' <"$WORK/winners"); server: $(curl -s "$AWS_ENDPOINT_URL/__stats")"

fy log $U --run run --json >"$WORK/log.json"
check "one lineage: HEAD 3, versions 1..3, each based on the one before" json \
    "d['head']==3 and [v['version'] for v in d['versions']]==[1,2,3] and all(v['base']==v['version']-1 for v in d['versions'][1:])" \
    <"$WORK/log.json"
last=$(tail -n 1 "$WORK/winners")
fy pull $U --run run --to "$WORK/pulled.safetensors" --trust-key "$WORK/trainer.pub" -q
check "a reader trusting the trainer's key pulls the last winner's model, bit for bit" \
    same_model "$WORK/pulled.safetensors" "$WORK/m/m-00$last.safetensors"
check_rc "a reader trusting another key refuses the run (exit 7)" 7 \
    fy pull $U --run run --to "$WORK/other.safetensors" --trust-key "$WORK/other.pub" -q
check "... and writes nothing" [ ! -e "$WORK/other.safetensors" ]
finish
