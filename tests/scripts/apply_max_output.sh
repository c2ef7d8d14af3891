#!/usr/bin/env bash
# `ferry apply --max-output` (review of issue 16: a tiny patch can expand to
# an arbitrarily large model).  A 697-byte patch that adds a 16 MiB tensor of
# zeros to an 8 KiB model: with --max-output under the target's size apply
# exits 1 naming the bound and leaves no output and no temporary file; the
# default bound (4 x the base, at least 1 GiB) and --max-output 0 (none)
# let it through; a malformed value is a usage error.
set -u
cd "$(dirname "$0")/../.."
FERRY=${FERRY_BIN:-$PWD/build/ferry}
PY=/usr/bin/python3; [ -x "$PY" ] || PY=python3
passed=0 failed=0
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
check() { local name=$1; shift; if "$@" >"$tmp/log" 2>&1; then passed=$((passed + 1)); echo "ok   $name"; else failed=$((failed + 1)); echo "FAIL $name"; sed 's/^/    | /' "$tmp/log" | tail -n 5; fi; }
fails() { local name=$1; shift; if "$@" >"$tmp/log" 2>&1; then failed=$((failed + 1)); echo "FAIL $name (succeeded)"; else passed=$((passed + 1)); echo "ok   $name"; fi; }

$PY - "$tmp" <<'PYEOF'
import json, struct, sys
def st(tensors, path):
    hdr, data = {}, b""
    for name, (n, fill) in tensors.items():
        b = bytes([fill]) * (2 * n)
        hdr[name] = {"dtype": "BF16", "shape": [n], "data_offsets": [len(data), len(data) + len(b)]}
        data += b
    h = json.dumps(hdr).encode()
    h += b" " * (-len(h) % 8)
    open(path, "wb").write(struct.pack("<Q", len(h)) + h + data)
st({"w": (4096, 1)}, sys.argv[1] + "/a.safetensors")
st({"w": (4096, 1), "z": (8 << 20, 0)}, sys.argv[1] + "/b.safetensors")
PYEOF
"$FERRY" diff "$tmp/a.safetensors" "$tmp/b.safetensors" -o "$tmp/ab.patch" -q
check "the patch is tiny" [ "$(stat -c %s "$tmp/ab.patch")" -lt 4096 ]
fails "--max-output under the target: refused" "$FERRY" apply "$tmp/a.safetensors" "$tmp/ab.patch" -o "$tmp/out.safetensors" --max-output 1000000
cp "$tmp/log" "$tmp/refused.log"
check "the message names the bound" grep -q "max_output_bytes" "$tmp/refused.log"
check "no output and no temporary file" bash -c "! ls '$tmp'/out* 2>/dev/null"
check "default bound lets a 16 MiB target through" "$FERRY" apply "$tmp/a.safetensors" "$tmp/ab.patch" -o "$tmp/out.safetensors" -q
check "--max-output 0: no bound" "$FERRY" apply "$tmp/a.safetensors" "$tmp/ab.patch" -o "$tmp/out2.safetensors" -q --max-output 0
check "--max-output at the exact size" "$FERRY" apply "$tmp/a.safetensors" "$tmp/ab.patch" -o "$tmp/out3.safetensors" -q --max-output $((4096 * 2 + (8 << 20) * 2))
fails "--max-output one byte under" "$FERRY" apply "$tmp/a.safetensors" "$tmp/ab.patch" -o "$tmp/out4.safetensors" -q --max-output $((4096 * 2 + (8 << 20) * 2 - 1))
fails "--max-output with a non-number" "$FERRY" apply "$tmp/a.safetensors" "$tmp/ab.patch" -o "$tmp/out5.safetensors" --max-output 12k
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
