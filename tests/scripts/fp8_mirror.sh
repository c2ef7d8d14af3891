#!/usr/bin/env bash
# Mirrors of FP8 runs (issue 25; docs/MIRROR.md): `ferry publish --quantize
# fp8-block128` publishes rl-a steps 0..8 (signed, anchors every 3) while
# `ferry mirror --follow` copies the run as it grows; then
#   - the mirror holds the run byte for byte (FP8 anchors, FP8 deltas,
#     manifests, HEAD);
#   - an island pulling from the mirror, version after version (FP8 deltas
#     applied to its FP8 checkpoint), holds at each version byte for byte
#     what an island pulling from the origin holds, and that is `ferry
#     quantize` of the step; fresh islands at any version too;
#   - a mirror of the mirror, and a mirror started late (at the anchor of
#     HEAD), serve the same bits to islands that trust the trainer's key;
#   - a compacted FP8 delta is mirrored and an island far behind catches up
#     from the mirror in one patch, byte-identical to the origin pull;
#   - a corrupt FP8 delta upstream is refused (exit 7 by its signed digest;
#     exit 6 by a mirror that trusts no key, the patch not verifying), the
#     mirror keeping its version; once repaired the next pass copies it;
#   - a sharded FP8 run (mpirun -np 2 ferry-shard-mpi --quantize, when
#     available): mirrored byte for byte, and `ferry shard-pull` from the
#     mirror gives the origin's tensors (codes, scales, BF16 tensors).
set -u
TEST_NAME=fp8_mirror
source tests/tools/sync_env.sh
sync_built || skip_all "sync layer or tools not built (NO_NET=1?)"
[ -f "$DATA/rl-a/step-008.safetensors" ] || skip_all "no rl-a data in $DATA"

step() { printf '%s/rl-a/step-%03d.safetensors' "$DATA" "$1"; }
head_version() { sed -nE 's/^ *"version": *([0-9]+).*/\1/p' "$1/HEAD"; }
jfield() { sed -E "s/.*\"$1\": *([0-9]+).*/\1/" <<<"$2"; }
jstr() { sed -E "s/.*\"$1\": *\"([^\"]*)\".*/\1/" <<<"$2"; }
# ref I: the FP8 checkpoint of step I, as `ferry quantize` writes it
ref() {
    local out=$WORK/ref-$1.safetensors
    [ -f "$out" ] || fy quantize "$(step "$1")" "$out" >/dev/null || bad "ferry quantize step $1"
    echo "$out"
}

fy keygen -o "$WORK/trainer" >/dev/null || bad "keygen"
K=(--sign-key "$WORK/trainer.key") T=(--trust-key "$WORK/trainer.pub")
O=$WORK/origin M=$WORK/mirror
pub() { fy publish "$O" --run r "$(step "$1")" --quantize fp8-block128 --anchor-every 3 "${K[@]}" -q || bad "publish step $1"; }

# ---- a mirror following the run while it is published -----------------------
pub 0
timeout 300 "$FERRY" mirror "$O" "$M" --run r --follow --until-version 9 --poll-ms 20 "${T[@]}" -q 2>"$WORK/follow.err" &
follow=$!
for i in 1 2 3 4 5 6 7 8; do pub "$i"; done
wait "$follow"
rc=$?
check "ferry mirror --follow copied the FP8 run up to version 9 (exit $rc)" test "$rc" -eq 0 -a "$(head_version "$M/r")" = 9
check "... byte for byte: FP8 anchors, FP8 deltas, manifests, HEAD" diff -r "$O/r" "$M/r"
check "... the anchors are FP8 checkpoints (version 7: ferry quantize of step 6)" \
    cmp -s "$(ls "$M"/r/v/00000000000000000007-*.safetensors)" "$(ref 6)"

# ---- islands: from the mirror as from the origin ------------------------------
same_all=1
for v in 1 2 3 4 5 6 7 8 9; do
    fy pull "$M" --run r --to "$WORK/im.safetensors" --exact-version "$v" "${T[@]}" -q || { same_all=0; echo "pull $v from the mirror"; }
    fy pull "$O" --run r --to "$WORK/io.safetensors" --exact-version "$v" "${T[@]}" -q || { same_all=0; echo "pull $v from the origin"; }
    cmp -s "$WORK/im.safetensors" "$WORK/io.safetensors" || { same_all=0; echo "version $v: mirror and origin pulls differ"; }
    cmp -s "$WORK/im.safetensors" "$(ref $((v - 1)))" || { same_all=0; echo "version $v: not ferry quantize of step $((v - 1))"; }
