#!/usr/bin/env bash
# lib/loco over real MPI: tests/mpi/test_loco_mpi (the exchange against a
# serial reference, bit for bit) under `mpirun -np 3`, then
# build/examples/loco_train under `mpirun -np 2` and
# `-np 4 --oversubscribe`, each mode, on a small network (seconds).
# Asserts: exit 0 and one "hash-agree R/R" line per round (the program
# itself fails the run when ranks disagree); the same run gives the same
# weights (determinism); PULSELoCo sends far fewer bytes per round than
# DiLoCo at an LLM-like learning rate; ranks configured differently fail
# loudly, naming the round; --publish-dir writes checkpoints that ferry
# diffs and applies bit-exactly; --save/--init round-trip the weights bit
# for bit, and bad --init files (missing, another network, a NaN) fail on
# every rank with a message naming the file and the tensor.
# Skips (exit 0) when mpirun or the program is absent (NO_MPI=1 builds).
# Under SAN=1 (ASan build), LeakSanitizer stays on for the ranks but with
# Open MPI's own libraries suppressed: they keep allocations to exit, which
# LSan reports as leaks (its MCA components are dlclose()d by then, hence
# "<unknown module>"); full unwinding lets the suppressions see the frames.
set -u
BUILD=${FERRY_BUILD:-$PWD/build}
PROG=$BUILD/examples/loco_train
if ! command -v mpirun >/dev/null 2>&1 || [ ! -x "$PROG" ]; then
    echo "loco: skipped (no mpirun or no $PROG)"
    echo "0 passed, 0 failed, 1 skipped"
    exit 0
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Keep Open MPI off the network interfaces it would probe: loopback only.
export OMPI_MCA_btl=self,vader OMPI_MCA_btl_tcp_if_include=lo OMPI_MCA_oob_tcp_if_include=lo
export OMPI_MCA_rmaps_base_oversubscribe=1
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
MPIENV=()
if [ "${SAN:-}" = 1 ]; then
    printf 'leak:%s\n' libmpi.so libopen-pal.so libopen-rte.so libpmix.so libhwloc.so libevent \
        '<unknown module>' >"$tmp/lsan.supp"
    MPIENV=(env ASAN_OPTIONS=fast_unwind_on_malloc=0 LSAN_OPTIONS=suppressions=$tmp/lsan.supp)
fi
pass=0; fail=0
ok() { echo "ok   $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1"; fail=$((fail + 1)); }

# The library against its serial reference (tests/mpi/test_loco_mpi.c),
# every gate and value coding, bad payloads refused on every rank: 3
# ranks, so that the rank order of the sums is not a mirror image, and 2
# and 4.
MT=$BUILD/tests/mpi/test_loco_mpi
if [ -x "$MT" ]; then
    for np in 2 3 4; do
        timeout 120 "${MPIENV[@]}" mpirun -np $np --oversubscribe "$MT" >"$tmp/mt.out" 2>&1
        rc=$?
        line=$(grep -E '^mpi: [0-9]+ passed' "$tmp/mt.out")
        if [ $rc -eq 0 ] && grep -q ', 0 failed' <<<"$line"; then
            ok "test_loco_mpi -np $np: $line"
        else
            bad "test_loco_mpi -np $np: exit $rc"; sed 's/^/    | /' "$tmp/mt.out" | tail -20
        fi
    done
else
    bad "$MT is not built"
fi

SMALL=(--dim 64 --layers 1 --prompts-per-step 4 --group-size 4)
ROUNDS=3

# run NAME NP ARGS... -> $tmp/NAME.out, exit status in $tmp/NAME.rc
run() {
    local name=$1 np=$2; shift 2
    timeout 120 "${MPIENV[@]}" mpirun -np "$np" --oversubscribe "$PROG" "$@" >"$tmp/$name.out" 2>&1
    echo $? >"$tmp/$name.rc"
}
# bytes column of round lines
round_bytes() { awk '/hash-agree/ {print $4}' "$tmp/$1.out"; }
hashes() { awk '/hash-agree/ {print $NF}' "$tmp/$1.out"; }

