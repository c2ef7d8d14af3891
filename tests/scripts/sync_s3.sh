#!/usr/bin/env bash
# The sync protocol on s3:// against s3rver 3.7.1 (tests/npm) on 127.0.0.1,
# through the ferry CLI, with the rl-a checkpoints as a run:
#   - publish 9 versions (anchors every 4), the log; pull latest / exact /
#     min from nothing and from every version, bit-identical to the step
#     files; targets above HEAD refused (exit 4);
#   - a second publisher gets a conflict naming the first;
#   - a compacted delta used as the shortcut;
#   - a corrupted object (written with the AWS CLI) rejected by name, the
#     pull goes through an anchor;
#   - GC: dropped versions' objects gone from the bucket listing, a retained
#     old version still reaches the latest, a dropped one is exit 4;
#   - AWS CLI interop: `aws s3` lists and reads what ferry wrote (HEAD and a
#     manifest as JSON, an anchor as a checkpoint); objects uploaded with
#     `aws s3 cp` (an anchor, its manifest, then HEAD, under another prefix)
#     make a run ferry pulls;
#   - outage: s3rver killed in the middle of a throttled pull and restarted,
#     the pull completes; down past the deadline, a clear message (exit 5)
#     and the checkpoint untouched.
set -u
TEST_NAME=sync_s3
source tests/tools/sync_env.sh

s3_rla_start
U=s3://bkt/ferry
step() { printf '%s/rl-a/step-%03d.safetensors' "$DATA" "$1"; }
D=(--deadline 20)
json() { $PY -c "import json,sys; d=json.load(sys.stdin); sys.exit(0 if ($1) else 1)"; }

# --- publish and log ----------------------------------------------------------
pub_ok=0
for i in $(seq 0 8); do
    fy publish $U --run rl-a "$(step "$i")" --anchor-every 4 --cache "$WORK/pubcache.safetensors" \
        --publisher-id trainer-s3 -q "${D[@]}" && pub_ok=$((pub_ok + 1))
done
check "9 versions published" [ $pub_ok -eq 9 ]
fy log $U --run rl-a --json "${D[@]}" >"$WORK/log.json"
check "log: HEAD 9, anchors 1 5 9, each delta based on its predecessor" json \
    "d['head']==9 and [v['kind'] for v in d['versions']].count('anchor')==3 and all(v['base']==v['version']-1 for v in d['versions']) and d['versions'][4]['kind']=='anchor' and d['head_publisher']=='trainer-s3'" <"$WORK/log.json"

# --- pulls -----------------------------------------------------------------------
P=$WORK/p/policy.safetensors
mkdir -p "$WORK/p"
fy pull $U --run rl-a --to "$P" --json "${D[@]}" >"$WORK/pull.json"
check "pull latest from nothing: version 9 by anchor 9" json "d['version']==9 and d['route']=='anchor 9'" <"$WORK/pull.json"
check "... tensors equal the last step file" same_tensors "$(step 8)" "$P"
fy pull $U --run rl-a --to "$P" --exact-version 3 -q "${D[@]}"
check "exact version 3 (older: through anchor 1)" same_model "$(step 2)" "$P"
out=$(fy pull $U --run rl-a --to "$P" --min-version 2 "${D[@]}")
check "min version 2 when holding 3: up to date" grep -q "version 3 (up to date)" <<<"$out"
fy pull $U --run rl-a --to "$P" --min-version 4 -q "${D[@]}"
check "min version 4 when holding 3: the latest" same_model "$(step 8)" "$P"
check_rc "min version 10 (above HEAD): exit 4" 4 fy pull $U --run rl-a --to "$P" --min-version 10 -q "${D[@]}"
check_rc "exact version 12 (above HEAD): exit 4" 4 fy pull $U --run rl-a --to "$P" --exact-version 12 -q "${D[@]}"
check "the checkpoint still holds version 9" bash -c "fy pull $U --run rl-a --to '$P' --check | grep -q 'version 9 of run rl-a'"
bad_from=0
for v in $(seq 1 8); do
    Q=$WORK/p/from-$v.safetensors
    fy pull $U --run rl-a --to "$Q" --exact-version "$v" -q "${D[@]}" && same_model "$(step $((v - 1)))" "$Q" || bad_from=$((bad_from + 1))
    fy pull $U --run rl-a --to "$Q" -q "${D[@]}" && same_tensors "$(step 8)" "$Q" || bad_from=$((bad_from + 1))
