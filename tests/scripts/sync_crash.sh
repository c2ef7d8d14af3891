#!/usr/bin/env bash
# Crash safety of the sync protocol on a file:// store, with small models
# (three BF16 tensors, 60 000 elements) so that a publish or a pull takes
# tens of milliseconds and random SIGKILL delays land in every phase
# (startup, resume, diff, uploads, manifest, HEAD swap, download, apply,
# write, rename):
#   - 100 publishers killed at a random microsecond: after each kill HEAD
#     names a complete version (every object of its manifest present with
#     its size; the version pulled from nothing hashes as HEAD says), HEAD
#     never goes back, and the next publish succeeds one version up;
#     half of them keep a --cache file, which a kill may leave stale;
#   - 100 subscribers (file mode) killed at a random microsecond while
#     pulling a random version: the checkpoint is always a complete version
#     its state file records and the run's manifest confirms
#     (ferry pull --check), and nothing staged is left once a pull finishes;
#   - afterwards GC removes the orphans the killed publishers left and every
#     sampled version is still pullable.
# Every loop is bounded in count; every command has a time limit.
set -u
TEST_NAME=sync_crash
source tests/tools/sync_env.sh
sync_built || skip_all "sync layer or tools not built (NO_NET=1?)"
t0=$SECONDS

st gen "$WORK/m" 40 60000 7 >/dev/null || { bad "generate models"; finish; exit 1; }
S=$WORK/store
R=crash
model() { printf '%s/m/m-%03d.safetensors' "$WORK" $(($1 % 40)); }

# --- publishers killed ------------------------------------------------------
fy publish "$S" --run $R "$(model 0)" --anchor-every 5 -q || bad "first publish"
prev=1 advanced=0 unchanged=0 bad_head=0 backwards=0 bad_next=0
for i in $(seq 1 100); do
    cache=()
    ((i % 2)) && cache=(--cache "$WORK/pubcache.safetensors")
    "$FERRY" publish "$S" --run $R "$(model "$i")" --anchor-every 5 -q "${cache[@]}" >/dev/null 2>&1 &
    pid=$!
    sleep "$(random_us 160000)"
    kill -9 "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
    if ! h=$(st verify-head "$S" $R 2>>"$WORK/verify.err"); then
        bad_head=$((bad_head + 1))
        continue
    fi
    [ "$h" -lt "$prev" ] && backwards=$((backwards + 1))
    if [ "$h" -gt "$prev" ]; then advanced=$((advanced + 1)); else unchanged=$((unchanged + 1)); fi
    prev=$h
    if fy publish "$S" --run $R "$(model "$i")" --anchor-every 5 -q "${cache[@]}" 2>>"$WORK/next.err" &&
        h=$(st verify-head "$S" $R 2>>"$WORK/verify.err") && [ "$h" -eq $((prev + 1)) ]; then
        prev=$h
    else
        bad_next=$((bad_next + 1))
        h=$(st verify-head "$S" $R 2>/dev/null) && prev=$h
    fi
done
echo "    100 publishers killed: $unchanged before HEAD moved, $advanced after; HEAD is now version $prev"
[ -s "$WORK/verify.err" ] && sed 's/^/    | /' "$WORK/verify.err" | tail -5
[ -s "$WORK/next.err" ] && sed 's/^/    | /' "$WORK/next.err" | tail -5
check "after each kill HEAD named a complete, verifiable version" [ $bad_head -eq 0 ]
check "HEAD never went backwards" [ $backwards -eq 0 ]
check "the publish after each kill succeeded, one version up" [ $bad_next -eq 0 ]
check "kills landed before HEAD moved" [ $unchanged -gt 0 ]

# --- subscribers killed -----------------------------------------------------
mkdir -p "$WORK/sub"
P=$WORK/sub/policy.safetensors
fy pull "$S" --run $R --to "$P" --exact-version 1 -q || bad "first pull"
bad_ckpt=0 changed=0 same=0
for i in $(seq 1 100); do
    args=()
    ((i % 4)) && args=(--exact-version $((RANDOM % prev + 1)))
    before=$(sed -n 's/.*"version": *\([0-9]*\).*/\1/p' "$P.ferry.json" | head -n 1)
    "$FERRY" pull "$S" --run $R --to "$P" -q "${args[@]}" >/dev/null 2>&1 &
    pid=$!
    sleep "$(random_us 120000)"
    kill -9 "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
    if ! out=$(fy pull "$S" --run $R --to "$P" --check --json 2>>"$WORK/check.err"); then
        bad_ckpt=$((bad_ckpt + 1))
        continue
    fi
    now=$(sed -n 's/.*"version": \([0-9]*\).*/\1/p' <<<"$out")
    if [ "$now" = "$before" ]; then same=$((same + 1)); else changed=$((changed + 1)); fi
done
echo "    100 subscribers killed: $same left the checkpoint at its version, $changed after it switched"
[ -s "$WORK/check.err" ] && sed 's/^/    | /' "$WORK/check.err" | tail -5
check "after each kill the checkpoint was a complete, verified version" [ $bad_ckpt -eq 0 ]
check "kills landed before and after the switch" test $same -gt 0 -a $changed -gt 0
fy pull "$S" --run $R --to "$P" -q
check "a pull after the kills reaches HEAD" same_model "$P" "$(model 100)"
left=$(ls -A "$WORK/sub" | grep -cv -e '^policy.safetensors$' -e '^policy.safetensors.ferry.json$')
check "nothing staged is left beside the checkpoint (stale files removed)" [ "$left" -eq 0 ]

# --- the killed publishers' leftovers ---------------------------------------
orphans=$(fy gc "$S" --run $R --keep 100000 --grace 0 --dry-run --json | sed -n 's/.*"objects_deleted": \([0-9]*\).*/\1/p')
echo "    objects left by killed publishers (not on HEAD's lineage): $orphans"
check "GC removes the orphans and keeps every version" fy gc "$S" --run $R --keep 100000 --grace 0 -q
n=$(fy log "$S" --run $R --json | grep -o '"version": ' | wc -l)
check "the log lists all $prev versions" [ "$n" -eq "$prev" ]
bad_v=0
for v in $(seq 1 9 "$prev") "$prev"; do
    fy pull "$S" --run $R --to "$WORK/fresh-$v.safetensors" --exact-version "$v" -q 2>>"$WORK/fresh.err" || bad_v=$((bad_v + 1))
    rm -f "$WORK/fresh-$v.safetensors"*
done
check "sampled versions pull from nothing after GC" [ $bad_v -eq 0 ]
echo "    took $((SECONDS - t0)) s"
finish
