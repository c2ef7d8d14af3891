#!/usr/bin/env bash
# Issue 23 item 12: `ferry pull --follow` on an unsigned file:// run whose
# HEAD a store writer replaces, in turn, by an object over the records'
# bound (2 MiB), by malformed JSON, and by a symbolic link (to a valid copy
# of HEAD outside the store, which a file:// store never follows): the
# follower reports each, keeps its version, and follows again once HEAD is
# restored (it used to exit at the first one).
set -u
TEST_NAME=sync_follow_bad_head
source tests/tools/sync_env.sh

sync_built || skip_all "sync layer or tools not built (NO_NET=1?)"
S=$WORK/store
U=file://$S
st gen "$WORK/m" 4 20000 5 >/dev/null
m() { printf '%s/m/m-%03d.safetensors' "$WORK" "$1"; }
ok_pub=0
for i in 0 1; do fy publish $U --run rl "$(m $i)" -q && ok_pub=$((ok_pub + 1)); done
check "versions 1 and 2 published" [ $ok_pub -eq 2 ]
cp "$S/rl/HEAD" "$WORK/head2"

fy pull $U --run rl --to "$WORK/island.safetensors" --follow --interval 0.1 --until-version 3 --idle-timeout 60 \
    >"$WORK/follow.out" 2>"$WORK/follow.err" &
FPID=$!
for i in $(seq 1 100); do grep -q "version 2" "$WORK/follow.out" 2>/dev/null && break; sleep 0.1; done
check "the follower holds version 2" grep -q "version 2" "$WORK/follow.out"

alive() { kill -0 $FPID 2>/dev/null; }
head -c $((2 << 20)) /dev/zero | tr '\0' ' ' >"$S/rl/HEAD.new" && mv "$S/rl/HEAD.new" "$S/rl/HEAD"
sleep 1
check "an oversize HEAD: reported" grep -q "too large for a protocol record" "$WORK/follow.err"
check "... and the follower waits" alive
printf '{"format": "ferry-head-1", "version": ' >"$S/rl/HEAD"
sleep 1
check "a malformed HEAD: reported" grep -q "not valid JSON" "$WORK/follow.err"
check "... and the follower waits" alive
rm -f "$S/rl/HEAD" && ln -s "$WORK/head2" "$S/rl/HEAD"
sleep 1
check "a symlinked HEAD: reported" grep -qi "symbolic link\|not an object" "$WORK/follow.err"
check "... and the follower waits" alive

rm -f "$S/rl/HEAD" && cp "$WORK/head2" "$S/rl/HEAD"   # restored
fy publish $U --run rl "$(m 2)" -q
wait_pid_rc() { local i; for i in $(seq 1 300); do kill -0 "$1" 2>/dev/null || break; sleep 0.1; done; wait "$1"; }
wait_pid_rc $FPID
rc=$?
check "the follower reaches version 3 once HEAD is restored (exit $rc)" [ $rc -eq 0 ]
check "... and holds it" same_model "$WORK/island.safetensors" "$(m 2)"
sed 's/^/    | /' "$WORK/follow.err" | sort -u | head -n 8

# an island started before its trainer (issue 27): --follow waits for a
# store that does not exist yet, and --idle-timeout bounds the wait
S2=$WORK/later
fy pull "file://$S2" --run rl --to "$WORK/early.safetensors" --follow --interval 0.1 --until-version 1 --idle-timeout 60 \
    >"$WORK/early.out" 2>"$WORK/early.err" &
EPID=$!
sleep 0.5
check "--follow before the store exists: waiting, not failed" kill -0 $EPID
fy publish "file://$S2" --run rl "$(m 0)" -q
wait_pid_rc $EPID
rc=$?
check "... the store appears: version 1 pulled (exit $rc)" [ $rc -eq 0 ]
check "... said that it waited" grep -q "does not exist yet: waiting" "$WORK/early.err"
check "... and holds version 1" same_model "$WORK/early.safetensors" "$(m 0)"
check_rc "a store that never appears: exit 4 after --idle-timeout" 4 \
    fy pull "file://$WORK/never" --run rl --to "$WORK/never.safetensors" --follow --interval 0.1 --idle-timeout 1 -q
check_rc "without --follow a missing store is an error at once (exit 1)" 1 \
    fy pull "file://$WORK/never" --run rl --to "$WORK/never.safetensors" -q
finish
