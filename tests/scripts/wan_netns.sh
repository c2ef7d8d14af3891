#!/usr/bin/env bash
# Two island datacenters behind shaped WAN links, a mirror in each
# (docs/MIRROR.md): network namespaces "t" (the trainer's DC: the origin
# store, a file:// tree served by nginx), "a" and "b" (island DCs, links of
# 200 and 50 Mbit/s shaped by tbf), each with a `ferry mirror --follow`
# into its own file:// tree served by its own nginx, and two islands
# (`ferry pull --follow` from the local mirror, the origin as --fallback).
# A trainer publishes 6 versions (1M BF16 parameters, anchors 1 and 5).
# Checks: every island ends bit-identical to the last version; the
# origin's access log shows every object of the run fetched exactly once
# per DC (by its mirror: an island's fetch would make it twice); the bytes sent on each WAN
# link (the veth's tx counter) are at least the run's bytes and well
# under twice them (two islands per DC would carry them twice).
# Without network namespaces (or nginx) the test says so in one line and
# fails: it never passes without having run.
set -u
TEST_NAME=wan_netns
source tests/tools/sync_env.sh
source tests/tools/wan_env.sh
trap 'cleanup; wan_down' EXIT
sync_built || skip_all "sync layer or tools not built (NO_NET=1?)"
if ! why=$(wan_check); then echo "wan_netns: $why"; echo "0 passed, 1 failed"; exit 1; fi
command -v nginx >/dev/null || { echo "wan_netns: nginx is not installed (scripts/install-deps.sh installs nginx-light)"; echo "0 passed, 1 failed"; exit 1; }

V=6
st gen "$WORK/m" $V 1000000 7 >/dev/null || { bad "generate models"; finish; exit 1; }
model() { printf '%s/m/m-%03d.safetensors' "$WORK" "$1"; }
O=$WORK/origin
mkdir -p "$O" "$WORK/mirror-a" "$WORK/mirror-b"
chmod 755 "$WORK"

wan_ns t && wan_ns a && wan_ns b || { bad "create namespaces"; finish; exit 1; }
wan_link t a 1 200 && wan_link t b 2 50 || { bad "create shaped links"; finish; exit 1; }
wan_nginx t "$O" 8080 origin && wan_nginx a "$WORK/mirror-a" 8080 mirror-a && wan_nginx b "$WORK/mirror-b" 8080 mirror-b ||
    { bad "start nginx"; finish; exit 1; }
check "the island DCs reach the origin over their links" \
    bash -c "ip netns exec ${WAN_TAG}a curl -s -o /dev/null http://10.77.1.1:8080/ && ip netns exec ${WAN_TAG}b curl -s -o /dev/null http://10.77.2.1:8080/"
check "... and not each other" bash -c "! ip netns exec ${WAN_TAG}a curl -s -m 1 -o /dev/null http://10.77.2.1:8080/"
tx_a0=$(wan_tx t 1a) tx_b0=$(wan_tx t 2a)

in_ns() { local ns=$1; shift; ip netns exec "${WAN_TAG}$ns" timeout 120 "$@"; }
fy publish "$O" --run r "$(model 0)" --anchor-every 4 -q || bad "publish 1"
for dc in a b; do
    up=http://10.77.1.1:8080; [ $dc = b ] && up=http://10.77.2.1:8080
    in_ns $dc "$FERRY" mirror "$up" "$WORK/mirror-$dc" --run r --follow --until-version $V --poll-ms 100 --for 100 -q \
        >"$WORK/mirror-$dc.log" 2>&1 &
    PIDS+=($!)
done
for _ in $(seq 1 200); do [ -f "$WORK/mirror-a/r/HEAD" ] && [ -f "$WORK/mirror-b/r/HEAD" ] && break; sleep 0.1; done
ipids=()
for dc in a b; do
    up=http://10.77.1.1:8080; [ $dc = b ] && up=http://10.77.2.1:8080
    for k in 1 2; do
        in_ns $dc "$FERRY" pull http://127.0.0.1:8080 --run r --to "$WORK/island-$dc$k.safetensors" --fallback "$up" \
            --follow --until-version $V --interval 0.1 --deadline 20 -q >"$WORK/island-$dc$k.log" 2>&1 &
        ipids+=($!)
    done
done
for i in $(seq 1 $((V - 1))); do
    sleep 0.3
    fy publish "$O" --run r "$(model "$i")" --anchor-every 4 -q || bad "publish $((i + 1))"
done
rc=0
for p in "${ipids[@]}"; do wait "$p" || rc=1; done
check "all four islands reached version $V" test $rc = 0
[ $rc = 0 ] || tail -n 5 "$WORK"/island-*.log "$WORK"/mirror-*.log
for f in "$WORK"/island-*.safetensors; do
    check "$(basename "$f") is bit-identical to the last version" same_model "$(model $((V - 1)))" "$f"
done
sleep 0.5   # the mirrors' last HEAD polls
tx_a=$(($(wan_tx t 1a) - tx_a0)) tx_b=$(($(wan_tx t 2a) - tx_b0))

# the run's bytes: every object and manifest (each version was copied whole)
run_bytes=$(find "$O/r/v" -type f -printf '%s\n' | awk '{s += $1} END {print s}')
for dc in a b; do
    client=10.77.1.2; [ $dc = b ] && client=10.77.2.2
    log=$WORK/origin.access.log
    n_keys=$(find "$O/r/v" -type f | wc -l)
    once=$(awk -v c="$client" '$1 == c && $6 == "\"GET" && $7 ~ /^\/r\/v\// {n[$7]++} END {k = 0; for (x in n) if (n[x] == 1) k++; print k}' "$log")
    more=$(awk -v c="$client" '$1 == c && $6 == "\"GET" && $7 ~ /^\/r\/v\// {n[$7]++} END {k = 0; for (x in n) if (n[x] > 1) k++; print k}' "$log")
    check "DC $dc: each of the run's $n_keys objects crossed its link exactly once (got $once once, $more more than once)" \
        test "$once" = "$n_keys" -a "$more" = 0
    check "DC $dc: the mirror's tree is byte-identical to the origin's" diff -r "$O/r" "$WORK/mirror-$dc/r"
done
echo "run bytes $run_bytes; link a (200 Mbit/s) carried $tx_a bytes, link b (50 Mbit/s) $tx_b bytes"
for x in a b; do
    t=$tx_a; [ $x = b ] && t=$tx_b
    check "link $x carried the run once: $run_bytes <= $t bytes < 1.25 x run + 256 KiB" \
        test "$t" -ge "$run_bytes" -a "$t" -lt $((run_bytes * 5 / 4 + 262144))
done
finish
