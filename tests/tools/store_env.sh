# Helpers for the store test scripts (sourced, not run): case counting,
# servers started on 127.0.0.1 and always stopped, bounded waits.
# A script sets TEST_NAME, sources this file, and calls finish at the end.

STORE_TOOL=${FERRY_BUILD:-$PWD/build}/tools/store_tool
PY=/usr/bin/python3
S3RVER_JS=$PWD/tests/npm/node_modules/s3rver/bin/s3rver.js
WORK=$(mktemp -d "${TMPDIR:-/tmp}/ferry-store-test.XXXXXX")
PIDS=()
n_ok=0
n_fail=0

cleanup() {
    local p
    for p in "${PIDS[@]}"; do
        kill "$p" 2>/dev/null && wait "$p" 2>/dev/null
    done
    rm -rf "$WORK"
}
trap cleanup EXIT

ok() { n_ok=$((n_ok + 1)); echo "ok   $*"; }
bad() { n_fail=$((n_fail + 1)); echo "FAIL $*"; }
# check NAME COMMAND...: one case, passes when the command succeeds.
check() {
    local name=$1; shift
    if "$@"; then ok "$name"; else bad "$name"; fi
}
# check_rc NAME WANT COMMAND...: passes when the command exits with WANT.
check_rc() {
    local name=$1 want=$2 rc; shift 2
    "$@"; rc=$?
    if [ "$rc" -eq "$want" ]; then ok "$name"; else bad "$name (exit $rc, want $want)"; fi
}
finish() {
    echo "$n_ok passed, $n_fail failed"
    [ "$n_fail" -eq 0 ]
}
skip_all() {
    echo "skipped: $*"
    echo "0 passed, 0 failed, 1 skipped"
    exit 0
}

# A core-only build (make NO_NET=1) has a store_tool that exits 77.
store_built() {
    [ -x "$STORE_TOOL" ] || return 1
    "$STORE_TOOL" >/dev/null 2>&1
    [ $? -ne 77 ]
}

# Runs the tool with a hard time limit (no test may hang); exported for
# the "bash -c" of compound checks.
tool() { timeout 60 "$STORE_TOOL" "$@"; }
export STORE_TOOL
export -f tool

# wait_for FILE REGEX [TENTHS]: until a line of FILE matches (default 10 s).
wait_for() {
    local i
    for ((i = 0; i < ${3:-100}; i++)); do
        grep -qE "$2" "$1" 2>/dev/null && return 0
        sleep 0.1
    done
    echo "timed out waiting for /$2/ in $1:" >&2
    tail -n 20 "$1" >&2
    return 1
}

free_port() {
    $PY -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# start_s3rver DIR PORT LOG: s3rver 3.7.1 with bucket "bkt"; sets S3RVER_PID.
# --openssl-legacy-provider: s3rver encrypts its ListObjectsV2 continuation
# tokens with DES, which Node >= 17 (OpenSSL 3) refuses without it.
start_s3rver() {
    local legacy=--openssl-legacy-provider
    [ "$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0)" -ge 17 ] || legacy=
    node $legacy "$S3RVER_JS" -d "$1" -a 127.0.0.1 -p "$2" --configure-bucket bkt >"$3" 2>&1 &
    S3RVER_PID=$!
    PIDS+=("$S3RVER_PID")
    wait_for "$3" "S3rver listening" 150
}
stop_pid() {
    kill "$1" 2>/dev/null
    wait "$1" 2>/dev/null
    return 0
}

# s3rver 3.7.1 crashes (unhandled ENOENT on a WriteStream) when a DELETE
# removes the last object of a "directory", and with it the directory,
# while a PUT into that directory opens its file: exactly what a trainer
# deleting consumed batches of version V does while islands put more of V.
# start_s3rver_watchdog DIR PORT LOG (after start_s3rver) restarts it on the
# same port and data; clients' retries carry their requests over the gap.
# Restarts are counted in $WORK/restarts and printed, not hidden;
# stop_s3rver_watchdog ends it (also from the EXIT trap it installs).
start_s3rver_watchdog() {
    local dir=$1 port=$2 log=$3
    (
        local pid=$S3RVER_PID n=0
        echo "$pid" >"$WORK/s3rver.pid"
        while [ ! -e "$WORK/stop-watchdog" ]; do
            if ! kill -0 "$pid" 2>/dev/null; then
                n=$((n + 1))
                echo "$n" >"$WORK/restarts"
                grep -m1 -E '^(Error|TypeError)' "$log" >>"$WORK/crashes" 2>/dev/null
                cp "$log" "$WORK/s3rver.crash$n.log"
                start_s3rver "$dir" "$port" "$log" || exit 1
                pid=$S3RVER_PID
                echo "$pid" >"$WORK/s3rver.pid"
            fi
            sleep 0.1
        done
    ) &
    WATCHDOG_PID=$!
    PIDS+=("$WATCHDOG_PID")
    trap 'stop_s3rver_watchdog; cleanup' EXIT
}
stop_s3rver_watchdog() {
    touch "$WORK/stop-watchdog"
    [ -n "${WATCHDOG_PID:-}" ] && wait "$WATCHDOG_PID" 2>/dev/null
    local p
    p=$(cat "$WORK/s3rver.pid" 2>/dev/null)
    [ -n "$p" ] && [ "$p" != "$S3RVER_PID" ] && stop_pid "$p"
    return 0
}

# start_strict KEY SECRET [ARGS...]: tests/tools/s3_strict_server.py with
# bucket "bkt" on a free 127.0.0.1 port (its log in $WORK/server.*); sets
# PORT and EP.  A server that does not start fails the script.  Then
# strict_stat NAME prints one of its counters, strict_ctl QUERY sets its
# fault injection (GET /__ctl?QUERY).
start_strict() {
    local key=$1 secret=$2
    shift 2
    $PY tests/tools/s3_strict_server.py --bucket bkt --access-key "$key" --secret-key "$secret" "$@" \
        >"$WORK/server.out" 2>"$WORK/server.err" &
    PIDS+=($!)
    if ! wait_for "$WORK/server.out" '^listening [0-9]+' 100; then
        cat "$WORK/server.err"
        echo "0 passed, 1 failed"
        exit 1
    fi
    PORT=$(awk '/^listening/ {print $2}' "$WORK/server.out")
    EP=http://127.0.0.1:$PORT
}
strict_stat() { curl -s "$EP/__stats" | $PY -c "import json,sys; print(json.load(sys.stdin)['$1'])"; }
strict_ctl() { curl -s "$EP/__ctl?$1" >/dev/null; }
