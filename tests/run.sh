#!/usr/bin/env bash
# Runs every test program and script; prints each one's result and ends with
# the total line "N passed, N failed, N skipped" (CI matches its start).  Each
# C test binary reports its own case counts; a script counts as one case
# unless it prints its own counts ("N passed, N failed[, N skipped]").  A
# skip (e.g. the shared data is missing) is neither a pass nor a failure.
set -u
BUILD=${BUILD:-build}
export FERRY_DATA=${FERRY_DATA:-../shared/data}
export FERRY_BIN="$PWD/$BUILD/ferry" FERRY_BUILD="$PWD/$BUILD"
passed=0; failed=0; skipped=0
logdir=$(mktemp -d); trap 'rm -rf "$logdir"' EXIT

run_one() { # name, command...
    local name=$1; shift
    local log="$logdir/$(basename "$name").log"
    local t0=$SECONDS
    "$@" >"$log" 2>&1; local rc=$?
    local line p f s=0
    line=$(grep -E '^([A-Za-z0-9_]+: )?[0-9]+ passed, [0-9]+ failed' "$log" | tail -n 1)
    if [ -n "$line" ]; then
        p=$(sed -E 's/^([A-Za-z0-9_]+: )?([0-9]+) passed.*/\2/' <<<"$line")
        f=$(sed -E 's/^([A-Za-z0-9_]+: )?[0-9]+ passed, ([0-9]+) failed.*/\2/' <<<"$line")
        if [[ $line =~ ", "([0-9]+)" skipped" ]]; then s=${BASH_REMATCH[1]}; fi
        if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi
    elif [ "$rc" -eq 0 ]; then p=1; f=0; else p=0; f=1; fi
    passed=$((passed + p)); failed=$((failed + f)); skipped=$((skipped + s))
    local skips=""
    [ "$s" -eq 0 ] || skips=", $s skipped"
    if [ "$f" -eq 0 ]; then
        printf '%-40s %4d passed%s  (%ds)\n' "$name" "$p" "$skips" $((SECONDS - t0))
        [ "$s" -eq 0 ] || grep -E '^skip ' "$log" | sed 's/^/    | /' | head -n 20
    else
        printf '%-40s %4d passed, %d FAILED%s (exit %d)\n' "$name" "$p" "$f" "$skips" "$rc"
        sed 's/^/    | /' "$log" | tail -n 40
    fi
}

for t in "$BUILD"/tests/test_*; do
    [ -x "$t" ] && run_one "$(basename "$t")" "$t"
done
for r in "$BUILD"/tests/replay_*; do
    [ -x "$r" ] || continue
    target=${r##*/replay_}
    run_one "fuzz-replay:$target" "$r" "tests/fuzz/corpus/$target"
done
for s in tests/scripts/*.sh; do
    [ -f "$s" ] || continue
    run_one "$(basename "$s")" bash "$s"
done
if [ -d tests/python ]; then
    for p in tests/python/test_*.py; do
        [ -f "$p" ] || continue
        run_one "$(basename "$p")" /usr/bin/python3 "$p"
    done
fi
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
