#!/usr/bin/env bash
# Sharded publish and sliced pull on s3:// (s3rver 3.7.1 on 127.0.0.1):
# 2 trainer ranks under mpirun publish step-000..002 as versions 1..3, two
# island processes (rows, M = 2) follow them through ranged GETs, each
# region bit-identical to the sliced step file and each rank's fetch at
# most 1/2 of the versions' objects + 5%; `ferry log` reads the run.
# Skips without mpirun, node/s3rver or the programs.
set -u
TEST_NAME=shard_s3
source tests/tools/sync_env.sh
PUB=${FERRY_BUILD:-$PWD/build}/ferry-shard-mpi
ISL=${FERRY_BUILD:-$PWD/build}/tools/shard_island
command -v mpirun >/dev/null 2>&1 || skip_all "no mpirun"
[ -x "$PUB" ] && [ -x "$ISL" ] || skip_all "no $PUB or $ISL (NO_MPI=1?)"
s3_rla_start
source tests/tools/mpi_env.sh
U=s3://bkt/ferry
step() { printf '%s/rl-a/step-%03d.safetensors' "$DATA" "$1"; }
for k in 0 1; do
    timeout 300 "$ISL" $U shard/s3 rows 2 $k 3 "$DATA/rl-a" 200 >"$WORK/isl-$k.log" 2>&1 &
    eval "ISL$k=\$!"
done
timeout 300 mpirun -np 2 --oversubscribe "${MPIENV[@]}" "$PUB" $U --run shard/s3 --tile-words 1024 --deadline 60 --json \
    "$(step 0)" "$(step 1)" "$(step 2)" >"$WORK/pub.json" 2>"$WORK/pub.err"
check "2 ranks publish 3 versions to s3://" [ "$(grep -c '"version"' "$WORK/pub.json")" -eq 3 ]
[ "$(grep -c '"version"' "$WORK/pub.json")" -eq 3 ] || tail -n 5 "$WORK/pub.err"
for k in 0 1; do
    eval "pid=\$ISL$k"
    wait "$pid"
    rc=$?
    check "island rows-$k: 3 versions through ranged GETs, bit-identical, within 1/2 + 5% (exit $rc)" \
        [ $rc -eq 0 ] && [ "$(grep -c '"identical": true, ' "$WORK/isl-$k.log")" -eq 3 ]
    [ $rc -eq 0 ] || tail -n 5 "$WORK/isl-$k.log"
done
fy log $U --run shard/s3 --json >"$WORK/log.json"
check "log of the sharded run on s3://: HEAD 3" $PY -c "import json,sys; sys.exit(0 if json.load(open('$WORK/log.json'))['head']==3 else 1)"
finish
