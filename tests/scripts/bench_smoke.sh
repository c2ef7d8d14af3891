#!/usr/bin/env bash
# Smoke test of bench/codec on one small pair (rl-b step 000 -> 001): it must
# exit 0, ferry's apply must hash to NEW, and each peer format (trl, pulse,
# skyrl, slime, prime, vllm, verl) and generic baseline (zstd, xdelta3) must
# round-trip to NEW.  The same on a synthetic pair of edge cases
# (F32/F64/U8/F4/0-D/empty tensors, a gap over 65535, row deltas over 255,
# columns over 65535, a tensor of more than 2^24 words: two verl shards).
# Also: the checks must bite: a bit flipped in a peer's patch (--corrupt) and
# a pair of two different models must each make it exit non-zero.
# Prints "N passed, N failed"; builds the bench program if it is missing.
set -u
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
FERRY_BUILD=${FERRY_BUILD:-$PWD/$BUILD}
FERRY_DATA=${FERRY_DATA:-../shared/data}
codec="$FERRY_BUILD/bench/codec"
old="$FERRY_DATA/rl-b/step-000.safetensors"
new="$FERRY_DATA/rl-b/step-001.safetensors"
other="$FERRY_DATA/rl-a/step-001.safetensors"
passed=0; failed=0
check() { # name, condition-result (0 = pass)
    if [ "$2" -eq 0 ]; then passed=$((passed + 1)); echo "ok    $1"
    else failed=$((failed + 1)); echo "FAIL  $1"; fi
}

if [ ! -f "$old" ] || [ ! -f "$new" ] || [ ! -f "$other" ]; then
    echo "skip bench_smoke: shared data not found under $FERRY_DATA (set FERRY_DATA)"
    echo "0 passed, 0 failed, 1 skipped"
    exit 0
fi
# (Re)build only when missing or older than its sources: `make test` builds
# `all`, which does not include the benches.
if [ ! -x "$codec" ] || [ -n "$(find bench/codec.c bench/*.h "$FERRY_BUILD/libferry.a" -newer "$codec" 2>/dev/null)" ]; then
    make --no-print-directory -s BUILD="$BUILD" SAN="${SAN:-}" "$BUILD/bench/codec" >&2
fi
if [ ! -x "$codec" ]; then
    echo "bench_smoke: $codec could not be built" >&2
    echo "0 passed, 1 failed"
    exit 1
fi

tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
formats="ferry trl pulse skyrl slime prime vllm verl zstd xdelta3"
generic=""
if ! command -v zstd >/dev/null || ! command -v xdelta3 >/dev/null; then
    echo "bench_smoke: zstd or xdelta3 not installed: skipping the generic baselines" >&2
    generic="--no-generic"; formats="ferry trl pulse skyrl slime prime vllm verl"
fi

"$codec" --reps 1 $generic --json "$tmp/out.json" "$old" "$new" >"$tmp/stdout" 2>"$tmp/stderr"
rc=$?
check "codec exits 0 on rl-b 000->001" $rc
[ $rc -eq 0 ] || sed 's/^/    | /' "$tmp/stderr"
line=$(grep -E '^codec: rl-b:000->001:' "$tmp/stderr" | tail -n 1)
for f in $formats; do
    grep -qE "(^|: | )$f ok( |$)" <<<"$line"; check "$f round-trips to NEW" $?
done
grep -q '"ferry_over_min_peer"' "$tmp/out.json" 2>/dev/null; check "JSON written with the ratios" $?
grep -qE '^rl-b:000->001 +[0-9]+ +[0-9.]+% +[0-9]+ +[0-9]+' "$tmp/stdout"; check "table row printed" $?

"$codec" --reps 1 --no-generic "$old" "$other" >"$tmp/stdout2" 2>"$tmp/stderr2"
rc=$?
[ $rc -ne 0 ] && grep -q "the peer formats need the same tensors" "$tmp/stderr2"
check "different models: non-zero exit and a clear line" $?

