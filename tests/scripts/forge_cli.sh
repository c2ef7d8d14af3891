#!/usr/bin/env bash
# The attack of issue 16, through the ferry CLI on a file:// store, with an
# attacker that can only write files in the store:
#   - a version 3 of the attacker's choice (its own key, or unsigned) is
#     refused by a pull that trusts the trainer's key (exit 7), and the
#     trainer's next `ferry publish --sign-key` refuses to chain onto it
#     (exit 7) instead of exiting 0;
#   - HEAD frozen at 2^63-1 (unsigned) and HEAD rolled back to a validly
#     signed older one: `ferry pull --follow` reports them, keeps its
#     version, and follows again once HEAD is restored (not wedged);
#   - ferry keygen never overwrites a key, and makes the private key 0600.
#   - (issue 23) a HEAD forged with an island's key, a HEAD deleted, another
#     run's signed versions copied in: refused, and `ferry head-repair`
#     puts HEAD back on the newest version of this run that verifies.
# The library-level suite (each attack with its own error code) is
# tests/unit/test_sign.c.
set -u
TEST_NAME=forge_cli
source tests/tools/sync_env.sh

sync_built || skip_all "sync layer or tools not built (NO_NET=1?)"
S=$WORK/store
U=file://$S
st gen "$WORK/m" 6 20000 5 >/dev/null
m() { printf '%s/m/m-%03d.safetensors' "$WORK" "$1"; }
fy keygen -o "$WORK/trainer" >/dev/null
fy keygen -o "$WORK/mallory" >/dev/null
check "keygen: private key 0600" [ "$(stat -c %a "$WORK/trainer.key")" = 600 ]
check_rc "keygen never overwrites a key" 1 fy keygen -o "$WORK/trainer"
T=(--sign-key "$WORK/trainer.key")
R=(--trust-key "$WORK/trainer.pub")

ok_pub=0
for i in 0 1; do fy publish $U --run rl "$(m $i)" "${T[@]}" -q && ok_pub=$((ok_pub + 1)); done
check "the trainer publishes versions 1 and 2, signed" [ $ok_pub -eq 2 ]
fy pull $U --run rl --to "$WORK/island.safetensors" "${R[@]}" -q
check "an island trusting the trainer's key pulls version 2" same_model "$WORK/island.safetensors" "$(m 1)"

# the attacker publishes "version 3" with its own key, then without one
cp -a "$S" "$WORK/saved"
fy publish $U --run rl "$(m 5)" --sign-key "$WORK/mallory.key" "${R[@]}" -q || echo "    (the attacker could not publish)"
check_rc "a version 3 signed by the attacker's key: the pull refuses it (exit 7)" 7 \
    fy pull $U --run rl --to "$WORK/island.safetensors" "${R[@]}" -q
check "... and the island still holds version 2" same_model "$WORK/island.safetensors" "$(m 1)"
check_rc "... and the trainer's next publish refuses to chain onto it (exit 7)" 7 \
    fy publish $U --run rl "$(m 2)" "${T[@]}" -q
check_rc "... and ferry log trusting the trainer's key refuses to list it (exit 7)" 7 \
    fy log $U --run rl "${R[@]}" --json
fy log $U --run rl --json >"$WORK/log.json"
check "... while ferry log without a key lists it, marked unverified" \
    $PY -c 'import json,sys; d=json.load(open(sys.argv[1])); sys.exit(not (d["head"] == 3 and d["verified"] is False))' "$WORK/log.json"
rm -rf "$S" && cp -a "$WORK/saved" "$S"
fy publish $U --run rl "$(m 5)" -q >/dev/null 2>&1
check_rc "an unsigned version 3: refused too (exit 7)" 7 \
    fy pull $U --run rl --to "$WORK/island.safetensors" "${R[@]}" -q
rm -rf "$S" && cp -a "$WORK/saved" "$S"
fy log $U --run rl "${R[@]}" --json >"$WORK/log.json"
check "ferry log trusting the trainer's key lists versions 1 and 2, verified" \
    $PY -c 'import json,sys; d=json.load(open(sys.argv[1])); sys.exit(not (d["verified"] is True and [v["version"] for v in d["versions"]] == [1, 2]))' "$WORK/log.json"

# HEAD frozen at 2^63-1, then rolled back: a follower is never wedged
fy publish $U --run rl "$(m 2)" "${T[@]}" -q
fy pull $U --run rl --to "$WORK/island.safetensors" "${R[@]}" -q
cp "$S/rl/HEAD" "$WORK/head3"
$PY - "$S/rl/HEAD" <<'PY'
import re, sys
p = sys.argv[1]
t = open(p).read()
t = t[:t.index("\n#ferry-sig-")]
open(p, "w").write(re.sub(r'"version": \d+', '"version": 9223372036854775807', t, count=1))
PY
fy pull $U --run rl --to "$WORK/island.safetensors" "${R[@]}" --follow --interval 0.1 --until-version 4 -q \
    2>"$WORK/follow.err" &
