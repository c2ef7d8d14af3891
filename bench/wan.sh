#!/usr/bin/env bash
# bench/wan.sh — time-to-fresh-policy and bytes on emulated WAN links.
#
# Network namespaces (tests/tools/wan_env.sh): "t", the trainer's DC (the
# origin, a file:// tree served by nginx; the trainer publishes from the
# root namespace into that tree), and two island DCs "a" and "b" behind
# veth links shaped by tbf to A_MBIT and B_MBIT (default 200 and 50
# Mbit/s, scaled to this 2-core machine), each with N islands.  netem is
# not available on this kernel: the origin is reached through
# bench/wan_proxy.py in "t", which adds DELAY_MS (default 20) of one-way
# delay each way, so every request from an island DC costs the round trip
# of a link tens of ms long (a mirror's islands reach it in their own DC).
#
# For one checkpoint sequence (default ../shared/data/rl-a, steps 0..8:
# 2.7M BF16 parameters, 5.4 MB; the islands start at step 0) and each row:
#   full    the trainer writes each full checkpoint; islands fetch the latest
#   skyrl   SkyRL-style XOR + zstd-3 deltas (bench/wan_peer.c), every one applied
#   sparse  prime-rl-style sparse updates: int32 flat indices + BF16 values + zstd-3
#   ferry   ferry publish (--cache) / ferry pull --follow from the origin
#   mirror  ferry with one `ferry mirror --follow` per island DC (nginx in the DC)
#   lib     ferry as a trainer and an inference engine run it: one long-lived
#           publisher holding the model in memory (bench/wan_sync.c publish)
#           and islands holding theirs in memory as long-lived subscribers
#           (wan_sync island: ferry_subscriber_wait + an in-place sync)
#   libmirror  lib, the islands pulling from a mirror per island DC
# a version is published every PERIOD seconds; for every version v and
# island i, time-to-fresh-policy = (first time i holds a version >= v) -
# (the moment the trainer started publishing v: its encode counts; for lib,
# the moment ferry_publish_ex is called with the new weights).  The
# bytes sent on each link (veth tx counters, frames and headers included)
# are read around each row.  Physical reference of a row on a link: its
# bytes per version / the link's bandwidth + the median decode time.
# Islands and mirrors poll every POLL_MS (default 20).
#
# Usage: bash bench/wan.sh [--islands N] [--period S] [--a-mbit M] [--b-mbit M]
#                          [--delay MS] [--poll-ms MS] [--rows LIST]
#                          [--data DIR] [--name NAME] [--out DIR]
# Writes OUT/NAME.{txt,json,html} (default bench/results/wan).  Needs root,
# network namespaces and nginx (scripts/install-deps.sh).
set -u
source tests/tools/sync_env.sh
source tests/tools/wan_env.sh
trap 'cleanup; wan_down' EXIT
N=2 PERIOD=3 A_MBIT=200 B_MBIT=50 DELAY=20 POLL=20 OUT=bench/results NAME=wan
ROWS="full skyrl sparse ferry mirror lib libmirror"
SEQ=${FERRY_DATA:-../shared/data}/rl-a
while [ $# -gt 0 ]; do
    case $1 in
    --islands) N=$2; shift ;;
    --period) PERIOD=$2; shift ;;
    --a-mbit) A_MBIT=$2; shift ;;
    --b-mbit) B_MBIT=$2; shift ;;
    --delay) DELAY=$2; shift ;;
    --poll-ms) POLL=$2; shift ;;
    --rows) ROWS=${2//,/ }; shift ;;
    --data) SEQ=$2; shift ;;
    --name) NAME=$2; shift ;;
    --out) OUT=$2; shift ;;
    *) echo "usage: bash bench/wan.sh [--islands N] [--period S] [--a-mbit M] [--b-mbit M] [--delay MS] [--poll-ms MS] [--rows LIST] [--data DIR] [--name NAME] [--out DIR]" >&2; exit 2 ;;
    esac
    shift
