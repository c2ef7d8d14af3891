#!/usr/bin/env bash
# ferry-shard-mpi's pread of each rank's rows (programs/ferry/cmd_shard_mpi.c,
# read_rows) on synthetic checkpoints made to put rows at odd file offsets:
# a header of odd length (the data region starts at an odd byte), the data
# region in another order than the names, tensors of odd row sizes (U8 3
# columns, BF16 7, F32 13, 1-D F32 by element, I32 5), 3 ranks whose cuts
# fall inside them.  Published with --cast-bf16 (FP32 masters), 2 versions;
# `ferry shard-pull` of every tensor whole is then compared byte for byte
# with the file (F32 as PyTorch's BF16 cast, the rest as stored).  The
# same checkpoints with --quantize fp8-block128 (a BF16 300 x 131 matrix
# quantized, cuts on the 128-row grid) pull as `ferry quantize` of each,
# byte for byte.  Then a
# checkpoint truncated by 100 bytes: a clear error on every rank (exit
# status, no signal), HEAD unchanged; one truncated once opened (test
# hooks build): the same, no rank killed by SIGBUS.  Skips when mpirun or the program
# is absent (NO_MPI=1 builds).
set -u
TEST_NAME=shard_mpi_rows
source tests/tools/sync_env.sh
PUB=${FERRY_BUILD:-$PWD/build}/ferry-shard-mpi
command -v mpirun >/dev/null 2>&1 || skip_all "no mpirun"
[ -x "$PUB" ] && [ -x "$FERRY" ] || skip_all "no $PUB or $FERRY (NO_MPI=1?)"
source tests/tools/mpi_env.sh
S=$WORK/store
RUN=rows/ci
mkdir -p "$S"
pub() { timeout 120 mpirun -np 3 --oversubscribe "${MPIENV[@]}" "$PUB" "$S" --run $RUN --tile-words 16 "$@"; }

# --- two synthetic checkpoints ---------------------------------------------
$PY - "$WORK" <<'EOF'
import json, random, struct, sys
work = sys.argv[1]
rnd = random.Random(7)
# name: (dtype, shape, element size)
spec = {"a.w": ("F32", [37, 13], 4), "b.e": ("BF16", [101, 7], 2), "c.v": ("F32", [53], 4),
        "d.u": ("U8", [29, 3], 1), "e.i": ("I32", [11, 5], 4), "f.weight": ("BF16", [300, 131], 2)}
order = ["d.u", "c.v", "a.w", "f.weight", "e.i", "b.e"]  # the data region's order
def elem(dt):
    if dt == "F32": return struct.pack("<f", rnd.uniform(-3, 3))
    if dt == "BF16": return struct.pack("<H", (rnd.getrandbits(1) << 15) | (0x3c00 + rnd.randrange(0x800)))
    if dt == "U8": return bytes([rnd.randrange(256)])
    return struct.pack("<i", rnd.randrange(-2**31, 2**31))
vals = {}
for n in order:
    dt, shape, es = spec[n]
    cnt = 1
    for d in shape: cnt *= d
    vals[n] = [elem(dt) for _ in range(cnt)]
for v in (1, 2):
    if v == 2:  # some elements of every tensor change
        for n in order:
            for i in range(0, len(vals[n]), 5): vals[n][i] = elem(spec[n][0])
    head, data = {}, b""
    for n in order:
        b = b"".join(vals[n])
        head[n] = {"dtype": spec[n][0], "shape": spec[n][1], "data_offsets": [len(data), len(data) + len(b)]}
        data += b
    h = json.dumps(head, separators=(",", ":")).encode()
    if len(h) % 2 == 0: h += b" "  # odd: the data region starts at an odd offset
    open("%s/ck%d.safetensors" % (work, v), "wb").write(struct.pack("<Q", len(h)) + h + data)
EOF
check "two synthetic checkpoints, data region at an odd offset" \
    bash -c "[ -s '$WORK/ck2.safetensors' ] && $PY -c 'import struct,sys; print(8+struct.unpack(\"<Q\",open(sys.argv[1],\"rb\").read(8))[0])' '$WORK/ck1.safetensors' | grep -q '[13579]$'"

# --- 2 versions from 3 ranks, --cast-bf16 -----------------------------------
pub --cast-bf16 --json "$WORK/ck1.safetensors" "$WORK/ck2.safetensors" >"$WORK/pub.json" 2>"$WORK/pub.err"
rc=$?
sed 's/^/    /' "$WORK/pub.err" | tail -4
check "3 ranks publish versions 1 and 2 (exit $rc)" [ $rc -eq 0 ] && [ "$(grep -c '"version"' "$WORK/pub.json")" -eq 2 ]

compare() { # VERSION CHECKPOINT: shard-pull of every tensor equals the file's bytes
    rm -f "$WORK/pull.safetensors" "$WORK/pull.safetensors.ferry.json"
    fy shard-pull "$S" --run $RUN --slice a.w --slice b.e --slice c.v --slice d.u --slice e.i --slice f.weight \
        --exact-version "$1" --out "$WORK/pull.safetensors" --json >"$WORK/pull.json" 2>"$WORK/pull.err" || {
        sed 's/^/    /' "$WORK/pull.err"
        return 1
    }
    $PY - "$WORK/pull.safetensors" "$2" <<'EOF'
import json, struct, sys
def load(p):
    b = open(p, "rb").read(); n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n])
    return {k.split("@")[0]: (v, b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]])
            for k, v in h.items() if k != "__metadata__"}
def bf16(raw):  # round to nearest even, as torch's cast (no NaN here)
    out = bytearray()
    for (u,) in struct.iter_unpack("<I", raw):
        out += struct.pack("<H", ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF)
    return bytes(out)