# Synthetic pair, pure-stdlib Python (any python3).
mkdir -p "$tmp/synth"
python3 - "$tmp/synth" <<'PY'
import json, random, struct, sys
rnd = random.Random(7)
def save(path, ts):
    hdr, off, blobs = {}, 0, []
    for name in sorted(ts):
        dt, shape, b = ts[name]
        hdr[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(b)]}
        off += len(b); blobs.append(b)
    h = json.dumps(hdr, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    open(path, "wb").write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
A, B = {}, {}
def add(name, dt, shape, width, n, changes, zeros=False):
    a = bytearray(n * width) if zeros else bytearray(rnd.getrandbits(8) for _ in range(n * width))
    if dt in ("F32", "F64"):  # finite floats
        fmt = "<f" if dt == "F32" else "<d"
        for i in range(n): a[i*width:(i+1)*width] = struct.pack(fmt, rnd.uniform(-1, 1))
    b = bytearray(a)
    for i in changes: b[i * width] ^= 1
    A[name] = (dt, shape, bytes(a)); B[name] = (dt, shape, bytes(b))
add("a.widecols", "BF16", [2, 70000], 2, 140000, [0, 69999, 70005])
add("b.rows", "BF16", [400, 4], 2, 1600, [1, 1599])
add("c.gap", "BF16", [100000], 2, 100000, [0, 99999])
add("d.f32", "F32", [3, 5], 4, 15, [7, 14])
add("e.f4", "F4", [16], 1, 8, [3])
add("f.scalar", "F32", [], 4, 1, [0])
add("g.u8", "U8", [10], 1, 10, [9])
add("h.f64", "F64", [4], 8, 4, [2])
add("i.empty", "BF16", [0, 5], 2, 0, [])
add("j.3d", "BF16", [4, 3, 5], 2, 60, [29, 45])
add("k.same", "BF16", [7], 2, 7, [])
add("l.big", "U8", [(1 << 24) + 16], 1, (1 << 24) + 16, [5, (1 << 24) - 1, (1 << 24) + 3], zeros=True)
save(sys.argv[1] + "/step-000.safetensors", A)
save(sys.argv[1] + "/step-001.safetensors", B)
PY
"$codec" --reps 1 --no-generic "$tmp/synth/step-000.safetensors" "$tmp/synth/step-001.safetensors" \
    >/dev/null 2>"$tmp/stderr4"
rc=$?
[ $rc -eq 0 ] && grep -q "ferry ok trl ok pulse ok skyrl ok slime ok prime ok vllm ok verl ok" "$tmp/stderr4"
check "edge-case pair (dtypes, wide gaps/rows/cols) round-trips" $?
[ $rc -eq 0 ] || sed 's/^/    | /' "$tmp/stderr4"

# The sparse end (issue 14): a 1M-parameter adamw_sim step at lr 3e-9
# (~0.02% of words change): every format round-trips and ferry's patch
# (codec 4 chunks) is the smallest.
sim="$FERRY_BUILD/examples/adamw_sim"
[ -x "$sim" ] || make --no-print-directory -s BUILD="$BUILD" SAN="${SAN:-}" "$BUILD/examples/adamw_sim" >&2
if "$sim" --out "$tmp/sparse" --params 1M --steps 1 --lr 3e-9 --seed 3 --quiet >/dev/null 2>&1; then
    "$codec" --reps 1 --no-generic --json "$tmp/sparse.json" "$tmp/sparse/step-000.safetensors" \
        "$tmp/sparse/step-001.safetensors" >/dev/null 2>"$tmp/stderr5"
    rc=$?
    [ $rc -eq 0 ] && grep -q "ferry ok trl ok pulse ok skyrl ok slime ok prime ok vllm ok verl ok" "$tmp/stderr5" &&
        python3 -c 'import json,sys; p=json.load(open(sys.argv[1]))["pairs"][0]; sys.exit(0 if 0 < p["changed"] < p["words"] * 0.001 and p["ferry_over_min_peer"] < 1 else 1)' "$tmp/sparse.json"
    check "sparse pair (~0.02% changed) round-trips, ferry smallest" $?
    [ $rc -eq 0 ] || sed 's/^/    | /' "$tmp/stderr5"
else
    check "adamw_sim makes the sparse pair" 1
fi

for p in trl pulse skyrl slime prime vllm verl; do
    "$codec" --reps 1 --no-generic --corrupt "$p" "$old" "$new" >/dev/null 2>"$tmp/stderr3"
    rc=$?
    [ $rc -ne 0 ] && grep -q ": $p: round-trip failed" "$tmp/stderr3"
    check "a corrupted $p patch is caught" $?
done

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
