#!/usr/bin/env bash
# What a sharded version costs against the single-rank path (issue 24
# items 1 and 3), on the shared data at DEFAULT settings (tile grid min
# 262144 words, anchor every 10):
#   - rl-a (steps 0..8) and rl-b (steps 0..4) published twice: by 4 trainer
#     ranks (mpirun build/ferry-shard-mpi, rows split in 4) and by
#     `ferry publish` (one rank); for every delta version the 4 rank
#     objects together are at most 1.05 x the single-rank delta + 4 KiB per
#     rank;
#   - island groups of M = 2, 3, 4 ranks by rows and by columns (and the
#     fused layout, o_proj / down_proj by columns, at M = 2, 4)
#     (build/tools/shard_island, the layouts of tests/tools/shard_layout.h)
#     follow the sharded rl-a run; every rank of every group holds its
#     slices bit-identical after each version; where M divides R (rows,
#     M = 2, 4) the tile bytes a rank fetched per delta version are at most
#     (1/M + 0.05) x the single-rank delta of that version.  The other
#     splits are measured and printed ("note"), not judged: at the default
#     grid rl-a's 192-column tensors are single column blocks, so a column
#     or 3-way row split fetches the covering tiles (docs/SHARDING.md,
#     "Limits").  The manifest bytes each rank read are printed beside;
#   - issue 24 item 4: the ranged GETs per version of every island rank
#     are counted and printed (GETS: the most for one version); row splits
#     whose M divides R make at most R (with HEAD and the manifest, R + 2
#     GETs per version when following);
#   - issue 24 items 2 and 4 on rl-a and rl-b, rows and columns at M = 2,
#     3, 4: per delta version each island rank's manifest + tile index bytes
#     are at most max(8192, 0.02 x its object bytes), and its ranged GETs
#     at most R (docs/SHARDING.md "The tile index").
# The judging is tests/tools/shard_judge.py's (bench/shard_unseen.sh runs the
# same on other sequences). Prints "N passed, N failed" last; skips without mpirun or the data.
set -u
TEST_NAME=shard_cost
source tests/tools/sync_env.sh
PUB=${FERRY_BUILD:-$PWD/build}/ferry-shard-mpi
ISL=${FERRY_BUILD:-$PWD/build}/tools/shard_island
command -v mpirun >/dev/null 2>&1 || skip_all "no mpirun"
[ -x "$PUB" ] && [ -x "$ISL" ] && [ -x "$FERRY" ] || skip_all "no $PUB, $ISL or $FERRY (NO_MPI=1?)"
[ -f "$DATA/rl-a/step-008.safetensors" ] && [ -f "$DATA/rl-b/step-004.safetensors" ] || skip_all "no rl-a/rl-b data in $DATA"
source tests/tools/mpi_env.sh
S=file://$WORK/store
R=4

