#!/usr/bin/env bash
# ferry-demo (the README's main-job command, examples/rl/demo), its command
# line and output:
#   - `ferry-demo --help` exits 0 with the usage on stdout, naming every
#     option; the ferry CLI has no demo: `ferry demo` and `ferry island` exit
#     2 pointing to ferry-demo, `ferry --help` does not list it, and ferry
#     links no code of examples/rl;
#   - bad options and values exit 2 with one line on stderr and nothing on
#     stdout; the hidden `ferry-demo island` refuses a bad command line the
#     same way;
#   - a tiny run (2 islands, a small network, a few steps) with --json: every
#     line is a JSON object; start, leg, one step per trainer step, summary
#     and report events; versions advance; the islands' pids are real
#     processes that are gone afterwards; the report is a self-contained HTML
#     file (inline SVG, no external resource);
#   - the same run without --json prints the table and the report's path;
#     the temporary store is removed, the report kept;
#   - --adaptive runs a baseline and an adaptive leg; the adaptive one
#     publishes fewer versions, and the report compares them.
# Prints "N passed, N failed" last.  Every run is bounded by `timeout`.
set -u
cd "$(dirname "$0")/../.."
FERRY=${FERRY_BIN:-$PWD/build/ferry}
source tests/tools/demo_env.sh
PY=/usr/bin/python3; [ -x "$PY" ] || PY=python3
passed=0 failed=0
tmp=$(mktemp -d "${TMPDIR:-/tmp}/ferry-demo-cli.XXXXXX"); trap 'rm -rf "$tmp"' EXIT
export TMPDIR=$tmp
export XDG_CACHE_HOME=$tmp/cache # the demo caches its pre-trained start there

pass() { passed=$((passed + 1)); echo "ok   $1"; }
fail() { failed=$((failed + 1)); echo "FAIL $1"; for f in "$tmp/out" "$tmp/err"; do [ -s "$f" ] && sed 's/^/    | /' "$f" | tail -n 12; done; }
run() { timeout 120 "$DEMO" "$@" >"$tmp/out" 2>"$tmp/err"; rc=$?; }
runf() { timeout 120 "$FERRY" "$@" >"$tmp/out" 2>"$tmp/err"; rc=$?; }

if [ ! -x "$FERRY" ]; then echo "FAIL $FERRY is not built (make cli)"; echo "0 passed, 1 failed"; exit 1; fi

# ---- help ------------------------------------------------------------------
run --help
if [ $rc -eq 0 ] && grep -q '^usage: ferry-demo \[options\]' "$tmp/out" && [ ! -s "$tmp/err" ]; then
    missing=
    for o in --store --islands --steps --mode --max-staleness --seed --adaptive --report --json --kill-island-at --sync \
        --warmup-steps --warmup-lr --cache --no-cache --lr-warmup --eps --beta1; do
        grep -q -- "$o" "$tmp/out" || missing="$missing $o"
    done
    if [ -z "$missing" ]; then pass "demo --help names every option"; else fail "demo --help lacks:$missing"; fi
else fail "demo --help (exit $rc)"; fi

# ---- the ferry CLI has no demo ---------------------------------------------
runf --help
if [ $rc -eq 0 ] && ! grep -qE '^ +(demo|island) ' "$tmp/out"; then pass "ferry --help does not list the demo"
else fail "ferry --help does not list the demo (exit $rc)"; fi
for c in demo island; do
    runf $c --steps 1
    if [ $rc -eq 2 ] && [ ! -s "$tmp/out" ] && [ "$(wc -l <"$tmp/err")" -eq 1 ] && grep -q 'moved to ferry-demo' "$tmp/err"; then
        pass "ferry $c exits 2 pointing to ferry-demo"
    else fail "ferry $c exits 2 pointing to ferry-demo (exit $rc)"; fi
done
# the RL module's functions are rl_*, the demo's demo_* and cmd_demo/cmd_island
rl_syms=$(nm --defined-only "$FERRY" 2>/dev/null | grep -E ' (rl_|demo_|cmd_demo$|cmd_island$)' | head -n 3)
if nm --defined-only "$FERRY" 2>/dev/null | grep -q ' ferry_version$' && [ -z "$rl_syms" ]; then
    pass "ferry links no examples/rl or demo code"
else fail "ferry links no examples/rl or demo code: $rl_syms"; fi

