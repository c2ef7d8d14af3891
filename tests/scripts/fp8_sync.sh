#!/usr/bin/env bash
# FP8 runs (issue 25, include/ferry_quant.h): `ferry publish --quantize`
# publishes each version of the rl-a sequence as its FP8 checkpoint, and an
# island pulling with `ferry pull --to` holds, at every version, byte for
# byte the file `ferry quantize` writes from the same BF16 checkpoint (with
# --prev the previous one under the sticky scheme): through deltas, through
# anchors, from scratch, from a mirror, and signed.  A publisher resuming
# the run from the store or its --cache quantizes against the same previous
# model; one resuming under another scheme (or none) is refused, HEAD
# unchanged.
set -u
TEST_NAME=fp8_sync
source tests/tools/sync_env.sh
sync_built || skip_all "sync layer or tools not built (NO_NET=1?)"
[ -f "$DATA/rl-a/step-004.safetensors" ] || skip_all "no rl-a data in $DATA"

step() { printf '%s/rl-a/step-%03d.safetensors' "$DATA" "$1"; }
head_version() { sed -nE 's/^ *"version": *([0-9]+).*/\1/p' "$1/HEAD"; }

# ref SCHEME I: the FP8 checkpoint of step I, as `ferry quantize` writes it
# ($WORK/ref-SCHEME-I; sticky: against ref of I-1).
ref() {
    local out=$WORK/ref-$1-$2.safetensors prev=()
    [ -f "$out" ] && { echo "$out"; return; }
    [ "$1" = fp8-block128-sticky ] && [ "$2" -gt 0 ] && prev=(--prev "$WORK/ref-$1-$(($2 - 1)).safetensors")
    fy quantize "$(step "$2")" "$out" --scheme "$1" "${prev[@]}" >/dev/null || bad "ferry quantize $1 step $2"
    echo "$out"
}

for S in fp8-block128 fp8-block128-sticky; do
    O=$WORK/origin-$S
    isl=$WORK/island-$S.safetensors
    # versions 1..4 (anchors 1 and 4); one island follows every version
    for i in 0 1 2 3; do
        fy publish "$O" --run r "$(step $i)" --quantize "$S" --anchor-every 3 -q || bad "$S: publish step $i"
        fy pull "$O" --run r --to "$isl" -q || bad "$S: pull version $((i + 1))"
        check "$S: the island at version $((i + 1)) is byte for byte ferry quantize of step $i" cmp -s "$isl" "$(ref "$S" $i)"
    done
    check "$S: version 4 is an anchor: an FP8 checkpoint, byte for byte ferry quantize of step 3" \
        cmp -s "$(ls "$O"/r/v/00000000000000000004-*.safetensors)" "$(ref "$S" 3)"
    d=$(stat -c %s "$O"/r/v/00000000000000000002-*.patch)
    check "$S: a delta ($d bytes) is a patch between FP8 models: under 5% of the FP8 checkpoint" \
        test "$d" -gt 0 -a "$((d * 20))" -lt "$(stat -c %s "$(ref "$S" 1)")"
    fy pull "$O" --run r --to "$WORK/fresh-$S.safetensors" --exact-version 3 -q || bad "$S: fresh island to 3"
    check "$S: a fresh island at version 3 (anchor 1 + deltas)" cmp -s "$WORK/fresh-$S.safetensors" "$(ref "$S" 2)"

    # resuming under another scheme: refused before anything is written
    for other in none fp8-block128 fp8-block128-sticky; do
        [ "$other" = "$S" ] && continue
        q=(--quantize "$other")
        [ "$other" = none ] && q=()
        err=$(fy publish "$O" --run r "$(step 4)" "${q[@]}" -q 2>&1)
        check "$S: a publisher with quantize $other is refused, naming both schemes" \
            grep -q "published with quantize '$S'.*quantize is '$other'" <<<"$err"
        check "$S: ... HEAD still at version 4" test "$(head_version "$O/r")" = 4
    done
    # the next publisher (a new process) resumes from the store
    fy publish "$O" --run r "$(step 4)" --quantize "$S" --anchor-every 3 --verify -q || bad "$S: publish step 4"
    fy pull "$O" --run r --to "$isl" -q || bad "$S: pull version 5"
    check "$S: resumed from the store (--verify): version 5 is ferry quantize of step 4" cmp -s "$isl" "$(ref "$S" 4)"

    # a mirror of the FP8 run serves the same bits
    M=$WORK/mirror-$S
    fy mirror "$O" "$M" --run r -q || bad "$S: mirror"
    fy pull "$M" --run r --to "$WORK/m-$S.safetensors" -q || bad "$S: pull from the mirror"
    check "$S: an island pulling from the mirror holds version 5" cmp -s "$WORK/m-$S.safetensors" "$(ref "$S" 4)"
    check "$S: ... a verified version (--check)" fy pull "$M" --run r --to "$WORK/m-$S.safetensors" --check -q
done

# --cache: the publisher keeps the FP8 model it published and resumes from it
C=$WORK/cached
for i in 0 1 2; do
    fy publish "$C" --run r "$(step $i)" --quantize fp8-block128-sticky --cache "$WORK/cache.safetensors" -q || bad "cached publish $i"
done
check "--cache holds the published FP8 model" cmp -s "$WORK/cache.safetensors" "$(ref fp8-block128-sticky 2)"
fy pull "$C" --run r --to "$WORK/c.safetensors" -q || bad "pull cached run"
check "... and islands the same" cmp -s "$WORK/c.safetensors" "$(ref fp8-block128-sticky 2)"

# a signed FP8 run
fy keygen -o "$WORK/trainer" >/dev/null || bad "keygen"
K=(--sign-key "$WORK/trainer.key") T=(--trust-key "$WORK/trainer.pub")
G=$WORK/signed
for i in 0 1 2; do
    fy publish "$G" --run r "$(step $i)" --quantize fp8-block128 "${K[@]}" -q || bad "signed publish $i"
    fy pull "$G" --run r --to "$WORK/s.safetensors" "${T[@]}" -q || bad "signed pull $i"
    check "signed: the island trusting the key at version $((i + 1)) holds ferry quantize of step $i" \
        cmp -s "$WORK/s.safetensors" "$(ref fp8-block128 $i)"
done
fy mirror "$G" "$WORK/smirror" --run r "${T[@]}" -q || bad "signed mirror"
fy pull "$WORK/smirror" --run r --to "$WORK/sm.safetensors" "${T[@]}" -q || bad "pull from the signed mirror"
check "signed: from the mirror too" cmp -s "$WORK/sm.safetensors" "$(ref fp8-block128 2)"

check_rc "an unknown scheme is a usage error (exit 2)" 2 fy publish "$WORK/x" --run r "$(step 0)" --quantize fp4 -q
check "... nothing published" test ! -e "$WORK/x/r/HEAD"
finish
