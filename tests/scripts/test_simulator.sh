#!/usr/bin/env bash
# Tests of examples/adamw_sim, the checkpoint simulator behind
# scripts/showcase.sh and the synthetic benches: its files must be valid
# safetensors (checked by an independent parser, not only by ferry's own),
# every BF16 step must be PyTorch's cast of its FP32 master, runs must be
# deterministic in the seed, and the change rate between steps must look like
# an RL run (a few percent, falling).  Ends with "N passed, N failed".
set -u
cd "$(dirname "$0")/../.."
BUILD_DIR=${FERRY_BUILD:-$PWD/build}
SIM=$BUILD_DIR/examples/adamw_sim
PY=/usr/bin/python3; [ -x "$PY" ] || PY=python3
# The independent format check needs a Python (stdlib only).
command -v "$PY" >/dev/null || FERRY_SKIP_NPM=1 bash scripts/install-deps.sh >&2 || true
passed=0 failed=0
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

check() { # name, command...
    local name=$1; shift
    if "$@" >"$tmp/log" 2>&1; then
        passed=$((passed + 1)); echo "ok   $name"
    else
        failed=$((failed + 1)); echo "FAIL $name"; sed 's/^/    | /' "$tmp/log" | tail -n 20
    fi
}

if [ ! -x "$SIM" ]; then
    echo "FAIL $SIM is not built (make examples)"
    echo "0 passed, 1 failed"; exit 1
fi

A=$tmp/a
# One run serves most cases: 200k params, 3 steps, masters, self-verification
# (reopens every file with ferry_model_open: hash as written,
# step == cast(master) bit for bit, change counts recounted from the files).
run_main() { "$SIM" --out "$A" --params 200k --steps 3 --seed 7 --masters --verify >"$tmp/main.out" 2>&1 &&
             grep -q '^verify: all files ok$' "$tmp/main.out" || { cat "$tmp/main.out"; return 1; }; }
check "runs and verifies its own output" run_main

files_exist() {
    for k in 000 001 002 003; do
        [ -s "$A/step-$k.safetensors" ] && [ -s "$A/master-$k.safetensors" ] || { echo "missing $k"; return 1; }
    done
    [ ! -e "$A/step-004.safetensors" ]
}
check "writes step-000..003 and master-000..003" files_exist

# An independent reading of the format (safetensors spec): u64 LE header
# length, JSON object, data_offsets contiguous from 0 in file order, sizes
# = elements x dtype size, no trailing bytes.  Then the BF16 cast of the last
# master, done here with PyTorch's rounding formula, must equal the step.
cat >"$tmp/check.py" <<'EOF'
import json, struct, sys, array
def read(path):
    with open(path, 'rb') as f:
        blob = f.read()
    n = struct.unpack('<Q', blob[:8])[0]
    assert 0 < n <= len(blob) - 8 and n % 8 == 0, 'header length %d' % n
    h = json.loads(blob[8:8 + n])
    assert h.pop('__metadata__', {}).get('producer'), 'no producer metadata'
    data, end, out = blob[8 + n:], 0, {}
    for name, t in sorted(h.items(), key=lambda kv: kv[1]['data_offsets']):
        a, b = t['data_offsets']
        size = {'BF16': 2, 'F32': 4}[t['dtype']]
        count = 1
        for d in t['shape']: count *= d
        assert a == end and b - a == count * size, '%s: offsets %r' % (name, t['data_offsets'])
        end = b
        out[name] = (t['dtype'], t['shape'], data[a:b])
    assert end == len(data), 'trailing bytes'
    return out
mode, files = sys.argv[1], sys.argv[2:]
models = [read(p) for p in files]
if mode == 'cast':
    step, master = models
    assert step.keys() == master.keys()
    for name, (dt, shape, raw) in step.items():
        mdt, mshape, mraw = master[name]
        assert mdt == 'F32' and mshape == shape, name
        if dt == 'F32':
            assert raw == mraw, name
            continue
        u = array.array('I', mraw); h = array.array('H', raw)
        for i in range(len(u)):
            x = u[i]
            want = 0x7FC0 if (x & 0x7FFFFFFF) > 0x7F800000 else ((x + 0x7FFF + ((x >> 16) & 1)) >> 16) & 0xFFFF
            assert h[i] == want, '%s[%d]: %04x != cast(%08x) = %04x' % (name, i, h[i], x, want)
elif mode == 'dtypes':  # prints name:dtype of the first file
    for name, (dt, _, _) in sorted(models[0].items()): print('%s:%s' % (name, dt))
EOF
check "step and master files parse as safetensors (independent parser)" \
    "$PY" "$tmp/check.py" parse "$A"/step-00[0-3].safetensors "$A"/master-00[0-3].safetensors
check "step-003 == PyTorch cast of master-003 (independent cast)" \
    "$PY" "$tmp/check.py" cast "$A/step-003.safetensors" "$A/master-003.safetensors"

# Changed fraction per step, as recounted from the files by --verify.
change_band() {
    local fr; fr=$(sed -n 's/^verify: step \([0-9]*\) ok: changed \([0-9.]*\) .*/\2/p' "$tmp/main.out")
    [ "$(wc -w <<<"$fr")" -eq 3 ] || { echo "expected 3 fractions, got: $fr"; return 1; }
    echo "changed fractions: $fr"
    "$PY" - $fr <<'EOF'
import sys
f = [float(x) for x in sys.argv[1:]]
assert all(0.001 <= x <= 0.30 for x in f), 'outside 0.1%%..30%%: %r' % f
assert f[-1] < f[0], 'change rate does not fall: %r' % f
EOF
}
check "changed fraction per step in 0.1%..30% and falling" change_band

determinism() {
    "$SIM" --out "$tmp/b" --params 200k --steps 3 --seed 7 --quiet >/dev/null &&
    "$SIM" --out "$tmp/c" --params 200k --steps 1 --seed 8 --quiet >/dev/null || return 1
    for k in 000 001 002 003; do cmp "$A/step-$k.safetensors" "$tmp/b/step-$k.safetensors" || return 1; done
    ! cmp -s "$A/step-001.safetensors" "$tmp/c/step-001.safetensors"
}
check "same seed gives identical files, another seed differs" determinism

f32_norms() {
    "$SIM" --out "$tmp/d" --params 200k --steps 2 --dtype-norms F32 --masters --verify >"$tmp/d.out" 2>&1 &&
    grep -q '^verify: all files ok$' "$tmp/d.out" || { cat "$tmp/d.out"; return 1; }
    local dts; dts=$("$PY" "$tmp/check.py" dtypes "$tmp/d/step-002.safetensors") || return 1
    grep -q 'layernorm.weight:F32' <<<"$dts" && grep -q 'q_proj.weight:BF16' <<<"$dts" &&
    ! grep 'layernorm.weight:BF16' <<<"$dts"
}
check "--dtype-norms F32 writes F32 norms, still verified" f32_norms

bad_args() {
    "$SIM" --out "$tmp/e" --steps -1 >/dev/null 2>&1; [ $? -eq 2 ] || return 1
    "$SIM" --bogus >/dev/null 2>&1; [ $? -eq 2 ] || return 1
    "$SIM" --help | grep -q -- '--masters'
}
check "rejects bad options (exit 2), --help documents them" bad_args

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
