#!/usr/bin/env bash
# ferry mirror on sharded runs (docs/MIRROR.md, "Sharded runs"): 2 trainer
# ranks (mpirun, build/ferry-shard-mpi) publish rl-a steps; the mirror
# copies each rank's objects verbatim after verifying every tile against
# the manifest-2 (SHA-256, checksum, base and target hashes), then the
# manifest, then HEAD; ferry shard-pull from the mirror gives the same
# slices as from the origin; a corrupt rank object upstream is refused with
# the mirror unchanged; GC of the mirror; shard islands with --fallback
# when the mirror is behind, corrupt or down; signed runs stay verifiable.
# Skips when mpirun or the programs are absent (NO_MPI=1 builds).
set -u
TEST_NAME=mirror_shard
source tests/tools/sync_env.sh
PUB=${FERRY_BUILD:-$PWD/build}/ferry-shard-mpi
command -v mpirun >/dev/null 2>&1 || skip_all "no mpirun"
[ -x "$PUB" ] || skip_all "no $PUB (NO_MPI=1?)"
sync_built || skip_all "sync layer or tools not built (NO_NET=1?)"
[ -f "$DATA/rl-a/step-004.safetensors" ] || skip_all "no rl-a data in $DATA"
source tests/tools/mpi_env.sh
O=$WORK/origin M=$WORK/mirror
step() { printf '%s/rl-a/step-%03d.safetensors' "$DATA" "$1"; }
pub() { # RUN STEP [options]: one version from 2 trainer ranks
    local run=$1 s=$2; shift 2
    timeout 300 mpirun -np 2 --oversubscribe "${MPIENV[@]}" "$PUB" "$O" --run "$run" --tile-words 256 --anchor-every 2 \
        "$@" "$(step "$s")" >/dev/null 2>"$WORK/pub.err" || { bad "publish $run step $s"; cat "$WORK/pub.err"; }
}
jfield() { sed -E "s/.*\"$1\": *([0-9]+).*/\1/" <<<"$2"; }
head_ver() { sed -nE 's/^ *"version": *([0-9]+).*/\1/p' "$1"; }
SLICES=(--slice 'model.layers.0.self_attn.q_proj.weight@64:128' --slice 'model.layers.1.mlp.down_proj.weight@:,0:96'
    --slice model.norm.weight --slice model.embed_tokens.weight)
same_pull() { # STORE-A STORE-B RUN [options]: shard-pull gives byte-identical slices
    local a=$1 b=$2 run=$3; shift 3
    rm -f "$WORK/a.safetensors" "$WORK/b.safetensors"
    fy shard-pull "$a" --run "$run" "${SLICES[@]}" --out "$WORK/a.safetensors" -q "$@" &&
        fy shard-pull "$b" --run "$run" "${SLICES[@]}" --out "$WORK/b.safetensors" -q "$@" &&
        cmp -s "$WORK/a.safetensors" "$WORK/b.safetensors"
}

pub sh 0                                        # version 1 (anchor)
out=$(fy mirror "$O" "$M" --run sh --json)
check "a sharded version is mirrored (2 rank anchors)" test "$(jfield versions_copied "$out")" = 1 -a "$(jfield objects_copied "$out")" = 2
pub sh 1; pub sh 2                              # 2 (delta), 3 (anchor)
out=$(fy mirror "$O" "$M" --run sh --json)
check "a mirror at 1 copies the chain 2..3" test "$(jfield first_copied "$out")" = 2 -a "$(head_ver "$M/sh/HEAD")" = 3
check "... byte for byte (manifests-2, rank objects, HEAD)" diff -r "$O/sh" "$M/sh"
check "shard-pull from the mirror: the slices of the origin, bit for bit" same_pull "$O" "$M" sh
check "... also at version 2" same_pull "$O" "$M" sh --exact-version 2

# a corrupt rank object upstream: refused; the mirror keeps version 3
pub sh 3                                        # 4 (delta)
p=$(ls "$O"/sh/v/00000000000000000004-*-r000001.patch)
cp "$p" "$WORK/good.patch"
printf '\xff' | dd of="$p" bs=1 seek=$(( $(stat -c %s "$p") / 2 )) conv=notrunc status=none
check_rc "a corrupt tile in rank 1's object upstream is refused (exit 6)" 6 fy mirror "$O" "$M" --run sh -q
check "... the mirror's HEAD is still 3" test "$(head_ver "$M/sh/HEAD")" = 3
check "... no manifest of 4 and no copy of the corrupt object" \
    bash -c "! ls '$M'/sh/v/00000000000000000004-*.json '$M/sh/v/$(basename "$p")' >/dev/null 2>&1"
check "... islands on the mirror get 3" same_pull "$M" "$M" sh --exact-version 3
cp "$WORK/good.patch" "$p"
out=$(fy mirror "$O" "$M" --run sh --json)
check "repaired: the next pass copies 4, reusing rank 0's object" \
    test "$(head_ver "$M/sh/HEAD")" = 4 -a "$(jfield objects_reused "$out")" = 1
