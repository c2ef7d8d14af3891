#!/usr/bin/env bash
# A private key given as --trust-key (issue 27 item 4): the pull still works
# (the library trusts its public half, as documented) but prints a warning
# naming the file on stderr; a public key prints none.  The Python Keys
# check is tests/python/test_loop_safe.py.
set -u
TEST_NAME=trust_private_key
source tests/tools/sync_env.sh

sync_built || skip_all "sync layer or tools not built (NO_NET=1?)"
U=file://$WORK/store
mkdir -p "$WORK/store"
fy keygen -o "$WORK/trainer" >/dev/null
check "publish a signed version" fy publish $U --run rl tests/golden/a.safetensors --sign-key "$WORK/trainer.key" -q
fy pull $U --run rl --to "$WORK/a.safetensors" --trust-key "$WORK/trainer.key" -q 2>"$WORK/err"
check "pull --trust-key PRIVATE: still pulls" same_tensors "$WORK/a.safetensors" tests/golden/a.safetensors
check "pull --trust-key PRIVATE: warns, naming the file" grep -q "warning: --trust-key $WORK/trainer.key is a PRIVATE key" "$WORK/err"
fy pull $U --run rl --to "$WORK/b.safetensors" --trust-key "$WORK/trainer.pub" -q 2>"$WORK/err2"
check "pull --trust-key PUBLIC: no warning" [ ! -s "$WORK/err2" ]
finish
