#!/usr/bin/env bash
# The rooms of docs/ARCHITECTURE.md, checked on the built tree:
#   - every global symbol that libferry.a (and libferry_loco.a,
#     libferry_shard_mpi.a where built) defines is public (ferry_*) or
#     internal with the double underscore (ferry__*), so a static link never
#     clashes with a user's own names;
#   - a room includes only the rooms listed above it (the order below), and
#     the core (common, codec, io) includes nothing of the network rooms;
#   - programs/ and examples/ use only the public headers (include/).
# Prints "N passed, N failed" last.
set -u
cd "$(dirname "$0")/../.."
BUILD=${FERRY_BUILD:-$PWD/build}
passed=0 failed=0
pass() { passed=$((passed + 1)); echo "ok   $1"; }
fail() { failed=$((failed + 1)); echo "FAIL $1"; }

# ---- symbols ----
for lib in libferry.a libferry_loco.a libferry_shard_mpi.a; do
    a="$BUILD/$lib"
    if [ ! -f "$a" ]; then
        [ "$lib" = libferry.a ] && fail "$lib is not built" || echo "note $lib not built (no mpicc): not checked"
        continue
    fi
    # (AddressSanitizer's own markers of globals, __odr_asan.NAME, name ours)
    bad=$(nm -g --defined-only "$a" | awk 'NF == 3 { print $3 }' | sed -E 's/^__odr_asan\.//' | grep -v -E '^ferry_' | sort -u)
    if [ -z "$bad" ]; then pass "$lib: every global symbol starts with ferry_"
    else fail "$lib: global symbols outside the ferry namespace:"; sed 's/^/    | /' <<<"$bad" | head -n 40; fi
done

# ---- includes between rooms ----
rooms=(common codec io store sign sync shard mirror dock loco)
rank() { local i; for i in "${!rooms[@]}"; do [ "${rooms[$i]}" = "$1" ] && { echo "$i"; return; }; done; echo -1; }
viol=""
for d in lib/*/; do
    room=$(basename "$d"); r=$(rank "$room")
    [ "$r" -lt 0 ] && { viol+="lib/$room is not a room of docs/ARCHITECTURE.md"$'\n'; continue; }
    while IFS= read -r line; do
        file=${line%%:*}; inc=$(sed -E 's/.*#include "([^"]+)".*/\1/' <<<"${line#*:}")
        case "$inc" in */*) ;; *) continue ;; esac # same room (or include/)
        other=${inc%%/*}; o=$(rank "$other")
        [ "$o" -lt 0 ] && continue
        # loco is the pseudo-gradient room: it uses the core only
        if [ "$room" = loco ] && [ "$o" -gt 2 ]; then viol+="$file includes $inc (loco uses the core only)"$'\n'; continue; fi
        if [ "$o" -ge "$r" ]; then viol+="$file includes $inc (room $other is not above $room)"$'\n'; fi
    done < <(grep -n '#include "' "$d"*.c "$d"*.h 2>/dev/null | sed -E 's/^([^:]+):[0-9]+:/\1:/')
done
if [ -z "$viol" ]; then pass "each room includes only the rooms above it"
else fail "room order broken:"; sed 's/^/    | /' <<<"$viol"; fi

# the core builds without the network rooms: no include of store/sign/sync/... from it
core_bad=$(grep -rn -E '#include "(store|sign|sync|shard|mirror|dock|loco)/' lib/common lib/codec lib/io 2>/dev/null)
if [ -z "$core_bad" ]; then pass "the core (common, codec, io) includes no network room"
else fail "the core includes network rooms:"; sed 's/^/    | /' <<<"$core_bad"; fi

# programs use the public API only
prog_bad=$(grep -rn -E '#include "(common|codec|io|store|sign|sync|shard|mirror|dock|loco)/|#include "(common|model|xxh|bf16)\.h"' programs 2>/dev/null)
if [ -z "$prog_bad" ]; then pass "programs/ include only public headers"
else fail "programs/ include library internals:"; sed 's/^/    | /' <<<"$prog_bad"; fi

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
