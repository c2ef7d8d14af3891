#!/usr/bin/env bash
# Subscribers through plain HTTP (an island behind a CDN or a static file
# server in front of the store): a run published to a file:// store is
# served by `python3 -m http.server` on 127.0.0.1 and pulled through
# http:// — latest, exact, min, a compacted delta, the log — which works
# because subscribers never list (HEAD, manifests, the compaction index and
# objects are plain GETs); writes through http:// are refused.
set -u
TEST_NAME=sync_http
source tests/tools/sync_env.sh
sync_built || skip_all "sync layer or tools not built (NO_NET=1?)"
[ -x "$PY" ] || PY=python3

st gen "$WORK/m" 8 40000 3 >/dev/null || { bad "generate models"; finish; exit 1; }
model() { printf '%s/m/m-%03d.safetensors' "$WORK" "$1"; }
mkdir -p "$WORK/store"
for i in $(seq 0 7); do fy publish "$WORK/store" --run r "$(model "$i")" --anchor-every 3 -q || bad "publish $i"; done
fy compact "$WORK/store" --run r --from 4 --to 8 -q || bad "compact"

PORT=$(free_port)
(cd "$WORK/store" && exec $PY -m http.server "$PORT" --bind 127.0.0.1) >"$WORK/http.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 1 100); do
    curl -s -o /dev/null "http://127.0.0.1:$PORT/r/HEAD" && break
    sleep 0.1
done
H=http://127.0.0.1:$PORT
P=$WORK/p.safetensors

check "pull latest over http" fy pull "$H" --run r --to "$P" -q --deadline 10
check "... equals the last model" same_model "$(model 7)" "$P"
check "exact version 4 over http" fy pull "$H" --run r --to "$P" --exact-version 4 -q --deadline 10
check "... equals model 3" same_model "$(model 3)" "$P"
out=$(fy pull "$H" --run r --to "$P" --deadline 10)
check "from 4, the compacted delta 4..8 over http" grep -q "by compacted 4..8" <<<"$out"
check "... equals the last model" same_model "$(model 7)" "$P"
check "the log over http" bash -c "fy log '$H' --run r --json | grep -q '\"head\": 8'"
check "--check over http" fy pull "$H" --run r --to "$P" --check -q --deadline 10
check_rc "publishing to http:// is refused" 1 fy publish "$H" --run r "$(model 0)" -q --deadline 10
finish
