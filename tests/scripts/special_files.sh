#!/usr/bin/env bash
# Special files through the CLI (review of issue 23, items 6 and 17).
#  - Outputs: `ferry pull --to /dev/null` as root replaced the device node
#    with a regular file.  An existing output that is a FIFO, a directory, a
#    symbolic link or (as root) a character device is refused by pull --to,
#    apply -o and diff -o: the command fails at once, the
#    file stays what it was, nothing is left beside it.  The device is made
#    here, inside $WORK (mknod c 1 3): /dev is never touched.
#  - Inputs: a FIFO as a file store's HEAD or delta, or as a key file,
#    blocked pull, publish, log and mirror forever (past --deadline); each
#    now fails at once.  Every command runs under `timeout 20`: a hang is
#    exit 124, a failure of its case.
set -u
TEST_NAME=special_files
source tests/tools/sync_env.sh
sync_built || skip_all "sync layer or tools not built (NO_NET=1?)"

t() { timeout 20 "$FERRY" "$@"; }
# fails_fast NAME COMMAND...: the command fails (not 0) and does not hang
# (not 124); its stderr goes to $WORK/err.
fails_fast() {
    local name=$1 rc
    shift
    "$@" >/dev/null 2>"$WORK/err"
    rc=$?
    if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ]; then ok "$name (exit $rc)"; else bad "$name (exit $rc)"; cat "$WORK/err"; fi
}
kind() { stat -c %F "$1"; }
# untouched PATH KIND: PATH is still KIND and nothing was left beside it
untouched() {
    [ "$(kind "$1")" = "$2" ] || { echo "$1 is now $(kind "$1")"; return 1; }
    ! ls -d "$1".* >/dev/null 2>&1 || { ls -d "$1".*; return 1; }
}

st gen "$WORK/m" 3 4000 3 >/dev/null || { bad "generate models"; finish; exit 1; }
model() { printf '%s/m/m-%03d.safetensors' "$WORK" "$1"; }
O=$WORK/store
for i in 0 1; do fy publish "$O" --run r "$(model "$i")" -q || bad "publish $i"; done
fy diff "$(model 0)" "$(model 1)" -o "$WORK/p.patch" -q || bad "diff"

# ---- outputs ----
mkfifo "$WORK/fifo"
mkdir "$WORK/adir"
echo precious >"$WORK/target"
ln -s "$WORK/target" "$WORK/link"
outs=("$WORK/fifo" "$WORK/adir" "$WORK/link")
if [ "$(id -u)" = 0 ]; then
    mknod "$WORK/null" c 1 3 && outs+=("$WORK/null") || bad "mknod in $WORK"
else
    echo "note: not root: no device node made (mknod needs root)"
fi
for p in "${outs[@]}"; do
    k=$(kind "$p") n=$(basename "$p")
    fails_fast "pull --to $n ($k): refused" t pull "$O" --run r --to "$p" -q
    check "... the error names it and says why" grep -q "$p.*not a regular file" "$WORK/err"
    check "... still a $k, nothing beside it" untouched "$p" "$k"
    fails_fast "apply -o $n: refused" t apply "$(model 0)" "$WORK/p.patch" -o "$p" -q
    check "... still a $k, nothing beside it" untouched "$p" "$k"
    fails_fast "diff -o $n: refused" t diff "$(model 0)" "$(model 1)" -o "$p" -q
    check "... still a $k, nothing beside it" untouched "$p" "$k"
done
check "the link's target is untouched" grep -qx precious "$WORK/target"
# the state file beside PATH (PATH.ferry.json) a FIFO: refused before any download
mkfifo "$WORK/i.safetensors.ferry.json"
fails_fast "pull --to PATH whose state file is a FIFO: refused" t pull "$O" --run r --to "$WORK/i.safetensors" -q
check "... nothing written at PATH" test ! -e "$WORK/i.safetensors"
rm -f "$WORK/i.safetensors.ferry.json"
check "a regular PATH is still replaced" bash -c "fy pull '$O' --run r --to '$WORK/i.safetensors' -q && \
    fy publish '$O' --run r '$(model 2)' -q && fy pull '$O' --run r --to '$WORK/i.safetensors' -q"
check "... bit-identical" same_model "$(model 2)" "$WORK/i.safetensors"

# ---- inputs: FIFOs in a file store ----
cp -r "$O" "$WORK/sf"
rm "$WORK/sf/r/HEAD" && mkfifo "$WORK/sf/r/HEAD"
fails_fast "pull from a store whose HEAD is a FIFO: fails at once" t pull "$WORK/sf" --run r --to "$WORK/j.safetensors" -q
check "... the error names r/HEAD" grep -q "r/HEAD" "$WORK/err"
fails_fast "publish into it: fails at once" t publish "$WORK/sf" --run r "$(model 2)" -q
fails_fast "log of it: fails at once" t log "$WORK/sf" --run r
fails_fast "mirror from it: fails at once" t mirror "$WORK/sf" "$WORK/dst" --run r -q
fails_fast "mirror into it: fails at once" t mirror "$O" "$WORK/sf" --run r -q
check "... its HEAD is still a FIFO" test -p "$WORK/sf/r/HEAD"
cp -r "$O" "$WORK/sd"
d=$(ls "$WORK"/sd/r/v/00000000000000000002-*.patch)
rm "$d" && mkfifo "$d"
fails_fast "pull through a delta that is a FIFO: fails at once" t pull "$WORK/sd" --run r --to "$WORK/k.safetensors" -q
fails_fast "mirror of it: fails at once" t mirror "$WORK/sd" "$WORK/dst2" --run r -q

# ---- inputs: key files ----
fails_fast "--trust-key FIFO: refused at once" t pull "$O" --run r --to "$WORK/l.safetensors" --trust-key "$WORK/fifo" -q
check "... naming it" grep -q "$WORK/fifo" "$WORK/err"
fails_fast "--sign-key FIFO: refused at once" t publish "$O" --run r "$(model 2)" --sign-key "$WORK/fifo" -q
check "... naming it" grep -q "$WORK/fifo" "$WORK/err"
fails_fast "a patch that is a FIFO: refused at once" t apply "$(model 0)" "$WORK/fifo" -o "$WORK/out.safetensors" -q
fails_fast "inspect of a FIFO: refused at once" t inspect "$WORK/fifo"
check "the FIFO is still a FIFO" test -p "$WORK/fifo"
finish
