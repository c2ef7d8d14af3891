#!/usr/bin/env bash
# The "Sharded publish and pull" table of bench/README.md:
#   0. tests/scripts/shard_cost.sh at default settings: each delta version's
#      rank objects against the single-rank `ferry publish` delta, and
#      island tile bytes against it (bench/results/shard/cost.txt);
#   1. bytes fetched per island rank, rl-a (../shared/data), 8 versions
#      published by 4 ranks (tile grid min 256 words), layouts rows, cols and
#      fused at M = 2, 4, 8: the largest share of a version's objects any
#      rank fetched, over its delta versions and its cold start (anchor),
#      and the most ranged GETs a rank made for one delta version (<= R);
#   2. on the 1 GiB synthetic pair (examples/adamw_sim --params 512M, BF16,
#      generated into bench/data/, ignored by git): publish wall time of the
#      delta version and peak RSS per trainer rank at R = 1, 2, 4
#      (mpirun, build/ferry-shard-mpi), then pull time and peak RSS per
#      island rank at M = 1, 2, 4 (rows), cold (anchor) and delta;
#   3. issue 24 item 2: the manifest + tile index bytes and ranged GETs
#      per island rank per delta version, rows and cols at M = 2, 3, 4 on
#      rl-a and rl-b (the INDEX_MAX lines of part 0's shard_cost.sh run).
#      bench/shard_index.py (the sizing that chose the index layout) reads
#      manifests of the old form only (every tile listed; runs written
#      before the index form).
# FERRY_SHARD_BENCH_ONLY=trainer runs only part 2's trainer publishes
# (R = 1, 2, 4; bench/results/shard/syn_publish.jsonl) and prints their
# table: the trainer RSS of issue 24 item 7.
# Writes bench/results/shard/*.jsonl and prints the markdown tables.
# Needs mpirun and build/ferry-shard-mpi, build/tools/shard_island,
# build/examples/adamw_sim (make -j2).  Times are wall clock on whatever
# else the machine runs.
set -eu
BUILD=${BUILD:-build}
FERRY_DATA=${FERRY_DATA:-../shared/data}
PARAMS=${FERRY_SHARD_BENCH_PARAMS:-512M}
out=bench/results/shard
mkdir -p "$out"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl=self,vader OMPI_MCA_btl_tcp_if_include=lo OMPI_MCA_oob_tcp_if_include=lo
export OMPI_MCA_rmaps_base_oversubscribe=1
tmp=$(mktemp -d "${TMPDIR:-/tmp}/ferry-shard-bench.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
PUB=$BUILD/ferry-shard-mpi
ISL=$BUILD/tools/shard_island
ONLY=${FERRY_SHARD_BENCH_ONLY:-}
if [ "$ONLY" != trainer ]; then

# --- 0. parts and island bytes against the single-rank delta (default settings) ---
FERRY_BUILD=$BUILD FERRY_BIN=$BUILD/ferry FERRY_DATA=$FERRY_DATA bash tests/scripts/shard_cost.sh >"$out/cost.txt" 2>&1 || true
grep -E '^(ok|FAIL|note)|version [0-9]+: parts' "$out/cost.txt"

# --- 1. bytes per island rank on rl-a -----------------------------------------
files=()
for i in 0 1 2 3 4 5 6 7; do files+=("$FERRY_DATA/rl-a/step-00$i.safetensors"); done
mpirun -np 4 "$PUB" "$tmp/rla" --run rla --tile-words 256 --anchor-every 8 --json "${files[@]}" >"$out/rla_publish.jsonl"
: >"$out/rla_islands.jsonl"
for L in rows cols fused; do
    for M in 2 4 8; do
        for ((m = 0; m < M; m++)); do
            "$ISL" "$tmp/rla" rla $L $M $m 8 "$FERRY_DATA/rl-a" 60 >>"$out/rla_islands.jsonl" || true
        done
    done
done

fi

# --- 2. the 1 GiB synthetic pair ---------------------------------------------------
syn=bench/data/synthetic-$PARAMS
if [ ! -f "$syn/step-001.safetensors" ]; then
    rm -rf "$syn" && mkdir -p "$syn"
    "$BUILD/examples/adamw_sim" --out "$syn" --params "$PARAMS" --steps 1 --quiet
fi
: >"$out/syn_publish.jsonl"
for R in 1 2 4; do
    rm -rf "$tmp/syn"
    mpirun -np $R "$PUB" "$tmp/syn" --run syn --json "$syn/step-000.safetensors" "$syn/step-001.safetensors" |
        sed "s/^{/{\"R\": $R, /" >>"$out/syn_publish.jsonl"
done
if [ "$ONLY" != trainer ]; then
: >"$out/syn_islands.jsonl"
for M in 1 2 4; do
    pids=()
    for ((m = 0; m < M; m++)); do
        "$ISL" "$tmp/syn" syn rows $M $m 2 "$syn" 60 >"$tmp/isl-$M-$m.jsonl" &
        pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p" || true; done
    cat "$tmp"/isl-$M-*.jsonl >>"$out/syn_islands.jsonl"
done

# --- 3. index bytes per island rank (issue 24 item 2) --------------------------
grep -E 'INDEX_MAX' "$out/cost.txt" | grep -v '^ok' || true
fi

/usr/bin/python3 - "$out" "$ONLY" <<'EOF'
import json, sys
d = sys.argv[1]
def trainer_table():
    sp = [json.loads(l) for l in open(d + "/syn_publish.jsonl") if l.startswith("{")]
    print("\n| trainer ranks R | version | kind | publish wall s | delta B | anchor B | peak RSS per rank (MiB) |")
    print("|---|---|---|---|---|---|---|")
    for p in sp:
        print("| %d | %d | %s | %.2f | %d | %d | %s |" % (p["R"], p["version"], p["kind"], p["seconds"], p["delta_bytes"],
              p["anchor_bytes"], ", ".join("%.0f" % (k / 1024) for k in p["peak_rss_kib"])))
if sys.argv[2] == "trainer":
    trainer_table()
    sys.exit(0)
rows = [json.loads(l) for l in open(d + "/rla_islands.jsonl") if l.startswith("{")]
pub = [json.loads(l) for l in open(d + "/rla_publish.jsonl") if l.startswith("{")]
print("rl-a, 8 versions from 4 ranks: delta objects %d-%d B per version, manifest %d-%d B\n" % (
    min(p["delta_bytes"] for p in pub[1:]), max(p["delta_bytes"] for p in pub[1:]),
    min(p["manifest_bytes"] for p in pub), max(p["manifest_bytes"] for p in pub)))
print("| layout | M | 1/M | largest share, deltas | largest share, cold start | within 1/M + 5% | ranged GETs per delta version (max) | identical |")
print("|---|---|---|---|---|---|---|---|")
for L in ("rows", "cols", "fused"):
    for M in (2, 4, 8):
        r = [x for x in rows if x["layout"] == L and x["M"] == M]
        if not r:
            continue
        dl = max([x["share"] for x in r if x["version"] > 1] or [float("nan")])
        an = max([x["share"] for x in r if x["version"] == 1] or [float("nan")])
        gets = max([x["requests"] for x in r if x["version"] > 1] or [0])
        print("| %s | %d | %.4f | %.4f | %.4f | %s | %d | %s |" % (L, M, 1 / M, dl, an,
              "yes" if all(x["within"] for x in r) else "no", gets, "yes" if all(x["identical"] for x in r) else "no"))
trainer_table()
si = [json.loads(l) for l in open(d + "/syn_islands.jsonl") if l.startswith("{")]
print("\n| island ranks M | version | path | pull s per rank (max) | object B per rank (max) | share (max) | peak RSS per rank (MiB, max) | identical |")
print("|---|---|---|---|---|---|---|---|")
for M in (1, 2, 4):
    for v in (1, 2):
        r = [x for x in si if x["M"] == M and x["version"] == v]
        if not r:
            continue
        print("| %d | %d | %s | %.2f | %d | %.4f | %.0f | %s |" % (M, v, r[0]["path"], max(x["pull_s"] for x in r),
              max(x["object_bytes"] for x in r), max(x["share"] for x in r), max(x["peak_rss_kib"] for x in r) / 1024,
              "yes" if all(x["identical"] for x in r) else "no"))
EOF
