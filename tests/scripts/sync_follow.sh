#!/usr/bin/env bash
# Done-when scenario: a publisher writes the ../shared/data/rl-a step
# sequence (9 checkpoints, one version every half second, anchors every 4)
# to a file:// store and to an s3:// store (s3rver on 127.0.0.1), while 4
# subscribers follow it with `ferry pull --follow`: two on file://, two on
# s3://, one of each started only after version 4 (it catches up).  Every
# subscriber must end holding bits identical to the last step file
# (`ferry stats LAST PULLED` reports 0 changed elements, and the model
# hashes are equal), having passed through intermediate versions.
set -u
TEST_NAME=sync_follow
source tests/tools/sync_env.sh

s3_rla_start
mkdir -p "$WORK/store" "$WORK/sub"
FS=$WORK/store
S3=s3://bkt/follow
step() { printf '%s/rl-a/step-%03d.safetensors' "$DATA" "$1"; }
LAST=$(step 8)

pids=()
# follow NAME STORE: a subscriber following the run until version 9.
follow() {
    fy pull "$2" --run rl-a --to "$WORK/sub/$1.safetensors" --follow --interval 0.2 --until-version 9 \
        --idle-timeout 60 --deadline 20 >"$WORK/$1.log" 2>&1 &
    pids+=($!)
    names+=("$1")
}
names=()
follow file-a "$FS"
follow s3-a "$S3"

pub_ok=0
for i in $(seq 0 8); do
    fy publish "$FS" --run rl-a "$(step "$i")" --anchor-every 4 --cache "$WORK/cache-fs.safetensors" -q && pub_ok=$((pub_ok + 1))
    fy publish "$S3" --run rl-a "$(step "$i")" --anchor-every 4 --cache "$WORK/cache-s3.safetensors" -q --deadline 20 &&
        pub_ok=$((pub_ok + 1))
    if [ "$i" -eq 3 ]; then
        follow file-late "$FS"
        follow s3-late "$S3"
    fi
    sleep 0.5
done
check "the publisher wrote 9 versions to each store" [ $pub_ok -eq 18 ]

for k in "${!pids[@]}"; do
    wait "${pids[$k]}"
    rc=$?
    n=${names[$k]}
    sed 's/^/    '"$n"' | /' "$WORK/$n.log" | tail -n 12
    seen=$(grep -c ': version [0-9]* (from' "$WORK/$n.log")
    check "$n: followed to version 9 (exit $rc, $seen updates)" [ $rc -eq 0 ]
    check "$n: saw intermediate versions" [ "$seen" -ge 2 ]
    check "$n: no object rejected" bash -c "! grep -q rejected '$WORK/$n.log'"
    check "$n: tensors bit-identical to the last step file" same_tensors "$LAST" "$WORK/sub/$n.safetensors"
    check "$n: same model hash as the last step file" same_model "$LAST" "$WORK/sub/$n.safetensors"
done
finish