for np in 2 4; do
    for mode in pulseloco diloco ddp; do
        name=$mode-np$np
        run "$name" "$np" --mode "$mode" --h 2 --rounds $ROUNDS "${SMALL[@]}"
        rc=$(cat "$tmp/$name.rc")
        agree=$(grep -c "hash-agree $np/$np" "$tmp/$name.out")
        if [ "$rc" -eq 0 ] && [ "$agree" -eq $ROUNDS ]; then
            ok "$name: exit 0, $agree/$ROUNDS rounds with all $np ranks on one hash"
        else
            bad "$name: exit $rc, $agree/$ROUNDS hash-agree lines"; sed 's/^/    | /' "$tmp/$name.out" | tail -20
        fi
    done
done

# Determinism: a rerun of the same command holds the same weights each round.
run pulseloco-np2-again 2 --mode pulseloco --h 2 --rounds $ROUNDS "${SMALL[@]}"
if [ "$(hashes pulseloco-np2)" = "$(hashes pulseloco-np2-again)" ] && [ -n "$(hashes pulseloco-np2)" ]; then
    ok "rerun of pulseloco -np 2 gives the same weights every round"
else
    bad "rerun of pulseloco -np 2 differs"
fi

# Bytes: at an LLM-like learning rate (per-round moves below most BF16
# cells) the gate sends a small share; every PULSELoCo round must be far
# below DiLoCo's dense 4 bytes per weight and rank.
for mode in pulseloco diloco; do run "$mode-lowlr" 2 --mode "$mode" --h 4 --rounds 4 --lr 2e-6 "${SMALL[@]}"; done
if [ "$(cat "$tmp/pulseloco-lowlr.rc")" -eq 0 ] && [ "$(cat "$tmp/diloco-lowlr.rc")" -eq 0 ]; then
    dense=$(round_bytes diloco-lowlr | head -n 1)
    worst=$(round_bytes pulseloco-lowlr | sort -n | tail -n 1)
    if [ -n "$dense" ] && [ -n "$worst" ] && [ $((worst * 5)) -lt "$dense" ]; then
        ok "pulseloco bytes/round <= $worst, diloco $dense (more than 5x less)"
    else
        bad "pulseloco bytes/round $worst against diloco $dense"; cat "$tmp/pulseloco-lowlr.out"
    fi
else
    bad "low-lr runs failed"; tail -5 "$tmp/pulseloco-lowlr.out" "$tmp/diloco-lowlr.out"
fi

# Divergence is loud: ranks with different outer settings (MPMD launch)
# disagree after round 0; with different inner lr, DDP disagrees too.
diverge() { # name, mode, option, value rank0, value rank1, more options
    timeout 120 "${MPIENV[@]}" mpirun --oversubscribe -np 1 "$PROG" --mode "$2" --h 2 --rounds 2 "${SMALL[@]}" "$3" "$4" "${@:6}" \
        : -np 1 "$PROG" --mode "$2" --h 2 --rounds 2 "${SMALL[@]}" "$3" "$5" "${@:6}" >"$tmp/$1.out" 2>&1
    local rc=$?
    if [ $rc -ne 0 ] && grep -q "round 0: weights differ across ranks" "$tmp/$1.out" &&
        grep -q "loco_train: rank [01], round 0" "$tmp/$1.out"; then
        ok "$1: exit $rc, 'round 0: weights differ across ranks' reported"
    else
        bad "$1: exit $rc"; sed 's/^/    | /' "$tmp/$1.out" | tail -20
    fi
}
diverge diverge-pulseloco-sent pulseloco --outer-lr 0.7 0.71 --gate sent
# Under the outer gate each rank applies its own outer step, so different
# settings would not show as divergence: creation refuses them on every rank.
timeout 120 "${MPIENV[@]}" mpirun --oversubscribe -np 1 "$PROG" --mode pulseloco --h 2 --rounds 2 "${SMALL[@]}" --outer-lr 0.7 \
    : -np 1 "$PROG" --mode pulseloco --h 2 --rounds 2 "${SMALL[@]}" --outer-lr 0.71 >"$tmp/outer-mismatch.out" 2>&1