# ---- bad command lines -----------------------------------------------------
bad() { # description, args...
    local what=$1; shift
    run "$@"
    if [ $rc -eq 2 ] && [ ! -s "$tmp/out" ] && [ "$(wc -l <"$tmp/err")" -eq 1 ]; then pass "refused: $what"
    else fail "refused: $what (exit $rc)"; fi
}
bad "unknown option" --bogus
bad "positional argument" extra
bad "mode" --mode turbo
bad "islands 0" --islands 0
bad "islands not a number" --islands three
bad "steps 0" --steps 0
bad "steps missing value" --steps
bad "max-staleness negative" --max-staleness -1
bad "seed" --seed x1
bad "adaptive > 1" --adaptive 1.5
bad "adaptive 0" --adaptive 0
bad "no-baseline without adaptive" --no-baseline
bad "fewer prompts than islands" --islands 4 --prompts 3
bad "sync" --sync half
bad "lr" --lr -1
bad "warmup-steps" --warmup-steps -1
bad "eps 0" --eps 0
bad "beta1 1" --beta1 1
bad "cache missing value" --cache
bad "island without arguments" island
bad "island bad id" island --store /tmp --run r --island -3
run --store 'ftp://example.invalid/x' --steps 1 --report "$tmp/never.html"
if [ $rc -eq 1 ] && [ ! -e "$tmp/never.html" ] && grep -q '^ferry-demo: ' "$tmp/err"; then pass "an unsupported store URL fails cleanly"
else fail "an unsupported store URL fails cleanly (exit $rc)"; fi

# ---- a tiny run, JSON ------------------------------------------------------
SMALL=(--islands 2 --steps 5 --dim 32 --prompts 4 --group 4 --seed 3)
run "${SMALL[@]}" --json --report "$tmp/r1.html"
if [ $rc -eq 0 ]; then pass "tiny --json run exits 0"; else fail "tiny --json run exits 0 (exit $rc)"; fi
if $PY - "$tmp/out" 5 <<'EOF' >"$tmp/err" 2>&1; then pass "JSON lines parse; events, steps and versions as expected"; else fail "JSON lines parse; events, steps and versions as expected"; fi
import json, os, sys
lines = open(sys.argv[1]).read().splitlines()
steps = int(sys.argv[2])
ev = [json.loads(l) for l in lines]          # every line is JSON
kinds = [e["event"] for e in ev]
assert kinds[0] == "start" and kinds[1] == "leg", kinds
assert kinds.count("step") == steps and kinds[-2:] == ["summary", "report"], kinds
st = [e for e in ev if e["event"] == "step"]
assert [s["step"] for s in st] == list(range(steps))
for s in st:
    assert 0 <= s["reward"] <= 1 and s["batches"] == 2 and s["prompts"] == 4, s
    assert s["published"] and s["new_version"] == s["version"] + 1, s
    assert s["patch_bytes"] > 0 and s["full_bytes"] > s["patch_bytes"], s
assert st[0]["version"] == 1
leg = ev[1]
assert len(leg["island_pids"]) == 2
for p in leg["island_pids"]:
    assert not os.path.exists("/proc/%d/cmdline" % p) or b"island" not in open("/proc/%d/cmdline" % p, "rb").read(), p
sm = ev[-2]
assert sm["steps"] == steps and sm["versions"] == steps + 1 and sm["admitted"] == 2 * steps, sm
assert sm["produced"] == sm["admitted"] + sm["dropped"] + sm["leftover"] + sm["duplicates"] + sm["rejected"], sm
assert len(sm["traj_hash"]) == 32 and len(sm["masters_hash"]) == 32
assert ev[-1]["path"].endswith("r1.html")
# the pre-trained start: computed (not reused) on the first run, cached
assert ev[0]["warmup_steps"] == 20 and not ev[0]["base_reused"] and len(ev[0]["base_hash"]) == 32, ev[0]
assert ev[0]["base_path"].startswith(os.environ["XDG_CACHE_HOME"] + "/ferry/demo-base-"), ev[0]
assert os.path.getsize(ev[0]["base_path"]) > 0
# what a user wants per version and per run
for s in st:
    assert abs(s["patch_pct"] - 100.0 * s["patch_bytes"] / s["full_bytes"]) < 0.01, s
    assert 0 <= s["wait_share"] <= 1 and s["step_ms"] > 0, s
    assert s["fresh_ms"] == -1 or (s["fresh_ms"] >= 0 and 2 <= s["fresh_version"] <= s["version"] + 1), s
assert 0 < sm["patch_mean_pct"] < 100 and sm["patches"] == steps, sm
assert sm["fresh_known"] >= 1 and sm["fresh_max_ms"] >= sm["fresh_mean_ms"] > 0, sm
assert 0 <= sm["wait_share"] < 1, sm
open(os.path.join(os.path.dirname(sys.argv[1]), "base1"), "w").write(ev[0]["base_hash"] + " " + ev[0]["base_path"])
EOF
if [ -s "$tmp/r1.html" ] && head -c 15 "$tmp/r1.html" | grep -q '<!DOCTYPE html>' && grep -q '<svg' "$tmp/r1.html" \
   && ! grep -qiE '(src|href)=|<script|<link|@import|url\(' "$tmp/r1.html"; then
    pass "the report is self-contained HTML with inline SVG"
