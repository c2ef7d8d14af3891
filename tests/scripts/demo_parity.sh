#!/usr/bin/env bash
# Parity of ferry-demo (sequential pull, fixed seed): a run whose islands
# sync through ferry patches and a run whose islands fetch a full checkpoint
# per version (every version an anchor, taken by a subscriber that holds
# nothing) produce bit-identical trajectories and final weights.  Compared:
# the XXH3-128 of every consumed batch's payload (in step and shard order)
# and the model hash of the final FP32 masters.  The network is the
# reference one (1,001,298 parameters) at the default post-training
# settings (pre-trained start, low learning rate), so patches are real and
# small ones; a third
# run repeats the patch run: the result does not depend on process timing.
# Prints "N passed, N failed" last.
set -u
cd "$(dirname "$0")/../.."
PY=/usr/bin/python3; [ -x "$PY" ] || PY=python3
passed=0 failed=0
tmp=$(mktemp -d "${TMPDIR:-/tmp}/ferry-demo-parity.XXXXXX"); trap 'rm -rf "$tmp"' EXIT
export TMPDIR=$tmp
export XDG_CACHE_HOME=$tmp/cache # the demo caches its pre-trained start there
pass() { passed=$((passed + 1)); echo "ok   $1"; }
fail() { failed=$((failed + 1)); echo "FAIL $1"; }
source tests/tools/demo_env.sh

ARGS=(--mode sequential --islands 2 --steps 4 --prompts 6 --group 4 --seed 7 --json)
for s in patch full patch2; do
    sync=${s%2}
    if timeout 300 "$DEMO" "${ARGS[@]}" --sync "$sync" --report "$tmp/$s.html" >"$tmp/$s.json" 2>"$tmp/$s.err"; then
        pass "sequential run, --sync $sync ($s)"
    else
        fail "sequential run, --sync $sync ($s)"; tail -n 20 "$tmp/$s.err" | sed 's/^/    | /'
    fi
done
summary() { grep '"event":"summary"' "$tmp/$1.json"; }
field() { summary "$1" | $PY -c 'import json,sys; print(json.load(sys.stdin)[sys.argv[1]])' "$2" 2>/dev/null; }

for f in traj_hash masters_hash; do
    a=$(field patch $f) b=$(field full $f) c=$(field patch2 $f)
    if [ -n "$a" ] && [ "$a" = "$b" ]; then pass "$f: patches == full checkpoints ($a)"; else fail "$f: patches '$a' != full checkpoints '$b'"; fi
    if [ -n "$a" ] && [ "$a" = "$c" ]; then pass "$f: a second patch run gives the same"; else fail "$f: second patch run '$c' != '$a'"; fi
done
# the two transports really differ: every full-mode version is an anchor and
# the islands fetched whole checkpoints; the patch run fetched deltas
if $PY - "$tmp/patch.json" "$tmp/full.json" <<'PYEOF'; then pass "full mode shipped full checkpoints, patch mode deltas"; else fail "full mode shipped full checkpoints, patch mode deltas"; fi
import json, sys
p, f = [[json.loads(l) for l in open(x)] for x in sys.argv[1:3]]
sp = [e for e in p if e["event"] == "summary"][0]
sf = [e for e in f if e["event"] == "summary"][0]
assert sf["anchors"] == sf["versions"] == 5 and sp["anchors"] == 1, (sf, sp)
# each island fetched version 1..4 whole: 2 x 4 full checkpoints at least
assert sf["fetched_bytes"] >= 8 * sf["full_bytes"], sf
assert sp["fetched_bytes"] < 2 * sp["full_bytes"] + 3 * 2 * max(e["patch_bytes"] for e in p if e["event"] == "step"), sp
for e in p + f:
    if e["event"] == "step":
        assert e["staleness_max"] == 0 and e["batches"] == 2, e
PYEOF
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