rc=$?
# (every rank refuses, tests/mpi checks that; the first to abort may stop
# the other before it prints)
if [ $rc -ne 0 ] && grep -q 'ferry_loco_create.*outer settings must agree' "$tmp/outer-mismatch.out"; then
    ok "outer gate, outer lr 0.7 against 0.71: exit $rc, creation refused"
else
    bad "outer gate, outer lr mismatch: exit $rc"; sed 's/^/    | /' "$tmp/outer-mismatch.out" | tail -20
fi
diverge diverge-ddp ddp --lr 2e-4 3e-4

# Publishing: one BF16 checkpoint per round; consecutive ones diff and apply
# exactly with the ferry CLI (the sync layer's path).
run publish 2 --mode pulseloco --h 2 --rounds 2 "${SMALL[@]}" --publish-dir "$tmp/pub"
c0=$tmp/pub/round-000000.safetensors; c1=$tmp/pub/round-000001.safetensors
if [ "$(cat "$tmp/publish.rc")" -eq 0 ] && [ -s "$c0" ] && [ -s "$c1" ]; then
    if [ -x "${FERRY_BIN:-}" ]; then
        if "$FERRY_BIN" diff "$c0" "$c1" -o "$tmp/p.patch" >/dev/null 2>&1 &&
            "$FERRY_BIN" apply "$c0" "$tmp/p.patch" -o "$tmp/out.safetensors" >/dev/null 2>&1 &&
            cmp -s "$tmp/out.safetensors" "$c1"; then
            ok "publish: round checkpoints written; ferry diff/apply reproduces round 1 byte for byte"
        else
            bad "publish: ferry diff/apply of the checkpoints failed"
        fi
    else
        ok "publish: round checkpoints written (no ferry CLI to diff them)"
    fi
else
    bad "publish: exit $(cat "$tmp/publish.rc"), files: $(ls "$tmp/pub" 2>&1)"
fi

# --init / --save: a run's final global weights saved by rank 0 start a
# second run bit for bit (its initial hash is the first run's last round
# hash), and every rank of it agrees every round; rl_train's --save feeds
# loco_train's --init (the bench's fine-tune phase).
init_hash() { awk '/^loco_train: initial weights/ {print $NF}' "$tmp/$1.out"; }
run save0 2 --mode pulseloco --h 2 --rounds 2 "${SMALL[@]}" --lr 2e-6 --save "$tmp/ck.safetensors"
run init1 2 --mode pulseloco --h 2 --rounds 2 "${SMALL[@]}" --lr 2e-6 --init "$tmp/ck.safetensors"
last=$(hashes save0 | tail -n 1)
if [ "$(cat "$tmp/save0.rc")" -eq 0 ] && [ "$(cat "$tmp/init1.rc")" -eq 0 ] && [ -n "$last" ] &&
    [ "$(init_hash init1)" = "$last" ] && [ "$(grep -c 'hash-agree 2/2' "$tmp/init1.out")" -eq 2 ]; then
    ok "--save then --init: the run starts from the saved weights bit for bit ($last), ranks agree every round"
else
    bad "--save/--init round trip: exit $(cat "$tmp/save0.rc")/$(cat "$tmp/init1.rc"), last $last, init $(init_hash init1)"
    tail -5 "$tmp/save0.out" "$tmp/init1.out"
