#!/usr/bin/env bash
# loco_train's ranks joined over a shaped network, as users would run them:
# one network namespace per rank, each linked to a hub namespace's bridge
# by a veth pair whose two ends are shaped with tc tbf (RATE each way; this
# kernel has no netem, so no added delay), Open MPI's TCP BTL only (no
# shared memory: every byte crosses the links), mpirun started in rank 0's
# namespace and the other ranks' daemons launched into theirs by an rsh
# agent that runs `ip netns exec`.  Bytes on the links are read from the
# rank-side veth counters before and after each run.
#
#   bash bench/loco_wan.sh                 NPS="2 4" MODES="pulseloco diloco ddp" RATE=100mbit
#   NPS=2 RATE=1gbit ROUNDS=3 bash bench/loco_wan.sh
#
# Needs root (ip netns, tc).  The namespaces (flw-*) and addresses
# (10.231.7.0/24, inside them only) are created by this script and deleted
# on exit.  Output: bench/results/loco/wan/MODE-npN-RATE.jsonl (loco_train
# --json, whose rounds carry sync_ms, the time in the exchange) and
# wan/links.tsv (bytes on the links per run) -> bench/loco_wan_report.py.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
NPS=${NPS:-2 4}
MODES=${MODES:-pulseloco diloco ddp}
RATE=${RATE:-100mbit}
ROUNDS=${ROUNDS:-3}
H=${H:-4}
LR=${LR:-1e-6}
OUT=${OUT:-bench/results/loco/wan}
PROG=$(readlink -f "$BUILD/examples/loco_train")
CK=${CK:-$BUILD/loco-finetune/pretrained-steps130-seed11.safetensors}
# Fewer prompts per step than the learning benches: the bytes per round do
# not depend on them (every weight's pseudo-gradient is exchanged), the
# compute does.
SMALL=(--prompts-per-step 4 --group-size 4)
[ "$(id -u)" -eq 0 ] || { echo "bench/loco_wan.sh: needs root (ip netns, tc)" >&2; exit 1; }
[ -x "$PROG" ] || { echo "bench/loco_wan.sh: $PROG is not built" >&2; exit 1; }
INIT=()
[ -s "$CK" ] && INIT=(--init "$(readlink -f "$CK")")
mkdir -p "$OUT"

P=flw$$
NET=10.231.7
tmp=$(mktemp -d)
MAXNP=0
for np in $NPS; do [ "$np" -gt "$MAXNP" ] && MAXNP=$np; done
cleanup() {
    for i in $(seq 0 $((MAXNP - 1))); do ip netns del "$P-r$i" 2>/dev/null || true; done
    ip netns del "$P-hub" 2>/dev/null || true
    rm -rf "$tmp"
}
trap cleanup EXIT

# hub with a bridge; rank i at $NET.(i+1) behind veth r$i <-> h$i
ip netns add "$P-hub"
ip -n "$P-hub" link add br0 type bridge
ip -n "$P-hub" link set br0 up
ip -n "$P-hub" link set lo up
for i in $(seq 0 $((MAXNP - 1))); do
    ns=$P-r$i
    ip netns add "$ns"
    ip link add "r$i-$$" netns "$ns" type veth peer name "h$i" netns "$P-hub"
    ip -n "$ns" link set "r$i-$$" name eth0
    ip -n "$ns" addr add "$NET.$((i + 1))/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$ns" link set lo up
    ip -n "$P-hub" link set "h$i" master br0
    ip -n "$P-hub" link set "h$i" up
    # RATE each way: the rank's uplink (eth0 egress) and downlink (h$i egress)
    ip netns exec "$ns" tc qdisc add dev eth0 root tbf rate "$RATE" burst 256kb latency 400ms
    ip netns exec "$P-hub" tc qdisc add dev "h$i" root tbf rate "$RATE" burst 256kb latency 400ms
done
# links up (no ping here; mpirun's own connection, bounded by timeout,
# fails loudly if a rank is unreachable)
sleep 1

# rsh agent: "agent [options] HOST COMMAND..." -> the command in HOST's namespace
cat >"$tmp/agent" <<EOF
#!/bin/sh
while [ \$# -gt 0 ] && [ "\${1#-}" != "\$1" ]; do shift; done
host=\$1; shift
i=\${host##*.}
exec ip netns exec "$P-r\$((i - 1))" /bin/sh -c "\$*"
EOF
chmod +x "$tmp/agent"

tx() { # total tx bytes of the first NP rank links
    local t=0 i
    for i in $(seq 0 $(($1 - 1))); do
        t=$((t + $(ip netns exec "$P-r$i" cat /sys/class/net/eth0/statistics/tx_bytes)))
    done
    echo $t
}

[ -s "$OUT/links.tsv" ] || printf 'mode\tnp\trate\trounds\th\tlink_tx_bytes\tseconds\n' >"$OUT/links.tsv"
for np in $NPS; do
    : >"$tmp/hosts"
    for i in $(seq 0 $((np - 1))); do echo "$NET.$((i + 1)) slots=1" >>"$tmp/hosts"; done
    for mode in $MODES; do
        f=$OUT/$mode-np$np-$RATE.jsonl
        before=$(tx "$np")
        t0=$(date +%s.%N)
        echo "== wan: $mode, $np ranks over $RATE links" >&2
        # timeout: a run that cannot reach its peers must not hang the bench
        ip netns exec "$P-r0" env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
            timeout 3000 mpirun --hostfile "$tmp/hosts" -np "$np" \
            --mca plm_rsh_agent "$tmp/agent" --mca btl tcp,self \
            --mca btl_tcp_if_include "$NET.0/24" --mca oob_tcp_if_include "$NET.0/24" \
            -x OMPI_ALLOW_RUN_AS_ROOT -x OMPI_ALLOW_RUN_AS_ROOT_CONFIRM \
            "$PROG" --mode "$mode" --h "$H" --rounds "$ROUNDS" --lr "$LR" --seed 1 "${INIT[@]}" "${SMALL[@]}" \
            ${EXTRA:-} --json >"$f.tmp"
        t1=$(date +%s.%N)
        after=$(tx "$np")
        mv "$f.tmp" "$f"
        printf '%s\t%s\t%s\t%s\t%s\t%s\t%.1f\n' "$mode" "$np" "$RATE" "$ROUNDS" "$H" $((after - before)) \
            "$(echo "$t1 - $t0" | bc)" >>"$OUT/links.tsv"
        grep '"event":"summary"' "$f" >&2
    done
done
python3 bench/loco_wan_report.py "$OUT" | tee "$OUT/report.md"
