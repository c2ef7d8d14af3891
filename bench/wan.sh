#!/usr/bin/env bash
# bench/wan.sh — time-to-fresh-policy and bytes on emulated WAN links.
#
# Network namespaces (tests/tools/wan_env.sh): "t", the trainer's DC (the
# origin, a file:// tree served by nginx; the trainer publishes from the
# root namespace into that tree), and two island DCs "a" and "b" behind
# veth links shaped by tbf to A_MBIT and B_MBIT (default 200 and 50
# Mbit/s, scaled to this 2-core machine), each with N islands.  netem is
# not available on this kernel: the links have bandwidth and queueing, no
# added propagation delay.
#
# For one checkpoint sequence (default ../shared/data/rl-a, steps 0..8:
# 2.7M BF16 parameters, 5.4 MB; the islands start at step 0) and each row:
#   full    the trainer writes each full checkpoint; islands fetch the latest
#   skyrl   SkyRL-style XOR + zstd-3 deltas (bench/wan_peer.c), every one applied
#   sparse  prime-rl-style sparse updates: int32 flat indices + BF16 values + zstd-3
#   ferry   ferry publish (--cache) / ferry pull --follow from the origin
#   mirror  ferry with one `ferry mirror --follow` per island DC (nginx in the DC)
# a version is published every PERIOD seconds; for every version v and
# island i, time-to-fresh-policy = (first time i holds a version >= v) -
# (the moment the trainer started publishing v: its encode counts).  The
# bytes sent on each link (veth tx counters, frames and headers included)
# are read around each row.  Physical reference of a row on a link: its
# bytes per version / the link's bandwidth + the median decode time.
#
# Usage: bash bench/wan.sh [--islands N] [--period S] [--a-mbit M] [--b-mbit M]
#                          [--data DIR] [--out DIR]
# Writes OUT/wan.json and OUT/wan.html (default bench/results).  Needs root,
# network namespaces and nginx (scripts/install-deps.sh).
set -u
N=2 PERIOD=3 A_MBIT=200 B_MBIT=50 OUT=bench/results
SEQ=${FERRY_DATA:-../shared/data}/rl-a
while [ $# -gt 0 ]; do
    case $1 in
    --islands) N=$2; shift ;;
    --period) PERIOD=$2; shift ;;
    --a-mbit) A_MBIT=$2; shift ;;
    --b-mbit) B_MBIT=$2; shift ;;
    --data) SEQ=$2; shift ;;
    --out) OUT=$2; shift ;;
    *) echo "usage: bash bench/wan.sh [--islands N] [--period S] [--a-mbit M] [--b-mbit M] [--data DIR] [--out DIR]" >&2; exit 2 ;;
    esac
    shift
done
source tests/tools/sync_env.sh
source tests/tools/wan_env.sh
trap 'cleanup; wan_down' EXIT
PEER=${FERRY_BUILD:-$PWD/build}/bench/wan_peer
[ -x "$PEER" ] || { echo "bench/wan.sh: build $PEER first (make benches)"; exit 1; }
why=$(wan_check) || { echo "bench/wan.sh: $why"; exit 1; }
command -v nginx >/dev/null || { echo "bench/wan.sh: nginx is not installed"; exit 1; }
steps=("$SEQ"/step-*.safetensors)
V=$((${#steps[@]} - 1))
[ "$V" -ge 2 ] || { echo "bench/wan.sh: need at least 3 checkpoints in $SEQ"; exit 1; }
TMAX=$(awk -v v="$V" -v p="$PERIOD" 'BEGIN {printf "%d", v * p + 120}')
chmod 755 "$WORK"
O=$WORK/origin
mkdir -p "$O" "$OUT"
wan_ns t && wan_ns a && wan_ns b && wan_link t a 1 "$A_MBIT" && wan_link t b 2 "$B_MBIT" || { echo "bench/wan.sh: network setup failed"; exit 1; }
wan_nginx t "$O" 8080 origin && wan_nginx a "$WORK/mirror-a" 8081 mirror-a && wan_nginx b "$WORK/mirror-b" 8081 mirror-b || exit 1
up_of() { [ "$1" = a ] && echo http://10.77.1.1:8080 || echo http://10.77.2.1:8080; }
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
    if [ "\$latest" -le \$v ]; then sleep 0.05; continue; fi
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
        --follow --until-version $((V + 1)) --interval 0.05 --deadline 30 |
        while read -r l; do echo \"\$(date +%s.%N) \$l\"; done >'$dir/raw.log'" &
    ipids+=($!)
}

run_row() { # ROW
    local row=$1 dc k v
    ipids=()
    mkdir -p "$WORK/isl" "$O/$row"
    case $row in
    full | skyrl | sparse)
        echo 0 >"$O/$row/latest"
        for dc in a b; do for k in $(seq 1 "$N"); do peer_island $dc "$k" "$row"; done; done ;;
    ferry | mirror)
        rm -rf "$O/r" "$WORK/pubcache"*
        fy publish "$O" --run r "${steps[0]}" --cache "$WORK/pubcache.safetensors" --anchor-every 1000 -q || return 1
        for dc in a b; do
            if [ "$row" = mirror ]; then
                rm -rf "$WORK/mirror-$dc/r"
                ip netns exec "${WAN_TAG}$dc" timeout 60 "$FERRY" mirror "$(up_of $dc)" "$WORK/mirror-$dc" --run r -q || return 1
                ip netns exec "${WAN_TAG}$dc" timeout $TMAX "$FERRY" mirror "$(up_of $dc)" "$WORK/mirror-$dc" \
                    --run r --follow --until-version $((V + 1)) --poll-ms 50 -q >"$WORK/mirror-$dc.log" 2>&1 &
                PIDS+=($!)
            fi
        done
        for dc in a b; do
            for k in $(seq 1 "$N"); do
                if [ "$row" = mirror ]; then ferry_island $dc "$k" "$row" http://127.0.0.1:8081
                else ferry_island $dc "$k" "$row" "$(up_of $dc)"; fi
            done
        done ;;
    esac
    sleep 1
    local tx_a0 tx_b0 t0 t_next
    tx_a0=$(wan_tx t 1a) tx_b0=$(wan_tx t 2a)
    : >"$WORK/pub-$row.log"
    t_next=$(now)
    for v in $(seq 1 "$V"); do
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

# decode times of ferry (apply), measured once outside the links
dec_ferry=()
for v in $(seq 1 "$V"); do
    fy diff "${steps[$((v - 1))]}" "${steps[$v]}" -o "$WORK/d.patch" >/dev/null
    t0=$(now); fy apply "${steps[$((v - 1))]}" "$WORK/d.patch" -o "$WORK/d.out" >/dev/null; t1=$(now)
    dec_ferry+=("$(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.4f", b - a}')")
done
echo "${dec_ferry[*]}" >"$WORK/dec_ferry.txt"

: >"$WORK/tx.log"; : >"$WORK/errors.log"
for row in full skyrl sparse ferry mirror; do
    echo "== $row" >&2
    run_row "$row" || echo "$row: row failed" >>"$WORK/errors.log"
done
/usr/bin/python3 bench/wan_report.py "$WORK" "$OUT" --islands "$N" --period "$PERIOD" --a-mbit "$A_MBIT" --b-mbit "$B_MBIT" \
    --versions "$V" --data "$SEQ"
