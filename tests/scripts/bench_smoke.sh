#!/usr/bin/env bash
# Smoke test of bench/codec on one small pair (rl-b step 000 -> 001): it must
# exit 0, ferry's apply must hash to NEW, and each peer format (trl, pulse,
# skyrl, slime) and generic baseline (zstd, xdelta3) must round-trip to NEW.
# Also: the checks must bite: a bit flipped in a peer's patch (--corrupt) and
# a pair of two different models must each make it exit non-zero.
# Prints "N passed, N failed"; builds the bench program if it is missing.
set -u
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
FERRY_BUILD=${FERRY_BUILD:-$PWD/$BUILD}
FERRY_DATA=${FERRY_DATA:-../shared/data}
codec="$FERRY_BUILD/bench/codec"
old="$FERRY_DATA/rl-b/step-000.safetensors"
new="$FERRY_DATA/rl-b/step-001.safetensors"
other="$FERRY_DATA/rl-a/step-001.safetensors"
passed=0; failed=0
check() { # name, condition-result (0 = pass)
    if [ "$2" -eq 0 ]; then passed=$((passed + 1)); echo "ok    $1"
    else failed=$((failed + 1)); echo "FAIL  $1"; fi
}

if [ ! -f "$old" ] || [ ! -f "$new" ]; then
    echo "bench_smoke: data not found under $FERRY_DATA (set FERRY_DATA)" >&2
    echo "0 passed, 1 failed"
    exit 1
fi
if [ ! -x "$codec" ] || [ "$FERRY_BUILD/libferry.a" -nt "$codec" ]; then
    make --no-print-directory -s BUILD="$BUILD" SAN="${SAN:-}" "$BUILD/bench/codec" >&2
fi
if [ ! -x "$codec" ]; then
    echo "bench_smoke: $codec could not be built" >&2
    echo "0 passed, 1 failed"
    exit 1
fi

tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
formats="ferry trl pulse skyrl slime zstd xdelta3"
generic=""
if ! command -v zstd >/dev/null || ! command -v xdelta3 >/dev/null; then
    echo "bench_smoke: zstd or xdelta3 not installed: skipping the generic baselines" >&2
    generic="--no-generic"; formats="ferry trl pulse skyrl slime"
fi

"$codec" --reps 1 $generic --json "$tmp/out.json" "$old" "$new" >"$tmp/stdout" 2>"$tmp/stderr"
rc=$?
check "codec exits 0 on rl-b 000->001" $rc
[ $rc -eq 0 ] || sed 's/^/    | /' "$tmp/stderr"
line=$(grep -E '^codec: rl-b:000->001:' "$tmp/stderr" | head -n 1)
for f in $formats; do
    grep -qE "(^|: | )$f ok( |$)" <<<"$line"; check "$f round-trips to NEW" $?
done
grep -q '"ferry_over_min_peer"' "$tmp/out.json" 2>/dev/null; check "JSON written with the ratios" $?
grep -qE '^rl-b:000->001 +[0-9]+ +[0-9.]+% +[0-9]+ +[0-9]+' "$tmp/stdout"; check "table row printed" $?

"$codec" --reps 1 --no-generic "$old" "$other" >"$tmp/stdout2" 2>"$tmp/stderr2"
rc=$?
[ $rc -ne 0 ] && grep -q "the peer formats need the same tensors" "$tmp/stderr2"
check "different models: non-zero exit and a clear line" $?

for p in trl pulse skyrl slime; do
    "$codec" --reps 1 --no-generic --corrupt "$p" "$old" "$new" >/dev/null 2>"$tmp/stderr3"
    rc=$?
    [ $rc -ne 0 ] && grep -q ": $p: round-trip failed" "$tmp/stderr3"
    check "a corrupted $p patch is caught" $?
done

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
