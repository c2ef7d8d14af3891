#!/usr/bin/env bash
# Async push-pull in ferry-demo: islands sample continuously with the
# version they hold and follow HEAD in the background; the dock admits a
# batch iff trainer version - batch version <= S.  For S = 0 (many drops)
# and S = 2, on a small quickly-learnable setting trained from scratch at a
# high rate (copy 2 digits, hidden width 64, --warmup-steps 0, lr 1e-2 with
# AdamW's usual eps 1e-8 and no lr warm-up, 3 islands, 40 steps), where
# staleness matters most; demo_regime.sh runs async at the default
# post-training settings:
#   - no consumed batch is older than S versions (every step's staleness_max,
#     and the summary's histogram);
#   - every dropped batch is counted: the per-step drops add up to the
#     run's, and the batches the islands put (their own count, from their
#     status objects) = consumed + dropped + left over at the end
#     (+ duplicates + rejected, both 0 here);
#   - the run still learns: mean reward of the last 10 steps exceeds that of
#     the first 10 by more than 0.15 (typically 0.05 -> 0.5..0.9).
# Prints "N passed, N failed" last.
set -u
cd "$(dirname "$0")/../.."
PY=/usr/bin/python3; [ -x "$PY" ] || PY=python3
passed=0 failed=0
tmp=$(mktemp -d "${TMPDIR:-/tmp}/ferry-demo-async.XXXXXX"); trap 'rm -rf "$tmp"' EXIT
export TMPDIR=$tmp
export XDG_CACHE_HOME=$tmp/cache # the demo caches its pre-trained start there
pass() { passed=$((passed + 1)); echo "ok   $1"; }
fail() { failed=$((failed + 1)); echo "FAIL $1"; [ -s "$tmp/log" ] && sed 's/^/    | /' "$tmp/log" | tail -n 15; }
source tests/tools/demo_env.sh

for S in 0 2; do
    out=$tmp/s$S.json
    if timeout 300 "$DEMO" --mode async --max-staleness $S --islands 3 --steps 40 --task copy --digits 2 --dim 64 \
        --warmup-steps 0 --lr 1e-2 --eps 1e-8 --lr-warmup 0 --prompts 8 --group 8 --seed 5 --json --report "$tmp/s$S.html" >"$out" 2>"$tmp/log"; then
        pass "S=$S: the run completes"
    else
        fail "S=$S: the run completes"; continue
    fi
    check() { # name, python body using ev (events), st (steps), sm (summary), S
        if $PY - "$out" "$S" "$2" >"$tmp/log" 2>&1 <<'PYEOF'; then pass "S=$S: $1"; else fail "S=$S: $1"; fi
import json, sys
ev = [json.loads(l) for l in open(sys.argv[1])]
S = int(sys.argv[2])
st = [e for e in ev if e["event"] == "step"]
sm = [e for e in ev if e["event"] == "summary"][0]
exec(sys.argv[3])
PYEOF
    }
    check "no consumed batch is older than S" '
assert len(st) == 40
for s in st: assert s["staleness_max"] <= S and s["batches"] == 3, s
assert len(sm["staleness_hist"]) <= S + 1 and sum(sm["staleness_hist"]) == 120, sm
assert sm["max_staleness_seen"] <= S'
    check "every dropped batch is counted" '
assert sum(s["dropped"] for s in st) == sm["dropped"], (sum(s["dropped"] for s in st), sm["dropped"])
assert sm["duplicates"] == 0 and sm["rejected"] == 0 and sm["discarded"] == 0, sm
consumed = sm["admitted"] - sm["discarded"]
assert consumed == 120, sm
assert sm["produced"] == consumed + sm["dropped"] + sm["leftover"], sm
print("put", sm["produced"], "consumed", consumed, "dropped", sm["dropped"], "left", sm["leftover"])
if S == 0: assert sm["dropped"] > 0, "S=0 should drop batches sampled with an older version"'
    check "the run still learns (last 10 steps > first 10 + 0.15)" '
print(sm["reward_first"], sm["reward_last"])
assert sm["window"] == 10 and sm["reward_last"] > sm["reward_first"] + 0.15, sm'
done
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
