#!/usr/bin/env bash
# `ferry-demo --store s3://...` against s3rver 3.7.1 (tests/npm) on
# 127.0.0.1: the trainer and its islands share only an S3 bucket.  A small
# run in each mode completes, every step takes one batch per island, the
# islands fetched deltas after their first anchor, and no trajectory batch
# is left in the bucket afterwards (listed with store_tool).
set -u
TEST_NAME=demo_s3
source tests/tools/store_env.sh

command -v node >/dev/null || skip_all "node is not installed"
[ -f "$S3RVER_JS" ] || skip_all "s3rver is not installed (scripts/install-deps.sh runs npm install in tests/npm)"
source tests/tools/demo_env.sh
store_built || skip_all "store layer not built (NO_NET=1)"

PORT=$(free_port)
mkdir -p "$WORK/data"
start_s3rver "$WORK/data" "$PORT" "$WORK/s3rver.log" || { echo "0 passed, 1 failed"; exit 1; }
# the demo's trainer deletes consumed batches while islands put more: the
# DELETE/PUT race that crashes s3rver (tests/tools/store_env.sh)
start_s3rver_watchdog "$WORK/data" "$PORT" "$WORK/s3rver.log"
export AWS_ACCESS_KEY_ID=S3RVER AWS_SECRET_ACCESS_KEY=S3RVER AWS_REGION=us-east-1 AWS_DEFAULT_REGION=us-east-1
export AWS_ENDPOINT_URL_S3=http://127.0.0.1:$PORT
unset AWS_SESSION_TOKEN AWS_ENDPOINT_URL AWS_PROFILE
export TMPDIR=$WORK
export XDG_CACHE_HOME=$WORK/cache # the demo caches its pre-trained start there

for mode in sequential async; do
    out=$WORK/$mode.json
    timeout -k 10 240 "$DEMO" --store s3://bkt/demo --mode $mode --islands 2 --steps 5 --dim 32 --prompts 4 --group 4 \
        --json --report "$WORK/$mode.html" >"$out" 2>"$WORK/$mode.err"
    rc=$?
    check "$mode: ferry-demo on s3:// completes (exit $rc)" [ $rc -eq 0 ]
    [ $rc -eq 0 ] || tail -n 20 "$WORK/$mode.err" | sed 's/^/    | /'
    check "$mode: 5 steps of 2 batches, 6 versions, islands fetched deltas" $PY - "$out" <<'PYEOF'
import json, sys
ev = [json.loads(l) for l in open(sys.argv[1])]
st = [e for e in ev if e["event"] == "step"]
sm = [e for e in ev if e["event"] == "summary"][0]
assert ev[0]["store"].startswith("s3://bkt/demo"), ev[0]
assert len(st) == 5 and all(s["batches"] == 2 for s in st), st
assert sm["versions"] == 6 and sm["admitted"] - sm["discarded"] == 10, sm
# two first anchors, then deltas only: far less than a full checkpoint per sync
assert sm["fetched_bytes"] < 2 * sm["full_bytes"] + 10 * max(s["patch_bytes"] for s in st) + 65536, sm
PYEOF
    # islands that died (and were restarted) refetch an anchor: say why they died
    grep -h -e '"event":"died"' -e 'ferry-demo island' -e 'ferry-demo:' "$out" "$WORK/$mode.err" 2>/dev/null | head -n 10 | sed 's/^/    | /'
    run=$($PY -c 'import json,sys
for l in open(sys.argv[1]):
    e = json.loads(l)
    if e["event"] == "leg": print(e["run"])' "$out")
    tool --endpoint "$AWS_ENDPOINT_URL_S3" s3://bkt/demo ls "$run/" >"$WORK/$mode.ls" 2>&1
    check "$mode: the run's policy versions are in the bucket ($run/policy/)" grep -q "^$run/policy/HEAD " "$WORK/$mode.ls"
    check "$mode: no batch left under $run/traj/" bash -c "! grep -q '^$run/traj/' '$WORK/$mode.ls'"
done
stop_s3rver_watchdog
echo "    s3rver restarts by the watchdog: $(cat "$WORK/restarts" 2>/dev/null || echo 0)"
finish
