#!/usr/bin/env bash
# ferry-demo at its default settings is an RL post-training run: it starts
# from a pre-trained policy (the supervised warm-up, cached) and moves it at
# a post-training learning rate, so each version is a small patch.  A short
# run of the reference network (1,001,298 parameters) at the defaults,
# async and sequential (the full run is 150 steps; docs/DEMO.md):
#   - the start is pre-trained: the first steps' reward is far above chance
#     (1/32), and both runs start from the same cached weights (same hash);
#   - the regime: the mean patch is under 5% of a full BF16 checkpoint, and
#     so is every patch after the learning-rate warm-up; the reward does not
#     fall (last 10 steps >= first 10 - 0.03: noise, not a trend);
#   - async: no consumed batch is older than the default max staleness (2);
#   - the islands' time waiting for weights: sequential islands wait for
#     each sync (> 0), async ones sample while the follower syncs (less);
#   - time-to-fresh-policy is known for most versions and positive.
# Prints "N passed, N failed" last.
set -u
cd "$(dirname "$0")/../.."
PY=/usr/bin/python3; [ -x "$PY" ] || PY=python3
passed=0 failed=0
tmp=$(mktemp -d "${TMPDIR:-/tmp}/ferry-demo-regime.XXXXXX"); trap 'rm -rf "$tmp"' EXIT
export TMPDIR=$tmp
export XDG_CACHE_HOME=$tmp/cache
pass() { passed=$((passed + 1)); echo "ok   $1"; }
fail() { failed=$((failed + 1)); echo "FAIL $1"; [ -s "$tmp/log" ] && sed 's/^/    | /' "$tmp/log" | tail -n 15; }
source tests/tools/demo_env.sh

for mode in async sequential; do
    steps=24; [ $mode = sequential ] && steps=12
    if timeout 400 "$DEMO" --mode $mode --steps $steps --json --report "$tmp/$mode.html" >"$tmp/$mode.json" 2>"$tmp/log"; then
        pass "$mode: $steps default steps complete"
    else
        fail "$mode: $steps default steps complete"
    fi
done

check() { # name, python body: a (async events), q (sequential events), sa/sq (summaries), st (async steps)
    if $PY - "$tmp/async.json" "$tmp/sequential.json" "$2" >"$tmp/log" 2>&1 <<'PYEOF'; then pass "$1"; else fail "$1"; fi
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
q = [json.loads(l) for l in open(sys.argv[2])]
sa = [e for e in a if e["event"] == "summary"][0]
sq = [e for e in q if e["event"] == "summary"][0]
st = [e for e in a if e["event"] == "step"]
exec(sys.argv[3])
PYEOF
}
check "the start is pre-trained (reward far above chance), the same cached weights twice" '
print(sa["reward_first"], a[0]["base_reused"], q[0]["base_reused"])
assert a[0]["warmup_steps"] > 0 and not a[0]["base_reused"] and q[0]["base_reused"], (a[0], q[0])
assert a[0]["base_hash"] == q[0]["base_hash"]
assert sa["reward_first"] > 0.25 and sq["reward_first"] > 0.25, (sa, sq)'
check "mean patch < 5% of a full checkpoint; every patch after the lr warm-up < 5%" '
w = a[0]["lr_warmup"]
print(sa["patch_mean_pct"], max(s["patch_pct"] for s in st[w:]))
assert sa["patch_mean_pct"] < 5 and sq["patch_mean_pct"] < 5, (sa["patch_mean_pct"], sq["patch_mean_pct"])
assert all(s["patch_pct"] < 5 for s in st[w:]), [s["patch_pct"] for s in st]'
check "the reward does not fall (last 10 >= first 10 - 0.03)" '
print(sa["reward_first"], sa["reward_last"])
assert sa["window"] == 10 and sa["reward_last"] >= sa["reward_first"] - 0.03, sa'
check "async: no consumed batch older than the max staleness" '
assert a[0]["max_staleness"] == 2 and len(st) == 24
assert all(s["staleness_max"] <= 2 for s in st) and sa["max_staleness_seen"] <= 2, sa'
check "waiting for weights: sequential islands wait for each sync, async ones less" '
print(sq["wait_share"], sa["wait_share"])
assert 0 < sq["wait_share"] < 1 and 0 <= sa["wait_share"] < sq["wait_share"], (sq["wait_share"], sa["wait_share"])'
check "time-to-fresh-policy known for most versions" '
for s in (sa, sq):
    print(s["fresh_known"], s["fresh_mean_ms"], s["fresh_max_ms"])
    assert s["fresh_known"] >= s["patches"] // 2 and 0 < s["fresh_mean_ms"] <= s["fresh_max_ms"], s'
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
