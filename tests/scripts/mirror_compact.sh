#!/usr/bin/env bash
# ferry mirror and compacted deltas (docs/MIRROR.md, "Compacted deltas"):
# the index is copied verbatim with every compacted delta whose target the
# mirror holds, each verified first; an island far behind catches up from
# the mirror in one compacted patch; a corrupt compacted delta upstream is
# refused and the mirror's index stays as it was; a compaction that adds no
# version is still picked up; signed indexes stay signed (also after the
# mirror's GC).
set -u
TEST_NAME=mirror_compact
source tests/tools/sync_env.sh
sync_built || skip_all "sync layer or tools not built (NO_NET=1?)"

st gen "$WORK/m" 16 40000 3 >/dev/null || { bad "generate models"; finish; exit 1; }
model() { printf '%s/m/m-%03d.safetensors' "$WORK" "$1"; }
O=$WORK/origin M=$WORK/mirror
jfield() { sed -E "s/.*\"$1\": *([0-9]+).*/\1/" <<<"$2"; }
jstr() { sed -E "s/.*\"$1\": *\"([^\"]*)\".*/\1/" <<<"$2"; }
pub() { fy publish "$O" --run r "$(model "$1")" --anchor-every 10 -q "${@:2}" || bad "publish $1"; }

pub 0; pub 1                                   # versions 1 (anchor), 2
fy pull "$O" --run r --to "$WORK/late.safetensors" -q || bad "island at 2"
for i in $(seq 2 13); do pub "$i"; done        # up to 14; anchors 1, 11
fy compact "$O" --run r --from 2 --to 12 -q || bad "compact 2..12"
out=$(fy mirror "$O" "$M" --run r --json)
check "an empty mirror starts at the anchor of HEAD (11)" test "$(jfield first_copied "$out")" = 11
check "... and copies the compacted delta 2..12 (its target, 12, is mirrored)" test "$(jfield compactions_copied "$out")" = 1
check "... and the index, byte for byte" cmp -s "$O/r/compactions.json" "$M/r/compactions.json"
check "... the compacted object byte for byte" diff -r "$O/r/c" "$M/r/c"
out=$(fy mirror "$O" "$M" --run r --json)
check "a second pass copies nothing (same index)" test "$(jfield index_copied "$out")" = 0 -a "$(jfield bytes_copied "$out")" -lt 2000

# the island far behind (at 2; the mirror holds 11..14 only): one patch
out=$(fy pull "$M" --run r --to "$WORK/late.safetensors" --json)
check "an island at 2 pulling from the mirror takes the compacted route ($(jstr route "$out"))" \
    grep -q '"route": "compacted 2..12 + chain 12..14"' <<<"$out"
check "... nothing rejected" test "$(jfield rejected "$out")" = 0
full=$(stat -c %s "$O"/r/v/00000000000000000011-*.safetensors)
check "... fetching less than the anchor alone ($(jfield bytes_fetched "$out") < $full bytes)" \
    test "$(jfield bytes_fetched "$out")" -lt "$full"
check "... bit-identical to version 14" same_model "$(model 13)" "$WORK/late.safetensors"

# a compaction adds no version: the next pass still copies it
fy compact "$O" --run r --from 11 --to 14 -q || bad "compact 11..14"
out=$(fy mirror "$O" "$M" --run r --json)
check "a compaction without a new version is mirrored" \
    test "$(jfield versions_copied "$out")" = 0 -a "$(jfield index_copied "$out")" = 1 -a "$(jfield compactions_copied "$out")" = 1
check "... index byte for byte" cmp -s "$O/r/compactions.json" "$M/r/compactions.json"

# a corrupt compacted delta upstream: refused, the mirror's index unchanged
cp "$M/r/compactions.json" "$WORK/index.before"
pub 14                                          # 15
fy compact "$O" --run r --from 12 --to 15 -q || bad "compact 12..15"
c=$(ls "$O"/r/c/00000000000000000012-00000000000000000015-*.patch)
cp "$c" "$WORK/good.patch"
printf '\xff' | dd of="$c" bs=1 seek=100 conv=notrunc status=none
check_rc "a corrupt compacted delta upstream is refused (exit 6)" 6 fy mirror "$O" "$M" --run r -q
check "... the mirror's index is unchanged" cmp -s "$WORK/index.before" "$M/r/compactions.json"
check "... the corrupt object is not in the mirror" test ! -e "$M/r/c/$(basename "$c")"
check "... the version itself was copied (HEAD 15)" grep -q '"version": 15' "$M/r/HEAD"
check "... an island still syncs from the mirror" fy pull "$M" --run r --to "$WORK/i2.safetensors" -q
check "... bit-identical" same_model "$(model 14)" "$WORK/i2.safetensors"
check "... --follow --until-version 15 stops (the version is served) instead of polling on" \
    timeout 15 "$FERRY" mirror "$O" "$M" --run r --follow --until-version 15 --poll-ms 50 --for 60 -q
cp "$WORK/good.patch" "$c"
check "repaired upstream: the next pass copies it" fy mirror "$O" "$M" --run r -q
check "... index byte for byte" cmp -s "$O/r/compactions.json" "$M/r/compactions.json"

# a signed run: the index is the trainer's signed bytes; GC on the mirror
# (--keep) leaves it signed; an island trusting the key takes the shortcut
fy keygen -o "$WORK/trainer" >/dev/null || bad "keygen"
K=(--sign-key "$WORK/trainer.key") T=(--trust-key "$WORK/trainer.pub")
spub() { fy publish "$O" --run s "$(model "$1")" --anchor-every 10 "${K[@]}" -q || bad "signed publish $1"; }
spub 0; spub 1
fy pull "$O" --run s --to "$WORK/slate.safetensors" "${T[@]}" -q || bad "signed island at 2"
for i in $(seq 2 13); do spub "$i"; done
fy compact "$O" --run s --from 2 --to 12 "${K[@]}" -q || bad "signed compact"
# ends below what the mirror holds: GC would drop it from an index it rewrote
fy compact "$O" --run s --from 2 --to 5 "${K[@]}" -q || bad "signed compact 2..5"
check "a mirror trusting the key copies the signed index and GCs (--keep 3)" \
    fy mirror "$O" "$M" --run s --keep 3 --grace 0 "${T[@]}" -q
check "... the index (two entries, one not mirrored) is the trainer's signed bytes" cmp -s "$O/s/compactions.json" "$M/s/compactions.json"
spub 14
check "... after another pass with GC too" fy mirror "$O" "$M" --run s --keep 3 --grace 0 "${T[@]}" -q
check "... still the trainer's bytes" cmp -s "$O/s/compactions.json" "$M/s/compactions.json"
out=$(fy pull "$M" --run s --to "$WORK/slate.safetensors" "${T[@]}" --json)
check "an island trusting the key takes the compacted route from the mirror" grep -q '"route": "compacted 2..12' <<<"$out"
check "... bit-identical to version 15" same_model "$(model 14)" "$WORK/slate.safetensors"
fy keygen -o "$WORK/other" >/dev/null || bad "keygen other"
check_rc "a mirror trusting another key refuses the signed run (exit 7)" 7 \
    fy mirror "$O" "$WORK/m3" --run s --trust-key "$WORK/other.pub" -q
finish
