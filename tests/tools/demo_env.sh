# Sourced by the demo's test scripts (from the repository root): DEMO, the
# ferry-demo binary (examples/rl/demo) of the build under test.  A core
# build (NO_NET=1: its ferry has no `publish`) has no demo, and the script
# ends as skipped; any other build lacking it fails.
DEMO=${FERRY_BUILD:-$PWD/build}/ferry-demo
if [ ! -x "$DEMO" ]; then
    if [ -x "${FERRY_BIN:-}" ] && ! "$FERRY_BIN" --help 2>/dev/null | grep -qE '^ +publish '; then
        echo "skipped: a core build (NO_NET=1) has no demo"; echo "0 passed, 0 failed"; exit 0
    fi
    echo "FAIL $DEMO is not built (make examples)"; echo "0 passed, 1 failed"; exit 1
fi