done
check "from every version 1..8: exact, then latest, bit-identical" [ $bad_from -eq 0 ]

# --- a second publisher ------------------------------------------------------------
out=$(st conflict $U race "$(step 0)" 2>&1)
rc=$?
echo "    second publisher: $out"
check "a second publisher gets a conflict naming the first" [ $rc -eq 0 ]

# --- compaction ----------------------------------------------------------------------
fy compact $U --run rl-a --from 2 --to 8 --json "${D[@]}" >"$WORK/compact.json"
check "compact 2..8: smaller than the deltas it replaces" json "d['bytes'] < d['chain_bytes']" <"$WORK/compact.json"
fy pull $U --run rl-a --to "$WORK/p/c.safetensors" --exact-version 2 -q "${D[@]}"
fy pull $U --run rl-a --to "$WORK/p/c.safetensors" --json "${D[@]}" >"$WORK/cpull.json"
check "a subscriber at 2 takes the compacted delta" json "d['route']=='compacted 2..8 + chain 8..9'" <"$WORK/cpull.json"
check "... and ends bit-identical to step-008" same_tensors "$(step 8)" "$WORK/p/c.safetensors"

# --- a corrupted object ----------------------------------------------------------------
AWS=/usr/bin/aws
[ -x "$AWS" ] || AWS=$(command -v aws)
key7=$($PY -c "import json; d=json.load(open('$WORK/log.json')); v=[x for x in d['versions'] if x['version']==7][0]; print('rl-a/v/%020d-%s.patch' % (7, v['id']))")
fy pull $U --run rl-a --to "$WORK/p/bad.safetensors" --exact-version 6 -q "${D[@]}"
tool --endpoint "$AWS_ENDPOINT_URL" s3://bkt/ferry get "$key7" "$WORK/delta7" 2>/dev/null
head -c 4000 /dev/urandom >"$WORK/garbage"
if [ -n "$AWS" ]; then
    timeout 60 "$AWS" --endpoint-url "$AWS_ENDPOINT_URL" s3 cp "$WORK/garbage" "s3://bkt/ferry/$key7" >/dev/null 2>&1
else
    tool --endpoint "$AWS_ENDPOINT_URL" s3://bkt/ferry put "$key7" "$WORK/garbage" >/dev/null
fi
fy pull $U --run rl-a --to "$WORK/p/bad.safetensors" "${D[@]}" >"$WORK/bad.out" 2>"$WORK/bad.err"
rc=$?
sed 's/^/    | /' "$WORK/bad.out" "$WORK/bad.err"
check "a corrupted delta is rejected by name and the pull goes through anchor 9" \
    bash -c "[ $rc -eq 0 ] && grep -q 'anchor 9' '$WORK/bad.out' && grep -q '$key7' '$WORK/bad.err'"
check "... bit-identical to step-008" same_tensors "$(step 8)" "$WORK/p/bad.safetensors"
tool --endpoint "$AWS_ENDPOINT_URL" s3://bkt/ferry put "$key7" "$WORK/delta7" >/dev/null

# --- AWS CLI interop ---------------------------------------------------------------------
if [ -n "$AWS" ]; then
    aws_() { timeout 60 "$AWS" --endpoint-url "$AWS_ENDPOINT_URL" "$@"; }
    aws_ s3 ls --recursive s3://bkt/ferry/rl-a/ >"$WORK/ls.txt" 2>&1
    check "aws s3 ls lists HEAD, 9 manifests, 8 deltas, 3 anchors" bash -c \
        "grep -q ' ferry/rl-a/HEAD\$' '$WORK/ls.txt' && [ \$(grep -c '\\.json\$' '$WORK/ls.txt') -ge 10 ] && [ \$(grep -c '/v/.*\\.patch\$' '$WORK/ls.txt') -eq 8 ] && [ \$(grep -c '\\.safetensors\$' '$WORK/ls.txt') -eq 3 ]"
    aws_ s3 cp s3://bkt/ferry/rl-a/HEAD "$WORK/HEAD.json" >/dev/null 2>&1
    check "aws s3 cp reads HEAD: JSON naming version 9" json "d['version']==9 and d['format']=='ferry-head-1'" <"$WORK/HEAD.json"
    mkey=$($PY -c "import json; print(json.load(open('$WORK/HEAD.json'))['manifest'])")
    aws_ s3 cp "s3://bkt/ferry/$mkey" "$WORK/m9.json" >/dev/null 2>&1
    check "... and the manifest it names" json "d['version']==9 and d['kind']=='anchor' and d['full']['bytes']>0" <"$WORK/m9.json"
    fkey=$($PY -c "import json; print(json.load(open('$WORK/m9.json'))['full']['key'])")
    aws_ s3 cp "s3://bkt/ferry/$fkey" "$WORK/anchor9.safetensors" >/dev/null 2>&1
    check "aws s3 cp reads the anchor: a checkpoint equal to step-008" same_tensors "$(step 8)" "$WORK/anchor9.safetensors"
    # Import: objects uploaded with the AWS CLI, HEAD last, make a run.
    aws_ s3 cp "$WORK/anchor9.safetensors" "s3://bkt/mirror/$fkey" >/dev/null 2>&1
    aws_ s3 cp "$WORK/m9.json" "s3://bkt/mirror/$mkey" >/dev/null 2>&1
    aws_ s3 cp "$WORK/HEAD.json" s3://bkt/mirror/rl-a/HEAD >/dev/null 2>&1
    fy pull s3://bkt/mirror --run rl-a --to "$WORK/p/mirror.safetensors" -q "${D[@]}"
    check "a run uploaded with aws s3 cp (anchor, manifest, HEAD) pulls" same_tensors "$(step 8)" "$WORK/p/mirror.safetensors"