else fail "the report is self-contained HTML with inline SVG"; fi
for t in "mean reward per step" "bytes per version" "staleness"; do
    grep -q "$t" "$tmp/r1.html" || { fail "report has '$t'"; continue; }
    pass "report has '$t'"
done
if [ -z "$(ls "$tmp" | grep '^ferry-demo\.')" ]; then pass "with --report, no work directory is left"
else fail "with --report, no work directory is left: $(ls "$tmp")"; fi

# ---- the same, as a table --------------------------------------------------
run "${SMALL[@]}"
report=$(sed -n 's/^report: //p' "$tmp/out")
if [ $rc -eq 0 ] && grep -qE '^ +step +ver +reward' "$tmp/out" && [ "$(grep -cE '^ +[0-9]+ +[0-9]+ +0\.[0-9]{4} ' "$tmp/out")" -eq 5 ]; then
    pass "table: header and one row per step"
else fail "table: header and one row per step (exit $rc)"; fi
if [ -n "$report" ] && [ -s "$report" ] && [ ! -e "$(dirname "$report")/store" ]; then pass "report kept, temporary store removed"
else fail "report kept, temporary store removed ($report)"; fi
if grep -q '^== publish every step: each version shipped as [0-9.]*% of a full checkpoint' "$tmp/out"; then
    pass "the summary's first line is the headline"
else fail "the summary's first line is the headline"; fi
wide=$(awk 'length($0) > 100' "$tmp/out" | grep -vE '^ +(/|file://)|^report: ' | head -n 3)
if [ -z "$wide" ]; then pass "the output fits in 100 columns (paths apart)"; else fail "the output fits in 100 columns: $wide"; fi
read -r base_hash base_path <"$tmp/base1"
if grep -q "start: pre-trained by 20 supervised warm-up steps, reused (hash verified) from" "$tmp/out" &&
   grep -qx "    $base_path" "$tmp/out"; then
    pass "a second run reuses the cached pre-trained start"
else fail "a second run reuses the cached pre-trained start"; fi

# ---- a damaged cache is recomputed, not trusted -----------------------------
printf '\x7f' | dd of="$base_path" bs=1 seek=$(( $(stat -c %s "$base_path") - 3 )) conv=notrunc status=none
run "${SMALL[@]}" --json --report "$tmp/r3.html"
got=$($PY -c 'import json,sys; e=json.loads(open(sys.argv[1]).readline()); print(e["base_reused"], e["base_hash"])' "$tmp/out" 2>/dev/null)
if [ $rc -eq 0 ] && [ "$got" = "False $base_hash" ] && grep -q 'recomputing it' "$tmp/err"; then
    pass "a damaged cached start is detected and recomputed (same hash)"
else fail "a damaged cached start is detected and recomputed (exit $rc, got '$got', want 'False $base_hash')"; fi
run "${SMALL[@]}" --json --no-cache --report "$tmp/r4.html"
got=$($PY -c 'import json,sys; e=json.loads(open(sys.argv[1]).readline()); print(e["base_reused"], e["base_hash"], e["base_path"])' "$tmp/out" 2>/dev/null)
if [ $rc -eq 0 ] && [ "$got" = "False $base_hash " ]; then pass "--no-cache runs the warm-up again, same start"
else fail "--no-cache runs the warm-up again, same start (got '$got')"; fi

# ---- adaptive publication --------------------------------------------------
run --islands 2 --steps 8 --dim 32 --prompts 4 --group 4 --lr 2e-3 --adaptive 0.9 --max-skip 3 --json --report "$tmp/r2.html"
if [ $rc -eq 0 ] && $PY - "$tmp/out" <<'EOF' >"$tmp/err" 2>&1; then pass "adaptive: baseline and adaptive legs, fewer versions"; else fail "adaptive: baseline and adaptive legs, fewer versions (exit $rc)"; fi
import json, sys
ev = [json.loads(l) for l in open(sys.argv[1])]
sm = [e for e in ev if e["event"] == "summary"]
assert [s["leg"] for s in sm] == ["publish every step", "adaptive 0.9"], sm
base, ad = sm
assert base["versions"] == 9 and ad["versions"] < base["versions"], (base["versions"], ad["versions"])
st = [e for e in ev if e["event"] == "step" and e["leg"] == "adaptive 0.9"]
held = [s for s in st if not s["published"]]
assert held and all(s["new_version"] == s["version"] for s in held)
# at most --max-skip steps without a publish
run = 0
for s in st:
    run = 0 if s["published"] else run + 1
    assert run < 3
EOF
if grep -q 'Adaptive publication' "$tmp/r2.html" 2>/dev/null; then pass "the report compares the legs"; else fail "the report compares the legs"; fi

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
