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
finish