fi
RLT=$BUILD/examples/rl_train
if [ -x "$RLT" ]; then
    timeout 120 "${MPIENV[@]}" "$RLT" --steps 3 --dim 64 --layers 1 --prompts-per-step 4 --group-size 4 --quiet \
        --save "$tmp/rl.safetensors" >"$tmp/rlsave.out" 2>&1
    run rlinit 4 --mode diloco --h 2 --rounds 2 "${SMALL[@]}" --init "$tmp/rl.safetensors"
    if [ -s "$tmp/rl.safetensors" ] && [ "$(cat "$tmp/rlinit.rc")" -eq 0 ] &&
        [ "$(grep -c 'hash-agree 4/4' "$tmp/rlinit.out")" -eq 2 ] && grep -q "initial weights $tmp/rl.safetensors" "$tmp/rlinit.out"; then
        ok "rl_train --save -> loco_train --init at -np 4: ranks agree every round"
    else
        bad "rl_train --save -> loco_train --init: exit $(cat "$tmp/rlinit.rc")"; tail -5 "$tmp/rlsave.out" "$tmp/rlinit.out"
    fi
else
    bad "$RLT is not built"
fi
# Bad init files fail before any round, with a message naming the file
# (and the tensor), on every rank, with a non-zero exit and no hang.
init_err() { # name, expected message (grep -E), args...
    local name=$1 want=$2; shift 2
    run "$name" 2 --mode pulseloco --h 2 --rounds 1 "$@"
    local rc; rc=$(cat "$tmp/$name.rc")
    if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && ! grep -q hash-agree "$tmp/$name.out" &&
        [ "$(grep -cE "loco_train: rank [01]: --init: $want" "$tmp/$name.out")" -eq 2 ]; then
        ok "$name: exit $rc, both ranks: $(grep -m1 -E -o -- "--init: .*" "$tmp/$name.out" | cut -c1-150)"
    else
        bad "$name: exit $rc"; sed 's/^/    | /' "$tmp/$name.out" | tail -10
    fi
}
init_err init-missing "$tmp/nope.safetensors: cannot open" "${SMALL[@]}" --init "$tmp/nope.safetensors"
init_err init-shape "$tmp/ck.safetensors: tensor 'mlp.0.weight' has shape \[[0-9, ]+\], the network expects \[[0-9, ]+\]; the file holds a network of .*--dim 64 --layers 1" \
    --dim 32 --layers 1 --prompts-per-step 4 --group-size 4 --init "$tmp/ck.safetensors"
init_err init-layers "$tmp/ck.safetensors: tensor 'mlp.1.(weight|bias)' is missing" \
    --dim 64 --layers 2 --prompts-per-step 4 --group-size 4 --init "$tmp/ck.safetensors"
if command -v python3 >/dev/null 2>&1; then
    # A copy of the checkpoint with one weight set to NaN (safetensors: an
    # 8-byte header length, a JSON header, then the data).
    python3 - "$tmp/ck.safetensors" "$tmp/nan.safetensors" <<'PY'
import json, struct, sys
b = bytearray(open(sys.argv[1], "rb").read())
n = struct.unpack("<Q", b[:8])[0]
off = json.loads(b[8:8 + n])["head.bias"]["data_offsets"][0] + 8 + n
b[off + 4:off + 8] = struct.pack("<I", 0x7FC00000)
open(sys.argv[2], "wb").write(b)
PY
    init_err init-nan "$tmp/nan.safetensors: tensor 'head.bias' element 1 is nan" "${SMALL[@]}" --init "$tmp/nan.safetensors"
fi
if [ -x "$RLT" ]; then
    "$RLT" --steps 1 --init "$tmp/nope.safetensors" >"$tmp/rlmissing.out" 2>&1
    rc=$?
    if [ $rc -ne 0 ] && grep -q "rl_train: --init: $tmp/nope.safetensors: cannot open" "$tmp/rlmissing.out"; then
        ok "rl_train --init of a missing file: exit $rc, file named"
    else
        bad "rl_train --init of a missing file: exit $rc"; cat "$tmp/rlmissing.out"
    fi
fi

echo "loco: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