got, full = load(sys.argv[1]), load(sys.argv[2])
bad = []
for name, (meta, data) in full.items():
    want = bf16(data) if meta["dtype"] == "F32" else data
    if name not in got or got[name][1] != want: bad.append(name)
if bad or len(got) != len(full): print("    differ: %s (got %s)" % (bad, sorted(got))); sys.exit(1)
EOF
}
check "version 1 pulled: every tensor equals ck1 (F32 as BF16)" compare 1 "$WORK/ck1.safetensors"
check "version 2 pulled: every tensor equals ck2 (F32 as BF16)" compare 2 "$WORK/ck2.safetensors"

# --- --quantize fp8-block128: rows cut on the 128-row grid, odd row sizes --
for v in 1 2; do fy quantize "$WORK/ck$v.safetensors" "$WORK/q$v.safetensors" >/dev/null || bad "ferry quantize ck$v"; done
timeout 120 mpirun -np 3 --oversubscribe "${MPIENV[@]}" "$PUB" "$S" --run rows/fp8 --tile-words 16 --quantize fp8-block128 \
    "$WORK/ck1.safetensors" "$WORK/ck2.safetensors" >"$WORK/fp8.out" 2>"$WORK/fp8.err"
rc=$?
sed 's/^/    /' "$WORK/fp8.err" | tail -4
check "3 ranks publish the FP8 checkpoints of ck1, ck2 (exit $rc)" [ $rc -eq 0 ]
same_fp8() { # VERSION: shard-pull of every tensor of qVERSION equals it
    local slices
    slices=$($PY -c 'import json,struct,sys; f=open(sys.argv[1],"rb"); h=json.loads(f.read(struct.unpack("<Q",f.read(8))[0])); h.pop("__metadata__",None); print(" ".join("--slice "+n for n in sorted(h)))' "$WORK/q$1.safetensors")
    rm -f "$WORK/fp8pull.safetensors" "$WORK/fp8pull.safetensors.ferry.json"
    # shellcheck disable=SC2086
    fy shard-pull "$S" --run rows/fp8 $slices --exact-version "$1" --out "$WORK/fp8pull.safetensors" -q || return 1
    $PY - "$WORK/fp8pull.safetensors" "$WORK/q$1.safetensors" <<'EOF'
import json, struct, sys
def read(p):
    d = open(p, "rb").read(); n = struct.unpack("<Q", d[:8])[0]
    h = json.loads(d[8:8 + n]); h.pop("__metadata__", None)
    return {k.split("@")[0]: (v["dtype"], d[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]]) for k, v in h.items()}
got, want = read(sys.argv[1]), read(sys.argv[2])
bad = [k for k in want if got.get(k) != want[k]]
fp8 = [k for k in want if want[k][0] == "F8_E4M3"]
if bad or len(got) != len(want) or not fp8: print("    differ: %s; FP8 tensors: %s" % (bad, fp8)); sys.exit(1)
EOF
}
check "FP8 version 1 pulled: ferry quantize of ck1, byte for byte (some tensor FP8)" same_fp8 1
check "FP8 version 2 pulled: ferry quantize of ck2, byte for byte" same_fp8 2

# --- a truncated checkpoint -------------------------------------------------
cp "$WORK/ck1.safetensors" "$WORK/cut.safetensors"
truncate -s -100 "$WORK/cut.safetensors"
pub --cast-bf16 --json "$WORK/cut.safetensors" >"$WORK/cut.json" 2>"$WORK/cut.err"
rc=$?
sed 's/^/    /' "$WORK/cut.err" | head -3
check "a truncated checkpoint fails (exit $rc), not by a signal" [ $rc -ne 0 ] && [ $rc -lt 128 ]
check "... its message names the file" grep -q "cut.safetensors" "$WORK/cut.err"
check "... HEAD stays at version 2" bash -c "fy log '$S' --run $RUN --json | $PY -c 'import json,sys; sys.exit(0 if json.load(sys.stdin)[\"head\"]==2 else 1)'"

# --- a checkpoint rewritten in place once opened ------------------------------
# (build/tests/ferry-shard-mpi-hooks: FERRY_SHARD_TEST_TRUNCATE=N truncates
# it to N bytes after ferry_model_open, as torch.save over it would)
HOOKS=${FERRY_BUILD:-$PWD/build}/tests/ferry-shard-mpi-hooks
if [ -x "$HOOKS" ]; then
    cp "$WORK/ck2.safetensors" "$WORK/rw.safetensors"
    half=$(($(stat -c %s "$WORK/rw.safetensors") / 2))
    timeout 120 mpirun -np 3 --oversubscribe "${MPIENV[@]}" env FERRY_SHARD_TEST_TRUNCATE=$half "$HOOKS" "$S" --run $RUN \
        --tile-words 16 --cast-bf16 "$WORK/rw.safetensors" >"$WORK/rw.out" 2>"$WORK/rw.err"
    rc=$?
    sed 's/^/    /' "$WORK/rw.err" | head -4
    check "truncated once opened: the publish fails (exit $rc), no rank killed by a signal (SIGBUS)" \
        bash -c "[ $rc -ne 0 ] && [ $rc -lt 128 ] && ! grep -qiE 'signal|bus error|core dumped' '$WORK/rw.err'"
    # (the first rank to truncate it had opened it; the others, racing,
    # may find it truncated when they open it: 'truncated file')
    check "... a rank says the file changed since it was opened" grep -q "rw.safetensors: .*changed since it was opened" "$WORK/rw.err"
    check "... HEAD stays at version 2" bash -c "fy log '$S' --run $RUN --json | $PY -c 'import json,sys; sys.exit(0 if json.load(sys.stdin)[\"head\"]==2 else 1)'"
fi

finish
