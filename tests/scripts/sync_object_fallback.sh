#!/usr/bin/env bash
# Fallback that refetches only what failed (issue 26 item 5): an island
# pulling a route from a mirror with --fallback ORIGIN, where one object of
# the route is corrupt in the mirror, fetches that object again from the
# origin and keeps the rest of its route (before: the whole route again
# from the origin, or an anchor in its place).  Deltas, an anchor and a
# manifest, unsigned and signed; every object corrupt on every store is
# still refused with both stores named.
set -u
TEST_NAME=sync_object_fallback
source tests/tools/sync_env.sh
sync_built || skip_all "sync layer or tools not built (NO_NET=1?)"

st gen "$WORK/m" 10 200000 3 >/dev/null || { bad "generate models"; finish; exit 1; }
model() { printf '%s/m/m-%03d.safetensors' "$WORK" "$1"; }
jfield() { sed -E "s/.*\"$1\": *([0-9]+).*/\1/" <<<"$2"; }
flip() { printf '\xff' | dd of="$1" bs=1 seek="$2" conv=notrunc status=none; }
size() { stat -c %s "$1"; }
vobj() { ls "$1"/r/v/"$(printf '%020d' "$2")"-*."$3"; } # store, version, ext

fy keygen -o "$WORK/k" >/dev/null || bad "keygen"
for mode in unsigned signed; do
    O=$WORK/$mode-origin M=$WORK/$mode-mirror I=$WORK/$mode-island.safetensors
    sign=() trust=()
    [ $mode = signed ] && sign=(--sign-key "$WORK/k.key") trust=(--trust-key "$WORK/k.pub")
    for i in 0 1 2 3 4 5 6 7; do
        fy publish "$O" --run r "$(model $i)" --anchor-every 100 -q "${sign[@]}" || bad "$mode: publish $i"
    done
    fy mirror "$O" "$M" --run r -q "${trust[@]}" || bad "$mode: mirror"
    fy pull "$M" --run r --to "$I" -q --exact-version 2 "${trust[@]}" || bad "$mode: island at 2"

    # the route 3..8 from the mirror, version 5's delta corrupt there
    d=$(vobj "$M" 5 patch)
    flip "$d" $(($(size "$d") / 2))
    out=$(fy pull "$M" --run r --to "$I" --fallback "$O" --json "${trust[@]}" 2>"$WORK/err")
    check "$mode: a corrupt delta in the mirror: the island reaches version 8" same_model "$(model 7)" "$I"
    check "$mode: ... and says that 1 object came from the fallback" grep -q "1 object served by the fallback" "$WORK/err"
    route=0
    for v in 3 4 5 6 7 8; do route=$((route + $(size "$(vobj "$O" $v patch)"))); done
    extra=$(size "$(vobj "$O" 5 patch)")
    got=$(jfield bytes_fetched "$out")
    # the deltas once, the bad one twice, plus the manifests and HEAD (< 16 KB)
    check "$mode: ... fetching the route once and the bad delta again ($got <= $route + $extra + 16384)" \
        test "$got" -le $((route + extra + 16384))
    check "$mode: ... not the whole route again ($got < 2 x $route)" test "$got" -lt $((2 * route))

    # a fresh island, the anchor corrupt in the mirror: the anchor from the
    # origin, the chain after it from the mirror
    a=$(vobj "$M" 1 safetensors)
    flip "$a" $(($(size "$a") - 100))
    out=$(fy pull "$M" --run r --to "$WORK/$mode-fresh.safetensors" --fallback "$O" --json "${trust[@]}")
    check "$mode: a corrupt anchor in the mirror: a fresh island reaches version 8" same_model "$(model 7)" "$WORK/$mode-fresh.safetensors"
    got=$(jfield bytes_fetched "$out")
    full=$(size "$(vobj "$O" 1 safetensors)")
    all=$((full + route + $(size "$(vobj "$O" 2 patch)")))
    check "$mode: ... the anchor twice, the rest once ($got <= $all + $full + 32768)" test "$got" -le $((all + full + 32768))

    # every copy of one object corrupt: refused, naming both stores
    flip "$(vobj "$O" 5 patch)" $(($(size "$d") / 2))
    err=$(fy pull "$M" --run r --to "$WORK/$mode-none.safetensors" --fallback "$O" "${trust[@]}" 2>&1 >/dev/null)
    check "$mode: the delta corrupt on both stores: refused" test ! -e "$WORK/$mode-none.safetensors" -o -n "$err"
    check "$mode: ... the message names the origin" grep -q "$O" <<<"$err"
done
finish
