#!/usr/bin/env bash
# Island churn in ferry-demo: an island killed with SIGKILL mid-run and
# restarted rejoins, catches up through the sync protocol (its new process
# holds no version: it reaches the current one from an anchor plus deltas,
# which its first status line reports) and contributes batches again; the
# run completes.
#   1. async, --kill-island-at 5: the demo kills island 0 itself and
#      restarts it 2 steps (and 300 ms) later, versions having moved on;
#   2. sequential, killed from outside: this script reads island 1's pid
#      from the demo's JSON, waits until the run is a few steps in, and
#      kill -9s it; the demo sees the death, restarts the island, and the
#      step that was waiting for its shard completes.
# Checks: exit 0, every step done, the kill/died, restart and rejoin events
# (the rejoin names the anchor it started from), the new pid, batches from the restarted island consumed after its restart,
# and no shard consumed twice (sequential: 2 batches per step).
# Prints "N passed, N failed" last.
set -u
cd "$(dirname "$0")/../.."
PY=/usr/bin/python3; [ -x "$PY" ] || PY=python3
passed=0 failed=0
tmp=$(mktemp -d "${TMPDIR:-/tmp}/ferry-demo-churn.XXXXXX")
demo_pid=
cleanup() { [ -n "$demo_pid" ] && kill "$demo_pid" 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
export TMPDIR=$tmp
export XDG_CACHE_HOME=$tmp/cache # the demo caches its pre-trained start there
pass() { passed=$((passed + 1)); echo "ok   $1"; }
fail() { failed=$((failed + 1)); echo "FAIL $1"; [ -s "$tmp/log" ] && sed 's/^/    | /' "$tmp/log" | tail -n 15; }
source tests/tools/demo_env.sh

# a small network at the default post-training settings (pre-trained start,
# cached in $XDG_CACHE_HOME; low learning rate)
SMALL=(--islands 2 --task copy --digits 2 --dim 64 --prompts 6 --group 4)
# check NAME FILE PYTHON: ev (events), st (steps), sm (summary)
check() {
    if $PY - "$2" "$3" >"$tmp/log" 2>&1 <<'PYEOF'; then pass "$1"; else fail "$1"; fi
import json, sys
ev = [json.loads(l) for l in open(sys.argv[1])]
st = [e for e in ev if e["event"] == "step"]
sms = [e for e in ev if e["event"] == "summary"]
sm = sms[0] if sms else {}
exec(sys.argv[2])
PYEOF
}

# ---- 1. async, killed by the demo -------------------------------------------
out=$tmp/async.json
timeout 300 "$DEMO" "${SMALL[@]}" --mode async --steps 48 --kill-island-at 5 --restart-after 2 --json --report "$tmp/a.html" >"$out" 2>"$tmp/a.err"
rc=$?
if [ $rc -eq 0 ]; then pass "async: the run completes with a killed island"; else cp "$tmp/a.err" "$tmp/log"; fail "async: the run completes (exit $rc)"; fi
check "async: kill at step 5, restart 2+ steps later with a new pid, every step done" "$out" '
assert len(st) == 48 and sm["steps"] == 48
k = [e for e in ev if e["event"] == "kill"]; r = [e for e in ev if e["event"] == "restart"]
assert len(k) == 1 and k[0]["island"] == 0 and k[0]["step"] == 5, k
assert len(r) == 1 and r[0]["island"] == 0 and r[0]["step"] >= 7 and r[0]["pid"] != k[0]["pid"], r
leg = [e for e in ev if e["event"] == "leg"][0]
assert leg["island_pids"][0] == k[0]["pid"]
assert not [e for e in ev if e["event"] == "died"], "the planned kill is not reported as a death"
j = [e for e in ev if e["event"] == "rejoin"]
assert len(j) == 1 and j[0]["pid"] == r[0]["pid"] and "anchor" in j[0]["what"], j
print(j[0]["what"])'
check "async: the restarted island contributed batches after its restart" "$out" '
print("batches of the restarted island:", sm["restarted_batches"])
assert sm["restarts"] == 1 and sm["restarted_batches"] > 0, sm'

# ---- 2. sequential, killed from outside ---------------------------------------
out=$tmp/seq.json
timeout 300 "$DEMO" "${SMALL[@]}" --mode sequential --steps 60 --json --report "$tmp/s.html" >"$out" 2>"$tmp/s.err" &
demo_pid=$!
victim=
for ((i = 0; i < 600; i++)); do  # up to 60 s for the run to reach step 3
    grep -q '"event":"step","leg":"[^"]*","step":3,' "$out" 2>/dev/null && break
    kill -0 "$demo_pid" 2>/dev/null || break
    sleep 0.1
done
victim=$($PY -c 'import json,sys
for l in open(sys.argv[1]):
    e = json.loads(l)
    if e["event"] == "leg": print(e["island_pids"][1]); break' "$out" 2>/dev/null)
if [ -n "$victim" ] && kill -0 "$victim" 2>/dev/null && grep -q "island" "/proc/$victim/cmdline" 2>/dev/null; then
    kill -9 "$victim"
    pass "sequential: island 1 (pid $victim) killed with SIGKILL mid-run"
else
    fail "sequential: could not find island 1 running (pid '$victim')"
fi
wait "$demo_pid"; rc=$?; demo_pid=
if [ $rc -eq 0 ]; then pass "sequential: the run completes"; else cp "$tmp/s.err" "$tmp/log"; fail "sequential: the run completes (exit $rc)"; fi
check "sequential: death seen, island restarted with a new pid, every step done" "$out" "
assert len(st) == 60 and sm['steps'] == 60
d = [e for e in ev if e['event'] == 'died']; r = [e for e in ev if e['event'] == 'restart']
assert len(d) == 1 and d[0]['island'] == 1 and d[0]['pid'] == $victim, d
assert 'signal 9' in d[0]['what'], d
assert len(r) == 1 and r[0]['island'] == 1 and r[0]['pid'] != $victim, r
killed_at = d[0]['step']
assert killed_at < 59, 'the kill came too late to show a rejoin'
j = [e for e in ev if e['event'] == 'rejoin']
assert len(j) == 1 and j[0]['pid'] == r[0]['pid'] and 'anchor' in j[0]['what'], j
print(j[0]['what'])"
check "sequential: every step took exactly one batch per shard; the restarted island contributed" "$out" '
for s in st: assert s["batches"] == 2 and s["prompts"] == 6 and s["staleness_max"] == 0, s
print("batches of the restarted island:", sm["restarted_batches"], "discarded:", sm["discarded"])
assert sm["restarted_batches"] > 0, sm'
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
