#!/usr/bin/env bash
# Sharded publish under real MPI and sliced pull by island processes
# (include/ferry_shard.h), on a file:// store with the rl-a sequence:
#   - 4 trainer ranks (mpirun -np 4 --oversubscribe build/ferry-shard-mpi)
#     publish step-000..007 as versions 1..8 (anchors 1, 5);
#   - island groups follow them as separate processes
#     (build/tools/shard_island): M = 2 by rows, M = 3 by columns, M = 3 in
#     the fused engine layout (qkv / gate_up rows, o/down columns,
#     vocabulary-parallel embeddings); after every version each region is
#     bit-identical to the sliced step file and each row rank fetched at
#     most 1/M of the version's objects + 5% (column and fused shares
#     printed: docs/SHARDING.md "Limits");
#   - rank 2 is killed (kill -9) after its upload of version 6, before the
#     commit: HEAD stays at 5 and no manifest of 6 exists; a restarted group
#     (new processes, tiles taken back through ranged GETs) publishes 6..8;
#   - GC collects the killed attempt's orphaned rank objects;
#   - a rank count change (-np 2 on the run of 4) fails on every rank,
#     naming the counts; `ferry log` lists the sharded versions;
#   - `ferry shard-pull --out` writes slices equal to the step file's.
# Skips when mpirun or the programs are absent (NO_MPI=1 builds).
set -u
TEST_NAME=shard_mpi
source tests/tools/sync_env.sh
PUB=${FERRY_BUILD:-$PWD/build}/ferry-shard-mpi
# the same publisher with its test hooks (stall, pid files) compiled in
HOOKS=${FERRY_BUILD:-$PWD/build}/tests/ferry-shard-mpi-hooks
ISL=${FERRY_BUILD:-$PWD/build}/tools/shard_island
command -v mpirun >/dev/null 2>&1 || skip_all "no mpirun"
[ -x "$PUB" ] && [ -x "$ISL" ] && [ -x "$HOOKS" ] || skip_all "no $PUB, $ISL or $HOOKS (NO_MPI=1?)"
[ -f "$DATA/rl-a/step-007.safetensors" ] || skip_all "no rl-a data in $DATA"
source tests/tools/mpi_env.sh
S=$WORK/store
RUN=shard/ci
mkdir -p "$S"
step() { printf '%s/rl-a/step-%03d.safetensors' "$DATA" "$1"; }
steps() { local i; for i in "$@"; do step "$i"; echo; done; }
pub() { # NP [env VAR=...] FILES...: one group of trainer ranks
    local np=$1; shift
    timeout 300 mpirun -np "$np" --oversubscribe "${MPIENV[@]}" "$@"
}
json() { $PY -c "import json,sys; d=json.load(sys.stdin); sys.exit(0 if ($1) else 1)"; }

# --- islands follow from the start ----------------------------------------
ISL_PIDS=()
island() { # LAYOUT M m
    timeout 600 "$ISL" "$S" "$RUN" "$1" "$2" "$3" 8 "$DATA/rl-a" 300 >"$WORK/isl-$1-$3.log" 2>&1 &
    ISL_PIDS+=("$!:$1-$3")
}
island rows 2 0; island rows 2 1
island cols 3 0; island cols 3 1; island cols 3 2
island fused 3 0; island fused 3 1; island fused 3 2

# --- 5 versions from 4 ranks ----------------------------------------------
mapfile -t F < <(steps 0 1 2 3 4)
# 4096-word tiles (9 to a 192 x 192 part): at 256 words the tile index (52
# bytes a tile) is most of a sparse delta's objects, and a column island
# reads them whole (docs/SHARDING.md "The tile index")
pub 4 "$PUB" "$S" --run $RUN --tile-words 4096 --anchor-every 4 --json "${F[@]}" >"$WORK/pub1.json" 2>"$WORK/pub1.err"
check "4 ranks publish versions 1..5" [ "$(grep -c '"version"' "$WORK/pub1.json")" -eq 5 ]
check "... anchors at 1 and 5, every rank's peak RSS reported" json \
    "d['version']==5 and d['kind']=='anchor' and d['world']==4 and len(d['peak_rss_kib'])==4" < <(tail -n 1 "$WORK/pub1.json")

