# Emulated WAN for the wan_* test scripts and bench/wan.sh (sourced, not
# run): network namespaces joined by veth pairs shaped with tbf, nginx
# serving file:// trees, byte counters read on the links.  Everything is
# named with a per-run tag, created by the caller and removed by wan_down
# (called from the EXIT trap the caller installs).  Needs root and
# iproute2; netem is not assumed (this machine's kernel has none), so the
# links have bandwidth and queueing but no added propagation delay.

WAN_TAG=${WAN_TAG:-fw$$}
WAN_NS=()

# wan_check: 0, or prints one line saying why namespaces cannot be used.
wan_check() {
    command -v ip >/dev/null || { echo "network namespaces unavailable: no 'ip' command (iproute2)"; return 1; }
    command -v tc >/dev/null || { echo "network namespaces unavailable: no 'tc' command (iproute2)"; return 1; }
    local probe="${WAN_TAG}probe" err
    if ! err=$(ip netns add "$probe" 2>&1); then
        echo "network namespaces unavailable here (ip netns add: ${err//$'\n'/ })"
        return 1
    fi
    ip netns del "$probe" 2>/dev/null
    return 0
}

# wan_bench_init SCRIPT PROGRAM...: what every bench/wan* script checks
# before it builds anything (the programs it runs are built, namespaces
# work); prints one line saying what is missing and fails otherwise.
wan_bench_init() {
    local s=$1 p why
    shift
    for p in "$@"; do [ -x "$p" ] || { echo "$s: build $p first (make benches)"; return 1; }; done
    why=$(wan_check) || { echo "$s: $why"; return 1; }
}

# wan_dcs A_MBIT B_MBIT: the benches' three datacenters: "t" (the
# trainer's), "a" and "b" (islands) behind links of A_MBIT (10.77.1.x) and
# B_MBIT (10.77.2.x) Mbit/s.
wan_dcs() {
    wan_ns t && wan_ns a && wan_ns b && wan_link t a 1 "$1" && wan_link t b 2 "$2" ||
        { echo "network setup failed" >&2; return 1; }
}

# wan_proxy NS LISTEN_PORT TARGET_PORT DELAY_MS NAME: bench/wan_proxy.py in
# NS, listening on every address of NS, forwarding to 127.0.0.1:TARGET_PORT
# with DELAY_MS of one-way delay each way (this kernel has no netem: the
# links' propagation delay); adds its pid to PIDS and waits until ready.
# It runs at a higher priority (nice -10): it stands for a link, which
# must not slow down when the islands and the trainer load the CPUs.
wan_proxy() {
    nice -n -10 ip netns exec "${WAN_TAG}$1" ${PY:-python3} bench/wan_proxy.py 0.0.0.0 "$2" 127.0.0.1 "$3" "$4" >"$WORK/$5.log" 2>&1 &
    PIDS+=($!)
    wait_for "$WORK/$5.log" "listening" 100
}

# wan_ns NAME: a namespace with its loopback up.
wan_ns() {
    local ns="${WAN_TAG}$1"
    ip netns add "$ns" || return 1
    WAN_NS+=("$ns")
    ip -n "$ns" link set lo up
}

# wan_link A B IDX MBIT: veth pair A<->B (10.77.IDX.1 in A, .2 in B), each
# direction shaped to MBIT Mbit/s by tbf.  The interfaces are
# ${WAN_TAG}IDXa (in A) and ${WAN_TAG}IDXb (in B).
wan_link() {
    local a="${WAN_TAG}$1" b="${WAN_TAG}$2" i=$3 rate=$4
    local ia="${WAN_TAG}${i}a" ib="${WAN_TAG}${i}b"
    ip link add "$ia" netns "$a" type veth peer name "$ib" netns "$b" || return 1
    ip -n "$a" addr add "10.77.$i.1/24" dev "$ia"
    ip -n "$b" addr add "10.77.$i.2/24" dev "$ib"
    ip -n "$a" link set "$ia" up
    ip -n "$b" link set "$ib" up
    # burst: at least rate/HZ; 64 KiB keeps tbf accurate at these rates
    tc -n "$a" qdisc add dev "$ia" root tbf rate "${rate}mbit" burst 64kb latency 100ms || return 1
    tc -n "$b" qdisc add dev "$ib" root tbf rate "${rate}mbit" burst 64kb latency 100ms || return 1
}

# wan_tx NS IFACE: bytes sent by IFACE so far (frames, headers included).
wan_tx() {
    ip netns exec "${WAN_TAG}$1" cat "/sys/class/net/${WAN_TAG}$2/statistics/tx_bytes"
}

# wan_nginx NS ROOT LISTEN NAME [RATE]: nginx in NS ("" = this namespace)
# serving the directory ROOT on LISTEN (a port: all addresses of NS; or
# 127.0.0.1:PORT), access log in $WORK/NAME.access.log; adds its pid to
# PIDS and waits until it answers.  RATE (nginx's limit_rate, e.g. 128k)
# caps each response's bytes per second on the server side.
wan_nginx() {
    local root=$2 port=$3 name=$4 rate=${5:-0} d="$WORK/nginx-$4" exec=()
    [ -n "$1" ] && exec=(ip netns exec "${WAN_TAG}$1")
    mkdir -p "$d" "$root"
    cat >"$d/nginx.conf" <<EOF
daemon off;
user root;
worker_processes 1;
pid $d/nginx.pid;
error_log $d/error.log;
events { worker_connections 256; }
http {
    access_log $WORK/$name.access.log;
    client_body_temp_path $d/body;
    proxy_temp_path $d/proxy;
    fastcgi_temp_path $d/fastcgi;
    uwsgi_temp_path $d/uwsgi;
    scgi_temp_path $d/scgi;
    sendfile on;
    server {
        listen $port;
        root $root;
        location / { limit_rate $rate; }
    }
}
EOF
    "${exec[@]}" nginx -c "$d/nginx.conf" -e "$d/error.log" >"$d/out.log" 2>&1 &
    PIDS+=($!)
    local i
    for ((i = 0; i < 100; i++)); do
        "${exec[@]}" curl -s -o /dev/null "http://127.0.0.1:${port##*:}/" && return 0
        sleep 0.1
    done
    echo "nginx ($name) did not start:" >&2
    cat "$d/error.log" "$d/out.log" >&2
    return 1
}

wan_down() {
    local ns
    for ns in "${WAN_NS[@]}"; do ip netns del "$ns" 2>/dev/null; done
    WAN_NS=()
}