done
PEER=${FERRY_BUILD:-$PWD/build}/bench/wan_peer SYNC=${FERRY_BUILD:-$PWD/build}/bench/wan_sync
wan_bench_init bench/wan.sh "$PEER" "$SYNC" || exit 1
command -v nginx >/dev/null || { echo "bench/wan.sh: nginx is not installed"; exit 1; }
POLL_S=$(awk -v m="$POLL" 'BEGIN {printf "%.3f", m / 1000}')
steps=("$SEQ"/step-*.safetensors)
V=$((${#steps[@]} - 1))
[ "$V" -ge 2 ] || { echo "bench/wan.sh: need at least 3 checkpoints in $SEQ"; exit 1; }
TMAX=$(awk -v v="$V" -v p="$PERIOD" 'BEGIN {printf "%d", v * p + 120}')
chmod 755 "$WORK"
O=$WORK/origin
mkdir -p "$O" "$OUT"
wan_dcs "$A_MBIT" "$B_MBIT" || exit 1
wan_nginx t "$O" 8080 origin && wan_nginx a "$WORK/mirror-a" 8081 mirror-a && wan_nginx b "$WORK/mirror-b" 8081 mirror-b || exit 1
# the island DCs reach the origin through the delay line
wan_proxy t 8090 8080 "$DELAY" proxy || exit 1
up_of() { [ "$1" = a ] && echo http://10.77.1.1:8090 || echo http://10.77.2.1:8090; }
# what link a carries straight and through the delay line (a 32 MiB GET):
# the proxy must not be the bottleneck
head -c $((32 << 20)) /dev/urandom >"$O/probe.bin"
for port in 8080 8090; do
    ip netns exec "${WAN_TAG}a" curl -s -o /dev/null -w "$port %{speed_download}\n" "http://10.77.1.1:$port/probe.bin"
done | awk '{printf "%s%.1f", (NR > 1 ? " " : ""), $2 * 8 / 1e6} END {print ""}' >"$WORK/probe.txt"
rm -f "$O/probe.bin"
now() { date +%s.%N; }

# Each island writes "VERSION TIME" when it holds VERSION (0 = step 0).
peer_island() { # DC K ROW: runs inside the DC's namespace
    local dc=$1 k=$2 row=$3 up dir log v got want
    up=$(up_of "$dc")
    dir=$WORK/isl/$row-$dc$k log=$WORK/isl/$row-$dc$k.log
    mkdir -p "$dir"
    cp "${steps[0]}" "$dir/cur.safetensors"
    cat >"$dir/run.sh" <<EOF
set -u
v=0 t_end=\$((SECONDS + $TMAX))
while [ \$v -lt $V ] && [ \$SECONDS -lt \$t_end ]; do
    latest=\$(curl -sf $up/$row/latest) || latest=\$v
    if [ "\$latest" -le \$v ]; then sleep $POLL_S; continue; fi
    if [ $row = full ]; then
        curl -sf -o "$dir/obj" $up/$row/\$latest.obj || continue
        mv "$dir/obj" "$dir/cur.safetensors"; v=\$latest
        echo "\$v \$(date +%s.%N) 0" >>"$log"
    else
        curl -sf -o "$dir/obj" $up/$row/\$((v + 1)).obj || continue
        d=\$("$PEER" decode $row "$dir/cur.safetensors" "$dir/obj" "$dir/next.safetensors") || exit 1
        mv "$dir/next.safetensors" "$dir/cur.safetensors"; v=\$((v + 1))
        echo "\$v \$(date +%s.%N) \${d#decode_s }" >>"$log"
    fi
done
EOF
    ip netns exec "${WAN_TAG}$dc" bash "$dir/run.sh" &
    ipids+=($!)
}

ferry_island() { # DC K ROW URL
    local dc=$1 k=$2 row=$3 url=$4 dir=$WORK/isl/$3-$1$2
    mkdir -p "$dir"
    ip netns exec "${WAN_TAG}$dc" timeout 60 "$FERRY" pull "$url" --run r --to "$dir/cur.safetensors" -q ||
        echo "island $dc$k: first pull failed" >&2
    ip netns exec "${WAN_TAG}$dc" bash -c "timeout $TMAX '$FERRY' pull '$url' --run r --to '$dir/cur.safetensors' \
        --follow --until-version $((V + 1)) --interval $POLL_S --deadline 30 |
        while read -r l; do echo \"\$(date +%s.%N) \$l\"; done >'$dir/raw.log'" &
    ipids+=($!)
}

# lib_island DC K ROW URL: a long-lived in-memory subscriber (wan_sync)
lib_island() {
    local dc=$1 k=$2 row=$3 url=$4 dir=$WORK/isl/$3-$1$2
    mkdir -p "$dir"
    ip netns exec "${WAN_TAG}$dc" timeout "$TMAX" "$SYNC" island "$url" r "${steps[0]}" --log "$WORK/isl/$row-$dc$k.log" \
        --until $((V + 1)) --poll-ms "$POLL" --deadline "$TMAX" --save "$dir/cur.safetensors" 2>>"$WORK/errors.log" &
    ipids+=($!)
}

# start_mirrors: one `ferry mirror --follow` per island DC, from the origin
start_mirrors() {
    local dc
    for dc in a b; do
        rm -rf "$WORK/mirror-$dc/r"
        ip netns exec "${WAN_TAG}$dc" timeout 60 "$FERRY" mirror "$(up_of $dc)" "$WORK/mirror-$dc" --run r -q || return 1
        ip netns exec "${WAN_TAG}$dc" timeout $TMAX "$FERRY" mirror "$(up_of $dc)" "$WORK/mirror-$dc" \
            --run r --follow --until-version $((V + 1)) --poll-ms "$POLL" -q >"$WORK/mirror-$dc.log" 2>&1 &
        PIDS+=($!)
    done
}

run_row() { # ROW
    local row=$1 dc k v url pubpid=
    ipids=()
    mkdir -p "$WORK/isl" "$O/$row"
    case $row in
    full | skyrl | sparse)
        echo 0 >"$O/$row/latest"
        for dc in a b; do for k in $(seq 1 "$N"); do peer_island $dc "$k" "$row"; done; done ;;
    ferry | mirror)
        rm -rf "$O/r" "$WORK/pubcache"*
        fy publish "$O" --run r "${steps[0]}" --cache "$WORK/pubcache.safetensors" --anchor-every 1000 -q || return 1
        if [ "$row" = mirror ]; then start_mirrors || return 1; fi
        for dc in a b; do
            for k in $(seq 1 "$N"); do
                if [ "$row" = mirror ]; then ferry_island $dc "$k" "$row" http://127.0.0.1:8081
                else ferry_island $dc "$k" "$row" "$(up_of $dc)"; fi
            done
        done ;;
    lib | libmirror)
        # the publisher loads every step, publishes step 0 as version 1, and
        # publishes one step per PERIOD once every island is ready
        rm -rf "$O/r" "$WORK/go"
        "$SYNC" publish "$O" r "${steps[@]}" --period "$PERIOD" --log "$WORK/pub-$row.log" --go "$WORK/go" \
            >"$WORK/pub-$row.out" 2>&1 &
        pubpid=$!
        PIDS+=($pubpid)
        wait_for "$WORK/pub-$row.out" "^ready" 1200 || return 1
        if [ "$row" = libmirror ]; then start_mirrors || return 1; fi
        for dc in a b; do
            for k in $(seq 1 "$N"); do
                url=$(up_of $dc)
                [ "$row" = libmirror ] && url=http://127.0.0.1:8081
                lib_island $dc "$k" "$row" "$url"
            done
        done
        for dc in a b; do
            for k in $(seq 1 "$N"); do wait_for "$WORK/isl/$row-$dc$k.log.ready" ready 1200 || return 1; done
        done ;;
    esac
    sleep 1
    local tx_a0 tx_b0 t0 t_next
    tx_a0=$(wan_tx t 1a) tx_b0=$(wan_tx t 2a)
    if [ -n "$pubpid" ]; then
        : >"$WORK/go"
        wait "$pubpid" || echo "$row: the publisher failed: $(tail -1 "$WORK/pub-$row.out")" >>"$WORK/errors.log"
    fi
    [ -n "$pubpid" ] || : >"$WORK/pub-$row.log"
    t_next=$(now)
    for v in $(seq 1 "$V"); do
        [ -n "$pubpid" ] && break
        t0=$(now)
        case $row in
        full) cp "${steps[$v]}" "$O/full/$v.tmp" && mv "$O/full/$v.tmp" "$O/full/$v.obj" ;;
        skyrl | sparse) "$PEER" encode "$row" "${steps[$((v - 1))]}" "${steps[$v]}" "$O/$row/$v.tmp" && mv "$O/$row/$v.tmp" "$O/$row/$v.obj" ;;
        ferry | mirror) fy publish "$O" --run r "${steps[$v]}" --cache "$WORK/pubcache.safetensors" --anchor-every 1000 -q ;;
        esac
        case $row in full | skyrl | sparse) echo "$v" >"$O/$row/latest.tmp" && mv "$O/$row/latest.tmp" "$O/$row/latest" ;; esac
        echo "$v $t0 $(now)" >>"$WORK/pub-$row.log"
        t_next=$(awk -v a="$t_next" -v p="$PERIOD" 'BEGIN {printf "%.6f", a + p}')
        sleep "$(awk -v a="$t_next" -v b="$(now)" 'BEGIN {d = a - b; printf "%.3f", (d > 0 ? d : 0)}')"
    done
    for p in "${ipids[@]}"; do wait "$p"; done
    sleep 0.5
    echo "$row $(($(wan_tx t 1a) - tx_a0)) $(($(wan_tx t 2a) - tx_b0))" >>"$WORK/tx.log"
    # ferry islands: "TIME PATH: version N ..." lines -> "N TIME"
    for f in "$WORK"/isl/"$row"-*/raw.log; do
        [ -f "$f" ] || continue
        sed -nE 's/^([0-9.]+) .*: version ([0-9]+) .*/\2 \1/p' "$f" | awk '{print $1 - 1, $2, ""}' >"${f%/raw.log}.log"
    done
    # every island must end bit-identical to the last step
    for d in "$WORK"/isl/"$row"-*/; do
        same_model "${steps[$V]}" "$d/cur.safetensors" || echo "$row ${d%/}: NOT bit-identical to the last step" >>"$WORK/errors.log"
    done
    return 0
}

