#!/usr/bin/env bash
# An https:// store never follows a redirect to plain http:// (review of
# issue 16: the CDN-style http(s) backend followed any redirect, so an
# https store could be downgraded to cleartext).  A TLS server on loopback
# (Python's ssl module, a self-signed certificate made here and pinned with
# --ca-file) serves /v1/obj, redirects /down/* to a plain http server and
# /up/* to its own /v1/*.
set -u
TEST_NAME=store_https_redirect
source tests/tools/store_env.sh

[ -x "$STORE_TOOL" ] || { echo "missing $STORE_TOOL (make tests)"; echo "0 passed, 1 failed"; exit 1; }
store_built || skip_all "store layer not built (NO_NET=1)"
command -v openssl >/dev/null || skip_all "openssl not installed"
openssl req -x509 -newkey rsa:2048 -nodes -keyout "$WORK/key.pem" -out "$WORK/cert.pem" -days 1 \
    -subj /CN=127.0.0.1 -addext subjectAltName=IP:127.0.0.1 >/dev/null 2>&1 || skip_all "openssl cannot make a certificate"
mkdir -p "$WORK/www/v1"
echo "the object" >"$WORK/www/v1/obj"
(cd "$WORK/www" && exec $PY -u -m http.server --bind 127.0.0.1 0) >"$WORK/http.log" 2>&1 &
PIDS+=($!)
wait_for "$WORK/http.log" 'port [0-9]+' 100 || { echo "0 passed, 1 failed"; exit 1; }
HTTP_PORT=$(sed -nE 's/.*port ([0-9]+).*/\1/p' "$WORK/http.log" | head -n 1)
cat >"$WORK/tls.py" <<PYEOF
import http.server, os, ssl, sys
os.chdir(sys.argv[1])
class H(http.server.SimpleHTTPRequestHandler):
    def redirect(self):
        for pre, to in (("/down/", "http://127.0.0.1:$HTTP_PORT/v1/"), ("/up/", "/v1/")):
            if self.path.startswith(pre):
                self.send_response(302)
                self.send_header("Location", to + self.path[len(pre):])
                self.send_header("Content-Length", "0")
                self.end_headers()
                return True
        return False
    def do_GET(self):
        if not self.redirect(): super().do_GET()
    def do_HEAD(self):
        if not self.redirect(): super().do_HEAD()
srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain("$WORK/cert.pem", "$WORK/key.pem")
srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
print("port", srv.server_address[1], flush=True)
srv.serve_forever()
PYEOF
$PY -u "$WORK/tls.py" "$WORK/www" >"$WORK/tls.log" 2>&1 &
PIDS+=($!)
wait_for "$WORK/tls.log" 'port [0-9]+' 100 || { echo "0 passed, 1 failed"; exit 1; }
TLS_PORT=$(sed -nE 's/.*port ([0-9]+).*/\1/p' "$WORK/tls.log" | head -n 1)
H="tool --deadline-ms 10000 --max-attempts 2 --ca-file $WORK/cert.pem"
S="https://127.0.0.1:$TLS_PORT"

check "https: direct get" bash -c "$H $S/v1 get obj - | grep -qx 'the object'"
check "https -> https redirect is followed" bash -c "$H $S/up get obj - | grep -qx 'the object'"
check "plain http store still follows its redirects" bash -c "tool --deadline-ms 10000 http://127.0.0.1:$HTTP_PORT/v1 get obj - | grep -qx 'the object'"
check_rc "https -> http redirect refused (get): FERRY_ERR_STORE_URL" 60 $H "$S/down" get obj -
check_rc "https -> http redirect refused (head)" 60 $H "$S/down" head obj
check_rc "https -> http redirect refused (get_file)" 60 $H "$S/down" getfile obj "$WORK/out"
check "nothing was written by the refused get_file" bash -c "! ls '$WORK'/out* 2>/dev/null"
check "the plain http server was asked once (by the plain http store)" [ "$(grep -c 'GET /v1/obj' "$WORK/http.log")" = 1 ]
finish