# --- parts against the single-rank delta ---------------------------------
for set in rl-a:8 rl-b:4; do
    name=${set%%:*} last=${set##*:}
    files=()
    for ((i = 0; i <= last; i++)); do files+=("$(printf '%s/%s/step-%03d.safetensors' "$DATA" "$name" "$i")"); done
    timeout 300 mpirun -np $R --oversubscribe "${MPIENV[@]}" "$PUB" "$S" --run "sh/$name" --json "${files[@]}" >"$WORK/sh-$name.jsonl" 2>"$WORK/sh-$name.err"
    check "$name: $R ranks publish $((last + 1)) versions at default settings" test $? = 0
    : >"$WORK/one-$name.jsonl"
    for f in "${files[@]}"; do fy publish "$S" --run "one/$name" --json "$f" >>"$WORK/one-$name.jsonl" || bad "$name: ferry publish $f"; done
    out=$($PY tests/tools/shard_judge.py parts "$WORK/sh-$name.jsonl" "$WORK/one-$name.jsonl" $R)
    echo "$out"
    tail=$(tail -n 1 <<<"$out")
    nd=$(awk '{print $6}' <<<"$tail")
    check "$name: parts of every delta version <= 1.05 x the single-rank delta + 4 KiB per rank ($tail)" \
        test "$(awk '{print $4}' <<<"$tail")" = 0 -a "${nd:-0}" -gt 0
done

# --- islands: rows and columns at M = 2, 3, 4 ---------------------------------
for L in rows cols fused; do
    for M in 2 3 4; do
        [ $L = fused ] && [ $M = 3 ] && continue
        : >"$WORK/isl-$L-$M.jsonl"
        for ((m = 0; m < M; m++)); do
            # its exit status also judges 1/M of the sharded objects; judged below against the single-rank delta
            timeout 300 "$ISL" "$S" sh/rl-a "$L" "$M" "$m" 9 "$DATA/rl-a" 60 >>"$WORK/isl-$L-$M.jsonl" 2>"$WORK/isl-$L-$M-$m.err"
        done
        out=$($PY tests/tools/shard_judge.py tiles "$WORK/isl-$L-$M.jsonl" "$WORK/one-rl-a.jsonl" "$M" $R)
        nrows=$(awk '{print $8}' <<<"$out")
        check "rl-a $L M=$M: every rank of $M holds its slices bit-identical after each of 9 versions" \
            test "$(grep -c '"identical": true' "$WORK/isl-$L-$M.jsonl")" = $((9 * M))
        if [ "$L" = rows ] && [ $((R % M)) = 0 ]; then
            check "rl-a $L M=$M: every rank makes at most R = $R ranged GETs per version ($(awk '{print $11, $12, $13, $14}' <<<"$out"))" \
                test "$(awk '{print $14}' <<<"$out")" = 0 -a "$(grep -c '"requests"' "$WORK/isl-$L-$M.jsonl")" = $((9 * M))
        fi
        if [ "$L" = rows ] && [ $((R % M)) = 0 ]; then
            # M divides R: an island rank's rows are whole rank objects
            check "rl-a rows M=$M: tile bytes per rank <= (1/M + 0.05) x single-rank delta ($out)" \
                test "$(awk '{print $6}' <<<"$out")" = 0 -a "${nrows:-0}" -ge $((8 * M))
        else
            # not met at the default grid on rl-a (docs/SHARDING.md "Limits"): measured, not judged
            echo "note rl-a $L M=$M: tile bytes per rank against the single-rank delta: $out"
        fi
    done
done

# --- issue 24 items 2 and 4: manifest + index bytes and GETs per island rank ----
# rl-a (the groups above) and rl-b, rows and columns at M = 2, 3, 4: for
# every delta version each rank's manifest_bytes (HEAD, the manifest, the
# tile index sections it read; the layout record is read once, at the cold
# start; the manifests above the version, which an island started after
# the publish walks through, subtracted: what a following island reads)
# <= max(8192, 0.02 x its object bytes), and at most R ranged GETs (HEAD
# and the manifest besides: R + 2).
for set in rl-a:9 rl-b:5; do
    name=${set%%:*} nv=${set##*:}
    for L in rows cols; do
        for M in 2 3 4; do
            f=$WORK/isl-$L-$M.jsonl
            if [ $name = rl-b ]; then
                f=$WORK/islb-$L-$M.jsonl
                : >"$f"
                for ((m = 0; m < M; m++)); do
                    timeout 300 "$ISL" "$S" sh/rl-b "$L" "$M" "$m" $nv "$DATA/rl-b" 60 >>"$f" 2>"$WORK/islb-$L-$M-$m.err"
                done
            fi
            out=$($PY tests/tools/shard_judge.py index "$f" "$WORK/sh-$name.jsonl" $R)
            echo "  $name $L M=$M: $out"
            nrows=$(awk '{print $15}' <<<"$out")
            check "$name $L M=$M: manifest + index bytes per rank per delta version <= max(8192, 0.02 x its object bytes) ($out)" \
                test "$(awk '{print $17}' <<<"$out")" = 0 -a "${nrows:-0}" -gt 0
            check "$name $L M=$M: at most R = $R ranged GETs per rank per delta version (+ HEAD + manifest)" \
                test "$(awk '{print $19}' <<<"$out")" = 0 -a "${nrows:-0}" -gt 0
            if [ $name = rl-b ]; then
                check "rl-b $L M=$M: every rank of $M holds its slices bit-identical after each of $nv versions" \
                    test "$(grep -c '"identical": true' "$f")" = $((nv * M))
            fi
        done
    done
done
finish