done
check "an island following the mirror version by version holds at each version the origin pull's bytes (= ferry quantize)" \
    test "$same_all" = 1
for v in 2 5 9; do
    fy pull "$M" --run r --to "$WORK/fm$v.safetensors" --exact-version "$v" "${T[@]}" -q || bad "fresh pull $v from the mirror"
    fy pull "$O" --run r --to "$WORK/fo$v.safetensors" --exact-version "$v" "${T[@]}" -q || bad "fresh pull $v from the origin"
    check "a fresh island at version $v: mirror pull = origin pull, byte for byte" \
        cmp -s "$WORK/fm$v.safetensors" "$WORK/fo$v.safetensors"
done
check "... verified against the signed manifests (--check)" fy pull "$M" --run r --to "$WORK/fm9.safetensors" --check "${T[@]}" -q

# ---- a mirror of the mirror; a mirror that starts late -----------------------
fy mirror "$M" "$WORK/m2" --run r "${T[@]}" -q || bad "mirror of the mirror"
fy pull "$WORK/m2" --run r --to "$WORK/i2.safetensors" "${T[@]}" -q || bad "pull from the second mirror"
check "a mirror of the mirror: islands get the origin pull's bytes" cmp -s "$WORK/i2.safetensors" "$WORK/fo9.safetensors"
out=$(fy mirror "$O" "$WORK/late" --run r "${T[@]}" --json) || bad "late mirror"
check "a mirror started late begins at the anchor of HEAD (7)" test "$(jfield first_copied "$out")" = 7
fy pull "$WORK/late" --run r --to "$WORK/il.safetensors" "${T[@]}" -q || bad "pull from the late mirror"
check "... its islands get the origin pull's bytes" cmp -s "$WORK/il.safetensors" "$WORK/fo9.safetensors"

# ---- a compacted FP8 delta ----------------------------------------------------
fy pull "$M" --run r --to "$WORK/behind.safetensors" --exact-version 2 "${T[@]}" -q || bad "island at 2"
fy compact "$O" --run r --from 2 --to 9 "${K[@]}" -q || bad "compact 2..9"
out=$(fy mirror "$O" "$M" --run r "${T[@]}" --json) || bad "mirror the compaction"
check "the compacted FP8 delta 2..9 is mirrored" test "$(jfield compactions_copied "$out")" = 1
check "... the index byte for byte" cmp -s "$O/r/compactions.json" "$M/r/compactions.json"
out=$(fy pull "$M" --run r --to "$WORK/behind.safetensors" "${T[@]}" --json)
check "an island at 2 catches up from the mirror in one patch ($(jstr route "$out"))" grep -q '"route": "compacted 2..9"' <<<"$out"
check "... byte for byte the origin pull" cmp -s "$WORK/behind.safetensors" "$WORK/fo9.safetensors"

# ---- a corrupt FP8 delta upstream ---------------------------------------------
pub 7                                           # version 10 (anchor): step 7 again
fy mirror "$O" "$M" --run r "${T[@]}" -q || bad "mirror version 10"
pub 6                                           # version 11: step 6
d=$(ls "$O"/r/v/00000000000000000011-*.patch)
cp "$d" "$WORK/good.patch"
printf '\xff' | dd of="$d" bs=1 seek=$(( $(stat -c %s "$d") / 2 )) conv=notrunc status=none
check_rc "a corrupt FP8 delta upstream is refused (exit 7: not the SHA-256 its signed manifest gives)" 7 \
    fy mirror "$O" "$M" --run r "${T[@]}" -q 2>/dev/null
check_rc "... also by a mirror that trusts no key (exit 6: the patch does not decode or verify)" 6 \
    fy mirror "$O" "$WORK/unsigned-mirror" --run r -q 2>/dev/null
