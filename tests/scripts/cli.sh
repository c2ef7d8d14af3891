#!/usr/bin/env bash
# End-to-end checks of the ferry command-line tool ($FERRY_BIN, default
# build/ferry; checkpoints from $FERRY_DATA, default ../shared/data):
#   - help and usage: `--help` of the tool and of every command it lists
#     exits 0 and prints usage on stdout; an unknown command or option, or
#     missing arguments, exit non-zero with one line on stderr;
#   - diff / apply round trips (golden pair, an rl-b pair) give an OUT whose
#     tensors and metadata equal NEW's, compared byte-wise by an independent
#     safetensors reader (python3 stdlib) and by `ferry stats --json`;
#   - `ferry diff` on the golden pair writes exactly tests/golden/ab.patch;
#   - apply with a wrong base exits non-zero, says "base" on stderr, and
#     leaves no output file and no temporary file; every must-fail patch of
#     tests/golden-errors/patch fails the same clean way; an existing OUT is
#     left untouched by a failed apply;
#   - every --json output is valid JSON.
# Prints "N passed, N failed" last and exits non-zero on any failure.
set -u
cd "$(dirname "$0")/../.."
FERRY=${FERRY_BIN:-$PWD/build/ferry}
DATA=${FERRY_DATA:-../shared/data}
PY=/usr/bin/python3; [ -x "$PY" ] || PY=python3
G=tests/golden
passed=0 failed=0 skipped=0
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

pass() { passed=$((passed + 1)); echo "ok   $1"; }
skip() { skipped=$((skipped + 1)); echo "skip $1"; }
fail() { failed=$((failed + 1)); echo "FAIL $1"; [ -s "$tmp/log" ] && sed 's/^/    | /' "$tmp/log" | tail -n 15; }
# check NAME COMMAND...: passes when the command succeeds
check() {
    local name=$1; shift
    if "$@" >"$tmp/log" 2>&1; then pass "$name"; else fail "$name"; fi
}

if [ ! -x "$FERRY" ]; then
    echo "FAIL $FERRY is not built (make cli)"
    echo "0 passed, 1 failed"; exit 1
fi

# runs ferry with stdout/stderr captured in $tmp/out, $tmp/err; sets rc
run() { "$FERRY" "$@" >"$tmp/out" 2>"$tmp/err"; rc=$?; }
lines() { wc -l <"$1" | tr -d ' '; }

# A usage error: non-zero, nothing on stdout, exactly one line on stderr.
usage_error() { # description, args...
    local name=$1; shift
    run "$@"
    if [ "$rc" -ne 0 ] && [ ! -s "$tmp/out" ] && [ "$(lines "$tmp/err")" = 1 ]; then pass "$name"
    else { echo "exit $rc, stdout:"; cat "$tmp/out"; echo "stderr:"; cat "$tmp/err"; } >"$tmp/log"; fail "$name"; fi
}

# A failed apply: non-zero, a message, no OUT, nothing else left in its directory.
apply_fails_clean() { # description, base, patch, [stderr word]
    local name=$1 base=$2 patch=$3 word=${4:-}
    local dir="$tmp/outdir"; rm -rf "$dir"; mkdir "$dir"
    run apply "$base" "$patch" -o "$dir/out.safetensors"
    local left; left=$(ls -A "$dir")
    if [ "$rc" -ne 0 ] && [ -s "$tmp/err" ] && [ -z "$left" ] && { [ -z "$word" ] || grep -qi -- "$word" "$tmp/err"; }; then
        pass "$name"
    else
        { echo "exit $rc; left in the output directory: '${left}'; stderr:"; cat "$tmp/err"; } >"$tmp/log"; fail "$name"
    fi
}

# Byte-wise equality of the tensors (names, dtypes, shapes, bytes) and the
# metadata of two safetensors files, read independently of ferry.
same_tensors() { # a b
    "$PY" - "$1" "$2" <<'EOF'
import json, struct, sys
def load(path):
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    head = json.loads(blob[8:8 + n])
    meta = head.pop("__metadata__", {})
    data = blob[8 + n:]
    return meta, {k: (v["dtype"], v["shape"], data[v["data_offsets"][0]:v["data_offsets"][1]]) for k, v in head.items()}
(ma, ta), (mb, tb) = load(sys.argv[1]), load(sys.argv[2])
bad = sorted(k for k in set(ta) | set(tb) if ta.get(k) != tb.get(k))
if ma != mb: print("metadata differs:", ma, mb); sys.exit(1)
if bad: print("tensors differ:", bad[:10]); sys.exit(1)
print(len(ta), "tensors equal")
EOF
}

