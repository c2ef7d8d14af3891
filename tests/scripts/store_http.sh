#!/usr/bin/env bash
# http:// read-only backend against Python's http.server serving a
# directory (a stand-in for a CDN or a static server: no ETag, no Range).
set -u
TEST_NAME=store_http
source tests/tools/store_env.sh

[ -x "$STORE_TOOL" ] || { echo "missing $STORE_TOOL (make tests)"; echo "0 passed, 1 failed"; exit 1; }
store_built || skip_all "store layer not built (NO_NET=1)"
mkdir -p "$WORK/www/v1/sub dir"
head -c 300000 /dev/urandom >"$WORK/www/v1/blob.bin"
echo "pointer 1" >"$WORK/www/v1/latest"
echo "spaced" >"$WORK/www/v1/sub dir/a+b.txt"
(cd "$WORK/www" && exec $PY -u -m http.server --bind 127.0.0.1 0) >"$WORK/http.log" 2>&1 &
PIDS+=($!)
wait_for "$WORK/http.log" 'port [0-9]+' 100 || { echo "0 passed, 1 failed"; exit 1; }
PORT=$(sed -nE 's/.*port ([0-9]+).*/\1/p' "$WORK/http.log" | head -n 1)
U="http://127.0.0.1:$PORT/v1"
H="tool --deadline-ms 10000"

check "get" bash -c "$H $U get latest - | grep -qx 'pointer 1'"
$H "$U/" get blob.bin "$WORK/blob"
check "get of a binary object (base URL with a trailing slash)" cmp -s "$WORK/www/v1/blob.bin" "$WORK/blob"
check "key with a space and a plus (URL-encoded)" bash -c "$H $U get 'sub dir/a+b.txt' - | grep -qx spaced"
check "head: size" bash -c "[ \"\$($H $U head blob.bin | cut -d' ' -f1)\" = 300000 ]"
check "head: mtime from Last-Modified" bash -c "[ \"\$($H $U head blob.bin | cut -d' ' -f3)\" -gt 1500000000 ]"
$H "$U" range blob.bin 123456 1000 >"$WORK/r"
check "range from a server that ignores Range" cmp -s <(tail -c +123457 "$WORK/www/v1/blob.bin" | head -c 1000) "$WORK/r"
$H "$U" range blob.bin 299990 100 >"$WORK/r2"
check "range running past the end is short" [ "$(stat -c %s "$WORK/r2")" = 10 ]
check_rc "range past the end: FERRY_ERR_STORE_RANGE" 70 $H "$U" range blob.bin 300001 10
$H "$U" getfile blob.bin "$WORK/blob2"
check "get_file" cmp -s "$WORK/www/v1/blob.bin" "$WORK/blob2"
check_rc "missing object: FERRY_ERR_STORE_NOT_FOUND" 62 $H "$U" get nothing/here -
check_rc "put: FERRY_ERR_STORE_READONLY" 68 $H "$U" put x "$WORK/www/v1/latest"
check_rc "delete: read-only" 68 $H "$U" rm latest
check_rc "cas: read-only" 68 $H "$U" cas latest - "$WORK/www/v1/latest"
check_rc "list: FERRY_ERR_UNSUPPORTED" 4 $H "$U" ls
check_rc "hostile key refused before any request" 61 $H "$U" get ../../etc/passwd -
check_rc "max size: FERRY_ERR_LIMIT" 6 $H --max-size 1000 "$U" get blob.bin -
check_rc "bad URL" 60 $H "http://" get x -
check_rc "nothing listening: timeout" 65 tool --deadline-ms 800 "http://127.0.0.1:$(free_port)/x" get y -

finish