check "... the mirror's HEAD stops at 10" test "$(head_version "$M/r")" = 10
check "... the corrupt object is not in the mirror" test ! -e "$M/r/v/$(basename "$d")"
fy pull "$M" --run r --to "$WORK/i10.safetensors" "${T[@]}" -q || bad "pull 10 from the mirror"
check "... islands on the mirror get version 10 (ferry quantize of step 7)" cmp -s "$WORK/i10.safetensors" "$(ref 7)"
cp "$WORK/good.patch" "$d"
fy mirror "$O" "$M" --run r "${T[@]}" -q || bad "mirror after the repair"
fy pull "$M" --run r --to "$WORK/i10.safetensors" "${T[@]}" -q || bad "pull 11 from the mirror"
check "repaired: the next pass copies 11; islands get ferry quantize of step 6" \
    test "$(head_version "$M/r")" = 11 -a -n "$(cmp "$WORK/i10.safetensors" "$(ref 6)" && echo same)"

# ---- a sharded FP8 run ----------------------------------------------------------
PUB=${FERRY_BUILD:-$PWD/build}/ferry-shard-mpi
if command -v mpirun >/dev/null 2>&1 && [ -x "$PUB" ]; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    export OMPI_MCA_btl=self,vader OMPI_MCA_btl_tcp_if_include=lo OMPI_MCA_oob_tcp_if_include=lo
    export OMPI_MCA_rmaps_base_oversubscribe=1
    MPIENV=()
    if [ "${SAN:-}" = 1 ]; then # as shard_mpi.sh: Open MPI's own allocations are not ours
        printf 'leak:%s\n' libmpi.so libopen-pal.so libopen-rte.so libpmix.so libhwloc.so libevent \
            '<unknown module>' >"$WORK/lsan.supp"
        MPIENV=(env ASAN_OPTIONS=fast_unwind_on_malloc=0 LSAN_OPTIONS=suppressions=$WORK/lsan.supp)
    fi
    S=$WORK/sorigin SM=$WORK/smirror
    spub() {
        timeout 300 mpirun -np 2 --oversubscribe "${MPIENV[@]}" "$PUB" "$S" --run sh --quantize fp8-block128 --anchor-every 2 \
            "$(step "$1")" >/dev/null 2>"$WORK/spub.err" || { bad "sharded publish step $1"; cat "$WORK/spub.err"; }
    }
    # every tensor of the FP8 model, whole
    slices=$("$PY" - "$(ref 0)" <<'EOF'
import json, struct, sys
with open(sys.argv[1], "rb") as f:
    h = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
h.pop("__metadata__", None)
print(" ".join("--slice %s" % n for n in sorted(h)))
EOF
)
    spub 0; spub 1
    fy mirror "$S" "$SM" --run sh -q || bad "mirror the sharded FP8 run"
    spub 2                                      # version 3 (anchor)
    fy mirror "$S" "$SM" --run sh -q || bad "mirror the sharded FP8 run again"
    check "a sharded FP8 run is mirrored byte for byte (manifests-2, rank objects, HEAD)" diff -r "$S/sh" "$SM/sh"
    for v in 2 3; do
        # shellcheck disable=SC2086
        fy shard-pull "$SM" --run sh $slices --exact-version "$v" --out "$WORK/sm$v.safetensors" -q || bad "shard-pull $v from the mirror"
        # shellcheck disable=SC2086
        fy shard-pull "$S" --run sh $slices --exact-version "$v" --out "$WORK/so$v.safetensors" -q || bad "shard-pull $v from the origin"
        check "shard-pull at version $v: every FP8 tensor (codes, scales, BF16 ones) from the mirror = from the origin" \
            cmp -s "$WORK/sm$v.safetensors" "$WORK/so$v.safetensors"
    done
    check "... and those are ferry quantize of the step (FP8 codes and scales of version 3)" "$PY" - "$WORK/sm3.safetensors" "$(ref 2)" <<'EOF'
import json, struct, sys
def read(p):
    d = open(p, "rb").read()
    n = struct.unpack("<Q", d[:8])[0]
    h = json.loads(d[8:8 + n]); h.pop("__metadata__", None)
    return {k.split("@")[0]: d[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]] for k, v in h.items()}
a, b = read(sys.argv[1]), read(sys.argv[2])
assert sorted(a) == sorted(b), (sorted(a)[:4], sorted(b)[:4])
assert all(a[k] == b[k] for k in b), [k for k in b if a[k] != b[k]][:4]
assert any(k.endswith("_scale_inv") for k in b)
EOF
else
    echo "skip the sharded FP8 mirror: no mpirun or no $PUB"
fi
finish