# decode times of ferry: `ferry apply` into a new file (the process rows)
# and in place (the library rows), measured once outside the links
"$SYNC" apply-time "${steps[@]}" | sed -n 's/^decode_s //p' >"$WORK/dec_lib.txt"
dec_ferry=()
for v in $(seq 1 "$V"); do
    fy diff "${steps[$((v - 1))]}" "${steps[$v]}" -o "$WORK/d.patch" >/dev/null
    t0=$(now); fy apply "${steps[$((v - 1))]}" "$WORK/d.patch" -o "$WORK/d.out" >/dev/null; t1=$(now)
    dec_ferry+=("$(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.4f", b - a}')")
done
echo "${dec_ferry[*]}" >"$WORK/dec_ferry.txt"

: >"$WORK/tx.log"; : >"$WORK/errors.log"
for row in $ROWS; do
    echo "== $row" >&2
    run_row "$row" || echo "$row: row failed" >>"$WORK/errors.log"
done
/usr/bin/python3 bench/wan_report.py "$WORK" "$OUT" --islands "$N" --period "$PERIOD" --a-mbit "$A_MBIT" --b-mbit "$B_MBIT" \
    --versions "$V" --data "$SEQ" --delay-ms "$DELAY" --poll-ms "$POLL" --name "$NAME" --load "$(cut -d' ' -f1-3 /proc/loadavg)"