check "... bit-identical pulls" same_pull "$O" "$M" sh

# an object with bytes no tile accounts for (the manifest declares them):
# refused before anything is written
pub x 0
"$PY" - "$O/x/v" <<'PYEOF' || bad "edit the manifest of run x"
import glob, json, sys
mf = [f for f in glob.glob(sys.argv[1] + "/*.json")][0]
d = json.load(open(mf))
d["objects"][0]["bytes"] += 16
open(sys.argv[1] + "/" + d["objects"][0]["key"].split("/")[-1], "ab").write(b"\0" * 16)
json.dump(d, open(mf, "w"))
PYEOF
check_rc "a rank object with 16 bytes no tile names is refused (exit 6)" 6 fy mirror "$O" "$WORK/mx" --run x -q
check "... nothing visible in the mirror" test ! -e "$WORK/mx/x/HEAD"

# GC on the mirror follows ferry_gc's rules for sharded runs
pub sh 4                                        # 5 (anchor)
out=$(fy mirror "$O" "$M" --run sh --keep 1 --grace 0 --json)
check "--keep 1 GCs the mirror's sharded versions below anchor 5" \
    test "$(jfield gc_deleted "$out")" -gt 0 -a -z "$(ls "$M"/sh/v/0000000000000000000[1-4]-* 2>/dev/null)"
check "... and shard-pull still matches the origin" same_pull "$O" "$M" sh

# shard islands with a store list (--fallback): the mirror behind, down,
# or serving a corrupt object; the slices are the origin's
pull_as_origin() { # ARGS...: shard-pull ARGS gives the origin's slices of its HEAD
    rm -f "$WORK/a.safetensors" "$WORK/b.safetensors"
    fy shard-pull "$O" --run sh "${SLICES[@]}" --out "$WORK/a.safetensors" -q &&
        fy shard-pull "$@" --run sh "${SLICES[@]}" --out "$WORK/b.safetensors" 2>"$WORK/fb.err" >/dev/null &&
        cmp -s "$WORK/a.safetensors" "$WORK/b.safetensors"
}
pub sh 5                                        # 6 (delta): the mirror is at 5
check_rc "the mirror behind: --min-version 6 from it alone fails (exit 4)" 4 \
    fy shard-pull "$M" --run sh "${SLICES[@]}" --min-version 6 -q
check "... with --fallback the origin serves 6" pull_as_origin "$M" --min-version 6 --fallback "$O"
check "... and says so" grep -q "served by the fallback" "$WORK/fb.err"
fy mirror "$O" "$M" --run sh -q || bad "mirror 6"
for f in "$M"/sh/v/00000000000000000006-*-r00000?.patch; do
    head -c "$(stat -c %s "$f")" /dev/urandom >"$f.x" && mv "$f.x" "$f"
done
check_rc "a corrupt object in the mirror: shard-pull from it alone fails (exit 6)" 6 \
    fy shard-pull "$M" --run sh "${SLICES[@]}" -q
check "... with --fallback the island gets the origin's slices" pull_as_origin "$M" --fallback "$O"
DEAD=$(free_port)
check "a mirror that is down (dead http:// port): --fallback" \
    pull_as_origin "http://127.0.0.1:$DEAD" --deadline 2 --fallback "$O"
# a hostile first store (review of issue 23): a file:// mirror whose HEAD is
# a FIFO (it blocked the read forever) or a symbolic link (an I/O error that
# ended the pull): the island moves on to the fallback
for h in fifo link; do
    mkdir -p "$WORK/m$h" && cp -r "$O/sh" "$WORK/m$h/" && rm "$WORK/m$h/sh/HEAD" || bad "copy for $h"
    if [ $h = fifo ]; then mkfifo "$WORK/m$h/sh/HEAD"; else ln -s "$O/sh/HEAD" "$WORK/m$h/sh/HEAD"; fi
    check "a mirror whose HEAD is a $h: --fallback gets the origin's slices" pull_as_origin "$WORK/m$h" --fallback "$O"
done

# signed: the mirror copies the signed manifest-2 and HEAD; islands verify
fy keygen -o "$WORK/trainer" >/dev/null && fy keygen -o "$WORK/other" >/dev/null || bad "keygen"
pub signed 0 --sign-key "$WORK/trainer.key"; pub signed 1 --sign-key "$WORK/trainer.key"
check "a mirror trusting the trainer copies a signed sharded run" \
    fy mirror "$O" "$M" --run signed --trust-key "$WORK/trainer.pub" -q
check "... shard-pull --trust-key from the mirror matches the origin" same_pull "$O" "$M" signed --trust-key "$WORK/trainer.pub"
check_rc "a mirror trusting another key refuses it (exit 7)" 7 \
    fy mirror "$O" "$WORK/m2" --run signed --trust-key "$WORK/other.pub" -q
check "... and writes no HEAD" test ! -e "$WORK/m2/signed/HEAD"
finish
