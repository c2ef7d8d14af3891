# Helpers for the sync test scripts (sourced, not run), on top of
# store_env.sh (case counting, WORK, servers started on 127.0.0.1 and always
# stopped, bounded waits): the ferry CLI and sync_tool with hard time
# limits, the S3 environment for s3rver, and checks on pulled checkpoints.
# A script sets TEST_NAME, sources this file, and calls finish at the end.

source tests/tools/store_env.sh

FERRY=${FERRY_BIN:-$PWD/build/ferry}
SYNC_TOOL=${FERRY_BUILD:-$PWD/build}/tools/sync_tool
DATA=${FERRY_DATA:-../shared/data}

# No command may hang: each runs under a time limit.
fy() { timeout 120 "$FERRY" "$@"; }
st() { timeout 120 "$SYNC_TOOL" "$@"; }
export FERRY SYNC_TOOL
export -f fy st

sync_built() {
    [ -x "$FERRY" ] && [ -x "$SYNC_TOOL" ] || return 1
    "$SYNC_TOOL" >/dev/null 2>&1
    [ $? -ne 77 ]
}

# s3_env PORT: credentials and endpoint for s3rver on 127.0.0.1:PORT (for
# ferry, sync_tool and the AWS CLI alike); no stray configuration is read.
s3_env() {
    export AWS_ACCESS_KEY_ID=S3RVER AWS_SECRET_ACCESS_KEY=S3RVER AWS_REGION=us-east-1 AWS_DEFAULT_REGION=us-east-1
    export AWS_ENDPOINT_URL=http://127.0.0.1:$1
    export AWS_CONFIG_FILE=$WORK/none AWS_SHARED_CREDENTIALS_FILE=$WORK/none AWS_EC2_METADATA_DISABLED=true
    unset AWS_SESSION_TOKEN AWS_ENDPOINT_URL_S3 AWS_PROFILE
}

# s3_rla_start: the preamble of the s3:// scripts on the rl-a sequence:
# skips without node, s3rver, the sync layer or the data; else starts
# s3rver on a free port with its data in $WORK/data (PORT is set) and
# exports the S3 environment; a server that does not start fails the script.
s3_rla_start() {
    command -v node >/dev/null || skip_all "node is not installed"
    [ -f "$S3RVER_JS" ] || skip_all "s3rver is not installed (scripts/install-deps.sh runs npm install in tests/npm)"
    sync_built || skip_all "sync layer or tools not built (NO_NET=1?)"
    [ -f "$DATA/rl-a/step-008.safetensors" ] || skip_all "no rl-a data in $DATA"
    PORT=$(free_port)
    mkdir -p "$WORK/data"
    start_s3rver "$WORK/data" "$PORT" "$WORK/s3rver.log" || { echo "0 passed, 1 failed"; exit 1; }
    s3_env "$PORT"
}

# same_tensors A B: every tensor of B is bit-identical to A's (ferry stats).
same_tensors() {
    local out
    out=$(fy stats "$1" "$2" --json 2>/dev/null) || return 1
    grep -q '"changed": 0,' <<<"${out:0:200}"
}

# same_model A B: equal model hashes (tensors, dtypes, shapes, metadata).
same_model() {
    local a b
    a=$(st hash "$1") && b=$(st hash "$2") && [ -n "$a" ] && [ "$a" = "$b" ]
}

# random_us MAX: a random delay in microseconds below MAX, as seconds for sleep.
random_us() {
    printf '0.%06d' $(( (RANDOM * 32768 + RANDOM) % $1 ))
}