# --- kill -9 of rank 2 after its upload of version 6 ---------------------------
mkdir -p "$WORK/pids"
pub 4 env FERRY_SHARD_TEST_STALL=2:6 FERRY_SHARD_TEST_PIDDIR="$WORK/pids" "$HOOKS" "$S" --run $RUN -q "$(step 5)" \
    >"$WORK/pub2.out" 2>&1 &
MPI_PID=$!
killed=0
for _ in $(seq 1 600); do
    if [ -f "$WORK/pids/rank-2.pid" ] && ls "$S/$RUN/v/" 2>/dev/null | grep -q '^00000000000000000006-.*-r000002\.patch$'; then
        kill -9 "$(cat "$WORK/pids/rank-2.pid")" && killed=1
        break
    fi
    sleep 0.1
done
wait "$MPI_PID"
mpi_rc=$?
check "rank 2 killed after its upload of version 6; the group fails (exit $mpi_rc)" [ $killed -eq 1 ] && [ $mpi_rc -ne 0 ]
fy log "$S" --run $RUN --json >"$WORK/log1.json"
check "HEAD stays at version 5, no manifest of version 6" json "d['head']==5" <"$WORK/log1.json"
check "... nor any version-6 manifest in the store" bash -c "! ls '$S/$RUN/v/' | grep -q '^00000000000000000006-[0-9a-f]*\.json$'"
orphan=$(ls "$S/$RUN/v/" | sed -n 's/^00000000000000000006-\([0-9a-f]*\)-r000002\.patch$/\1/p' | head -n 1)

# --- a rank count change is refused on every rank --------------------------
pub 2 "$PUB" "$S" --run $RUN -q "$(step 5)" >"$WORK/pub3.out" 2>&1
rc=$?
check "-np 2 on the run of 4 ranks: refused (exit $rc), naming the counts" \
    bash -c "[ $rc -ne 0 ] && grep -q 'published by 4 ranks, this publish has 2' '$WORK/pub3.out'"

# --- a restarted group publishes 6..8 -----------------------------------------
mapfile -t F < <(steps 5 6 7)
pub 4 "$PUB" "$S" --run $RUN --json "${F[@]}" >"$WORK/pub4.json" 2>"$WORK/pub4.err"
check "a restarted group publishes versions 6..8" [ "$(grep -c '"version"' "$WORK/pub4.json")" -eq 3 ]
fy log "$S" --run $RUN --json >"$WORK/log2.json"
check "log: HEAD 8, anchors 1 and 5, each version based on its predecessor" json \
    "d['head']==8 and [v['version'] for v in d['versions'] if v['kind']=='anchor']==[1,5] and all(v['base']==v['version']-1 for v in d['versions'])" \
    <"$WORK/log2.json"
check "... version 6 is not the killed attempt" bash -c "! grep -q '\"id\": \"$orphan\"' '$WORK/log2.json'"

# --- the islands ------------------------------------------------------------
for e in "${ISL_PIDS[@]}"; do
    pid=${e%%:*} name=${e#*:}
    wait "$pid"
    rc=$?
    lines=$(grep -c '"identical": true, ' "$WORK/isl-$name.log")
    within=$(grep -c '"within": true' "$WORK/isl-$name.log")
    case $name in
    rows-*)
        check "island $name: 8 versions, each bit-identical and within 1/M + 5% (exit $rc)" \
            [ $rc -eq 0 ] && [ "$lines" -eq 8 ] && [ "$within" -eq 8 ]
        [ $rc -eq 0 ] || tail -n 5 "$WORK/isl-$name.log" ;;
    *)
        # the index form at this grid: a column or fused island reads rank
        # objects whole where their index leaves cost more than the tiles it
        # does not want (docs/SHARDING.md "Limits"); its share is printed below
        check "island $name: 8 versions, each bit-identical (tile bytes within 1/M + 5% in $within of 8)" \
            [ "$lines" -eq 8 ] ;;
    esac