else
    echo "    (aws CLI not installed: interoperation not tested)"
fi

# --- retention -------------------------------------------------------------------------------
fy pull $U --run rl-a --to "$WORK/p/old.safetensors" --exact-version 6 -q "${D[@]}"
fy gc $U --run rl-a --keep 2 --json "${D[@]}" >"$WORK/gc.json"
check "gc --keep 2: retained 5..9 (8 chains back to anchor 5)" json "d['oldest_retained']==5 and d['objects_deleted']>0 and d['ok']" <"$WORK/gc.json"
tool --endpoint "$AWS_ENDPOINT_URL" s3://bkt/ferry ls rl-a/v/ >"$WORK/ls2.txt"
check "no object of versions 1..4 is left" bash -c "! grep -q 'rl-a/v/0000000000000000000[1-4]-' '$WORK/ls2.txt'"
check "a retained version (6) reaches the latest by deltas" bash -c \
    "fy pull $U --run rl-a --to '$WORK/p/old.safetensors' ${D[*]} | grep -q 'by chain 6..9'"
check_rc "a dropped version (3) is gone: exit 4" 4 fy pull $U --run rl-a --to "$WORK/p/gone.safetensors" --exact-version 3 -q "${D[@]}"

# --- outages -------------------------------------------------------------------------------
# (1) killed in the middle of a throttled pull of anchor 9, restarted.
fy pull $U --run rl-a --to "$WORK/p/slow.safetensors" --rate 1000000 --progress --deadline 60 >"$WORK/slow.out" 2>"$WORK/slow.err" &
pullpid=$!
killed_at=
if wait_for "$WORK/slow.err" '^progress ([1-9][0-9]{6}) ' 150; then
    kill -9 "$S3RVER_PID"
    wait "$S3RVER_PID" 2>/dev/null
    killed_at=$(grep '^progress' "$WORK/slow.err" | tail -n 1 | cut -d' ' -f2)
    sleep 1
    start_s3rver "$WORK/data" "$PORT" "$WORK/s3rver2.log"
fi
wait "$pullpid"
rc=$?
echo "    s3rver killed with ${killed_at:-?} bytes of the anchor received"
check "the server was killed mid-pull" [ -n "$killed_at" ]
check "the pull retried and completed after the restart" [ $rc -eq 0 ]
check "... bit-identical to step-008" same_tensors "$(step 8)" "$WORK/p/slow.safetensors"
# (2) down past the deadline: a clear message, exit 5, the checkpoint untouched.
stop_pid "$S3RVER_PID"
t1=$SECONDS
fy pull $U --run rl-a --to "$WORK/p/slow.safetensors" --exact-version 5 --deadline 2 -q 2>"$WORK/down.err"
rc=$?
sed 's/^/    | /' "$WORK/down.err"
check "server down past the deadline: exit 5" [ $rc -eq 5 ]
check "the message names the deadline and the last error" grep -qE 'deadline of 2.0 s passed after [0-9]+ attempts; last error' "$WORK/down.err"
check "and it gave up near the deadline" [ $((SECONDS - t1)) -le 8 ]
check "the checkpoint still holds version 9" same_tensors "$(step 8)" "$WORK/p/slow.safetensors"
finish