valid_json() { "$PY" -m json.tool "$1" >/dev/null; }

# `ferry stats NEW OUT --json` reports no changed element.
stats_unchanged() { # new out
    "$FERRY" stats "$1" "$2" --json >"$tmp/stats.json" || return 1
    "$PY" -c 'import json,sys; s=json.load(open(sys.argv[1])); sys.exit(0 if s["changed"] == 0 and s["elements"] > 0 else 1)' "$tmp/stats.json"
}

# ---------------------------------------------------------------- help
run --help
check "ferry --help exits 0 with usage" test "$rc" -eq 0 -a -n "$(grep -m1 '^usage: ferry' "$tmp/out")"
cmds=$(awk '/^commands:/{on=1; next} on && /^  [a-z]/{print $1} on && /^$/{on=0}' "$tmp/out")
check "ferry --help lists commands" test -n "$cmds"
run -h
check "ferry -h exits 0" test "$rc" -eq 0 -a -s "$tmp/out"
run --version
check "ferry --version exits 0" test "$rc" -eq 0 -a -n "$(grep -m1 'ferry [0-9]' "$tmp/out")"
for c in $cmds; do
    run "$c" --help
    check "ferry $c --help exits 0 with usage" test "$rc" -eq 0 -a -n "$(grep -m1 "^usage: ferry $c" "$tmp/out")"
    usage_error "ferry $c --no-such-option: one line on stderr" "$c" --no-such-option
done
run
check "ferry without a command exits non-zero" test "$rc" -ne 0 -a -s "$tmp/err"
usage_error "unknown command: one line on stderr" no-such-command
usage_error "diff without -o: one line on stderr" diff "$G/a.safetensors" "$G/b.safetensors"
usage_error "apply with one argument: one line on stderr" apply "$G/a.safetensors"
usage_error "inspect with two arguments: one line on stderr" inspect "$G/ab.patch" "$G/ab.patch"
usage_error "stats with one argument: one line on stderr" stats "$G/a.safetensors"
# a patch given to stats is named as one (issue 27: it reported a header length)
usage_error "stats PATCH PATCH: one line on stderr" stats "$G/ab.patch" "$G/ab.patch"
check "stats PATCH PATCH: says it is a patch and to use inspect" grep -q "this is a patch.*inspect" "$tmp/err"
usage_error "stats OLD PATCH: one line on stderr" stats "$G/a.safetensors" "$G/ab.patch"
check "stats OLD PATCH: names the patch" grep -q "ab.patch: this is a patch" "$tmp/err"
usage_error "diff --level 99: one line on stderr" diff "$G/a.safetensors" "$G/b.safetensors" -o "$tmp/x.patch" --level 99

# ---------------------------------------------------------------- round trips
round_trip() { # label old new
    local label=$1 old=$2 new=$3 p="$tmp/$1.patch" out="$tmp/$1.out.safetensors"
    if [ ! -f "$old" ] || [ ! -f "$new" ]; then skip "$label: shared data $old or $new missing (set FERRY_DATA)"; return; fi
    check "$label: diff --json" sh -c '"$0" diff "$1" "$2" -o "$3" --json >"$4"' "$FERRY" "$old" "$new" "$p" "$tmp/diff.json"
    check "$label: diff --json is valid JSON" valid_json "$tmp/diff.json"
    check "$label: apply --json" sh -c '"$0" apply "$1" "$2" -o "$3" --json >"$4"' "$FERRY" "$old" "$p" "$out" "$tmp/apply.json"
    check "$label: apply --json is valid JSON" valid_json "$tmp/apply.json"
    check "$label: OUT's tensors and metadata equal NEW's (byte-wise)" same_tensors "$new" "$out"
    check "$label: ferry stats NEW OUT --json: 0 changed" stats_unchanged "$new" "$out"
    check "$label: inspect --json is valid JSON" sh -c '"$0" inspect "$1" --json >"$2" && "$3" -m json.tool "$2" >/dev/null' \
        "$FERRY" "$p" "$tmp/inspect.json" "$PY"
    check "$label: inspect (text) exits 0" "$FERRY" inspect "$p"
    check "$label: stats --json is valid JSON" sh -c '"$0" stats "$1" "$2" --json >"$3" && "$4" -m json.tool "$3" >/dev/null' \
        "$FERRY" "$old" "$new" "$tmp/stats2.json" "$PY"
    check "$label: stats (text) exits 0" "$FERRY" stats "$old" "$new"
}
round_trip golden "$G/a.safetensors" "$G/b.safetensors"
check "golden: ferry diff writes exactly tests/golden/ab.patch" cmp "$tmp/golden.patch" "$G/ab.patch"
round_trip golden-back "$G/b.safetensors" "$G/a.safetensors"
round_trip rl-b "$DATA/rl-b/step-000.safetensors" "$DATA/rl-b/step-001.safetensors"
round_trip rl-a-far "$DATA/rl-a/step-000.safetensors" "$DATA/rl-a/step-008.safetensors"
check "inspect --json: format 1..3, totals consistent with the tensor list" "$PY" -c \
    'import json,sys; d=json.load(open(sys.argv[1])); t=d["totals"]; sys.exit(0 if t["changed"] > 0 and d["format"] in (1, 2, 3) and len(d["tensors"]) == t["tensors"] else 1)' \
    "$tmp/inspect.json"