FPID=$!
sleep 1.5
cp "$WORK/saved/rl/HEAD" "$S/rl/HEAD"   # rolled back to version 2, validly signed
sleep 1.5
cp "$WORK/head3" "$S/rl/HEAD"           # repaired
fy publish $U --run rl "$(m 3)" "${T[@]}" -q
wait_pid_rc() { local i; for i in $(seq 1 300); do kill -0 "$1" 2>/dev/null || break; sleep 0.1; done; wait "$1"; }
wait_pid_rc $FPID
rc=$?
check "pull --follow through a frozen and a rolled-back HEAD reaches version 4 (exit 0)" [ $rc -eq 0 ]
check "... it reported the frozen HEAD" grep -q "unsigned, and this reader trusts only signed records" "$WORK/follow.err"
check "... and the rollback" grep -q "below version" "$WORK/follow.err"
check "... and holds the trainer's version 4" same_model "$WORK/island.safetensors" "$(m 3)"

# The owner's recovery (issue 23 items 1, 3, 11): a HEAD forged with an
# island's batch key, a HEAD deleted, another run's signed versions copied
# in; each time `ferry head-repair` puts HEAD back on the newest version of
# this run that verifies, and the keyed trainer resumes.
fy keygen -o "$WORK/island0" >/dev/null
fy publish $U --run rl "$(m 4)" --sign-key "$WORK/island0.key" "${R[@]}" -q   # island 0 "publishes" version 5
check_rc "a version 5 signed with island 0's key: the keyed trainer refuses to resume (exit 7)" 7 \
    fy publish $U --run rl "$(m 4)" "${T[@]}" --cache "$WORK/trainer-cache.safetensors" -q
check_rc "... and an island refuses it (exit 7)" 7 fy pull $U --run rl --to "$WORK/island.safetensors" "${R[@]}" -q
check "head-repair --help" bash -c "$(printf '%q ' "$FERRY") head-repair --help | grep -q 'newest version of'"
check_rc "head-repair without --sign-key: usage (exit 2)" 2 fy head-repair $U --run rl -q
fy head-repair $U --run rl "${T[@]}" --dry-run --json >"$WORK/repair.json"
check "head-repair --dry-run: HEAD would name version 4, nothing written" \
    $PY -c 'import json,sys; d=json.load(open(sys.argv[1])); sys.exit(not (d["version"] == 4 and d["written"] is False and d["head_before"] == "refused" and d["refused"] == 1))' "$WORK/repair.json"
fy head-repair $U --run rl "${T[@]}" --json >"$WORK/repair.json"
check "head-repair: HEAD rewritten to version 4, signed" \
    $PY -c 'import json,sys; d=json.load(open(sys.argv[1])); sys.exit(not (d["version"] == 4 and d["written"] is True and len(d["run_id"]) == 16))' "$WORK/repair.json"
RID=$($PY -c 'import json,sys; print(json.load(open(sys.argv[1]))["run_id"])' "$WORK/repair.json")
check "... the trainer resumes on it: version 5 is its own" fy publish $U --run rl "$(m 4)" "${T[@]}" --cache "$WORK/trainer-cache.safetensors" -q
fy pull $U --run rl --to "$WORK/island.safetensors" "${R[@]}" -q
check "... and the island takes the trainer's version 5" same_model "$WORK/island.safetensors" "$(m 4)"

rm "$S/rl/HEAD"
check_rc "HEAD deleted: ferry publish refuses to start a new version 1 (exit 3)" 3 \
    fy publish $U --run rl "$(m 5)" "${T[@]}" --cache "$WORK/trainer-cache.safetensors" -q
check "... naming the recovery" bash -c "$(printf '%q ' "$FERRY") publish $U --run rl $(m 5) --sign-key $WORK/trainer.key 2>&1 | grep -q 'head-repair'"
check "... ferry head-repair restores it (version 5)" fy head-repair $U --run rl "${T[@]}" -q
check "... and the trainer publishes version 6" bash -c "$(printf '%q ' "$FERRY") publish $U --run rl $(m 5) --sign-key $WORK/trainer.key --json | grep -q '\"version\": 6'"

# another run "rl" (same key, its own run id) copied over this one
O=$WORK/other
for i in 0 1 2 3 4 5 0; do fy publish file://$O --run rl "$(m $i)" "${T[@]}" -q; done   # 7 versions
cp -a "$O/rl/." "$S/rl/"
check_rc "another run's HEAD copied in: the island pinned to this run refuses it (exit 3)" 3 \
    fy pull $U --run rl --to "$WORK/island.safetensors" "${R[@]}" -q
check "... and keeps this run's version 5" same_model "$WORK/island.safetensors" "$(m 4)"
check_rc "... the trainer told the run id refuses to publish on it (exit 3)" 3 \
    fy publish $U --run rl "$(m 5)" "${T[@]}" --run-id "$RID" -q
check_rc "... head-repair without --run-id: two runs verify, asks which (exit 3)" 3 fy head-repair $U --run rl "${T[@]}" -q
fy head-repair $U --run rl "${T[@]}" --run-id "$RID" --json >"$WORK/repair.json"
check "... with --run-id: HEAD back on this run's version 6" \
    $PY -c 'import json,sys; d=json.load(open(sys.argv[1])); sys.exit(not (d["version"] == 6 and d["written"] is True and d["run_id"] == sys.argv[2]))' "$WORK/repair.json" "$RID"
fy pull $U --run rl --to "$WORK/island.safetensors" "${R[@]}" -q
check "... and the island follows this run again (version 6)" same_model "$WORK/island.safetensors" "$(m 5)"
finish