done
$PY - "$WORK" <<'EOF'
import glob, json, sys
worst = {}
for f in glob.glob(sys.argv[1] + "/isl-*.log"):
    for line in open(f):
        if line.startswith("{"):
            d = json.loads(line)
            k = (d["layout"], d["M"])
            worst[k] = max(worst.get(k, 0), d["share"])
for k, v in sorted(worst.items()):
    print("largest share %s M=%d: %.4f (1/M = %.4f)" % (k[0], k[1], v, 1 / k[1]))
EOF

# --- shard-pull CLI ------------------------------------------------------------
fy shard-pull "$S" --run $RUN --slice 'model.layers.0.self_attn.q_proj.weight@64:128' \
    --slice 'lm_head.weight@:,96:192' --exact-version 8 --out "$WORK/slices.safetensors" --json >"$WORK/sp.json"
check "shard-pull: version 8, some tiles fetched, far less than the version" json \
    "d['version']==8 and 0 < d['object_bytes'] < d['version_bytes']/2" <"$WORK/sp.json"
check "... its slices equal the step file's" $PY - "$WORK/slices.safetensors" "$(step 7)" <<'EOF'
import json, struct, sys
def load(p):
    b = open(p, "rb").read(); n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n])
    return {k: (v, b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]]) for k, v in h.items() if k != "__metadata__"}
s, full = load(sys.argv[1]), load(sys.argv[2])
ok = len(s) == 2
for name, (meta, data) in s.items():
    t, spec = name.split("@"); rr, cc = spec.split(",")
    r0, r1 = map(int, rr.split(":")); c0, c1 = map(int, cc.split(":"))
    fm, fd = full[t]; cols = fm["shape"][1]
    want = b"".join(fd[(r * cols + c0) * 2:(r * cols + c1) * 2] for r in range(r0, r1))
    ok = ok and data == want and meta["shape"] == [r1 - r0, c1 - c0]
sys.exit(0 if ok else 1)
EOF

# --- GC collects the orphans -----------------------------------------------------
fy gc "$S" --run $RUN --keep 2 --grace 0 -q
check "gc: the killed attempt's rank objects are gone" bash -c "! ls '$S/$RUN/v/' | grep -q '$orphan'"
check "... HEAD's version is kept and still pulls" bash -c \
    "timeout 60 '$FERRY' shard-pull '$S' --run $RUN --slice model.norm.weight --exact-version 8 -q"
# --- a signed sharded run -------------------------------------------------------
fy keygen -o "$WORK/trainer" >/dev/null
fy keygen -o "$WORK/mallory" >/dev/null 2>&1
mapfile -t F < <(steps 0 1)
pub 2 "$PUB" "$S" --run shard/signed --tile-words 256 --sign-key "$WORK/trainer.key" --json "${F[@]}" \
    >"$WORK/pubs.json" 2>"$WORK/pubs.err"
check "--sign-key: 2 ranks publish a signed run" [ "$(grep -c '"version"' "$WORK/pubs.json")" -eq 2 ]
check "... shard-pull --trust-key reads it" timeout 60 "$FERRY" shard-pull "$S" --run shard/signed \
    --slice model.norm.weight --trust-key "$WORK/trainer.pub" -q
rc=0; timeout 60 "$FERRY" shard-pull "$S" --run shard/signed --slice model.norm.weight \
    --trust-key "$WORK/mallory.pub" -q 2>"$WORK/mallory.err" || rc=$?
check "... another key: refused, exit 7 ($rc)" [ $rc -eq 7 ]
rc=0; timeout 60 "$FERRY" shard-pull "$S" --run $RUN --slice model.norm.weight \
    --trust-key "$WORK/trainer.pub" -q 2>"$WORK/unsigned.err" || rc=$?
check "... the unsigned run with a trusted key: refused, exit 7 ($rc)" [ $rc -eq 7 ]
finish