# ---------------------------------------------------------------- failures
apply_fails_clean "apply with a wrong base: non-zero, says 'base', no output, no temp file" \
    "$G/b.safetensors" "$G/ab.patch" base
if [ -f "$DATA/rl-b/step-002.safetensors" ] && [ -f "$tmp/rl-b.patch" ]; then
    apply_fails_clean "apply of rl-b patch to another step: says 'base', nothing left" \
        "$DATA/rl-b/step-002.safetensors" "$tmp/rl-b.patch" base
else
    skip "apply of rl-b patch to another step: shared data $DATA/rl-b missing (set FERRY_DATA)"
fi
apply_fails_clean "apply of a missing patch file fails cleanly" "$G/a.safetensors" "$tmp/no-such.patch"
apply_fails_clean "apply of a safetensors file as a patch fails cleanly" "$G/a.safetensors" "$G/b.safetensors"
n=0
for f in tests/golden-errors/patch/*.patch; do
    [ -f "$f" ] || continue
    n=$((n + 1))
    apply_fails_clean "must-fail $(basename "$f"): apply fails, nothing left" "$G/a.safetensors" "$f"
done
check "must-fail patches found" test "$n" -ge 70
usage_error "inspect of a must-fail patch: one line on stderr" inspect tests/golden-errors/patch/13-bitflip-table.PATCH_CHECKSUM.patch

# An existing OUT survives a failed apply, bit for bit, with nothing beside it.
keep="$tmp/keep"; mkdir -p "$keep"
printf 'precious bytes\n' >"$keep/out.safetensors"; cp "$keep/out.safetensors" "$tmp/precious"
run apply "$G/b.safetensors" "$G/ab.patch" -o "$keep/out.safetensors"
check "failed apply (wrong base) leaves an existing OUT untouched" \
    sh -c 'test "$0" -ne 0 && cmp "$1" "$2" && test "$(ls -A "$3")" = out.safetensors' "$rc" "$tmp/precious" "$keep/out.safetensors" "$keep"
run apply "$G/a.safetensors" tests/golden-errors/patch/82-wrong-target-tensor-hash.TARGET_MISMATCH.patch -o "$keep/out.safetensors"
check "failed apply (target mismatch) leaves an existing OUT untouched" \
    sh -c 'test "$0" -ne 0 && cmp "$1" "$2" && test "$(ls -A "$3")" = out.safetensors' "$rc" "$tmp/precious" "$keep/out.safetensors" "$keep"
run apply "$G/a.safetensors" "$G/ab.patch" -o "$keep/out.safetensors"
check "a successful apply replaces OUT, nothing left beside it" \
    sh -c 'test "$0" -eq 0 && test "$(ls -A "$1")" = out.safetensors' "$rc" "$keep"
check "... and OUT is b" same_tensors "$G/b.safetensors" "$keep/out.safetensors"
run diff "$G/a.safetensors" "$G/b.safetensors" -o "$tmp/no-such-dir/p.patch"
check "diff into a missing directory fails with a message" test "$rc" -ne 0 -a -s "$tmp/err"
run diff "$G/a.safetensors" tests/golden-errors/safetensors/17-unknown-dtype.ST_DTYPE.safetensors -o "$tmp/bad.patch"
check "diff of a malformed checkpoint fails, writes nothing" test "$rc" -ne 0 -a -s "$tmp/err" -a ! -e "$tmp/bad.patch"

echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
