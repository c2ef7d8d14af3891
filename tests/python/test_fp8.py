"""The C FP8 quantizer (lib/common/fp8.c, `ferry quantize`) against a
reference written here in numpy from the definition in docs/FORMAT.md
("FP8 block quantization"), bit for bit:
  - E4M3FN rounding of FP32 values by nearest-value search over the code
    table (ties to the even code), saturation at 448, NaN, signed zero,
    subnormals: every code's value, every midpoint between neighbours and
    a dense random sample, through ctypes (ferry_f32_to_e4m3);
  - per 128x128 block scales (FP32 max / 448, 1 for an all-zero block),
    edge blocks, which tensors are quantized (2-D BF16, both dims >= 128,
    no 'embed' / 'lm_head'), NAME_scale_inv shapes and values, through
    `ferry quantize` on safetensors files;
  - sticky scales keep prev's scale exactly when the rule says so;
  - a non-finite weight is refused with a message naming the tensor.
Runs with /usr/bin/python3 (numpy); FERRY_BIN and FERRY_LIB name the build."""
import ctypes
import json
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _harness  # noqa: E402  (sets FERRY_LIB from FERRY_BUILD)

ROOT = _harness.ROOT
BUILD = os.environ.get("FERRY_BUILD", os.path.join(ROOT, "build"))
FERRY = os.environ.get("FERRY_BIN", os.path.join(BUILD, "ferry"))
LIB = os.environ.get("FERRY_LIB", os.path.join(BUILD, "libferry.so"))

# ---- the reference ----

def e4m3_table():
    """Value of every non-negative finite code 0x00..0x7E (monotone)."""
    vals = []
    for c in range(0x7F):
        e, m = c >> 3, c & 7
        vals.append(m * 2.0 ** -9 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7))
    return np.array(vals, dtype=np.float64)


TABLE = e4m3_table()


def ref_e4m3(x):
    """E4M3FN codes of float32 values: nearest value, ties to the even code,
    |x| >= 448 saturates to 448, NaN to 0x7F; the sign bit kept."""
    x = np.asarray(x, dtype=np.float32)
    a = np.abs(x).astype(np.float64)
    sign = (np.signbit(x).astype(np.uint8) << 7)
    hi = np.clip(np.searchsorted(TABLE, a, side="left"), 0, 0x7E)
    lo = np.clip(hi - 1, 0, 0x7E)
    dlo, dhi = np.abs(a - TABLE[lo]), np.abs(TABLE[hi] - a)
    code = np.where(dlo < dhi, lo, np.where(dhi < dlo, hi, np.where(lo % 2 == 0, lo, hi)))
    code = np.where(a >= 448.0, 0x7E, code)
    code = np.where(np.isnan(x), 0x7F, code)
    return (code.astype(np.uint8) | sign).astype(np.uint8)


def bf16_to_f32(b):
    return (b.astype(np.uint32) << 16).view(np.float32)


def ref_quantize(w_bf16, prev_scale=None):
    """codes (uint8) and scale_inv (float32) of a 2-D BF16 tensor (uint16)."""
    rows, cols = w_bf16.shape
    w = bf16_to_f32(w_bf16)
    nbr, nbc = -(-rows // 128), -(-cols // 128)
    scale = np.ones((nbr, nbc), dtype=np.float32)
    codes = np.zeros((rows, cols), dtype=np.uint8)
    for br in range(nbr):
        for bc in range(nbc):
            blk = w[br * 128:(br + 1) * 128, bc * 128:(bc + 1) * 128]
            amax = np.float32(np.max(np.abs(blk)))
            s = np.float32(amax / np.float32(448.0)) if amax > 0 else np.float32(1.0)
            if prev_scale is not None:
                p = prev_scale[br, bc]
                if amax <= np.float32(448.0) * p and amax > np.float32(224.0) * p:
                    s = p
            scale[br, bc] = s
            codes[br * 128:(br + 1) * 128, bc * 128:(bc + 1) * 128] = ref_e4m3(
                (blk / s).astype(np.float32))
    return codes, scale

# ---- safetensors in and out (stdlib + numpy) ----

DT = {"BF16": (np.uint16, 2), "F32": (np.float32, 4), "F8_E4M3": (np.uint8, 1), "I32": (np.int32, 4)}


def st_write(path, tensors):
    header, off, blobs = {}, 0, []
    for name, (dtype, arr) in sorted(tensors.items()):
        b = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": dtype, "shape": list(arr.shape), "data_offsets": [off, off + len(b)]}
        off += len(b)
        blobs.append(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def st_read(path):
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__", {})
    out = {}
    for name, e in header.items():
        a, b = e["data_offsets"]
        out[name] = (e["dtype"], np.frombuffer(data[8 + n + a:8 + n + b], dtype=DT[e["dtype"]][0]).reshape(e["shape"]))
    return out, meta


def quantize(tmp, tensors, *args):
    src, dst = os.path.join(tmp, "in.safetensors"), os.path.join(tmp, "out.safetensors")
    st_write(src, tensors)
    r = subprocess.run([FERRY, "quantize", src, dst, "--json"] + list(args), capture_output=True, text=True)
    return r, (st_read(dst) if r.returncode == 0 else None)


def rand_bf16(rng, shape, scale=0.02):
    w = (rng.standard_normal(shape) * scale).astype(np.float32)
    return (w.view(np.uint32) >> 16).astype(np.uint16)  # truncation: any BF16 values will do

# ---- cases ----


def test_scalar_codes():
    lib = ctypes.CDLL(LIB)
    f = lib.ferry_f32_to_e4m3
    f.argtypes, f.restype = [ctypes.c_float], ctypes.c_uint8
    g = lib.ferry_e4m3_to_f32
    g.argtypes, g.restype = [ctypes.c_uint8], ctypes.c_float
    mids = (TABLE[1:] + TABLE[:-1]) / 2
    rng = np.random.default_rng(1)
    xs = np.concatenate([TABLE, mids, np.nextafter(mids, 0), np.nextafter(mids, 1000),
                         [448.0, 449.0, 463.9, 464.0, 480.0, 1e30, 2.0 ** -10, 2.0 ** -11, 3 * 2.0 ** -11, 1e-30, 0.0],
                         np.abs(rng.standard_normal(20000) * 40),
                         np.exp2(rng.uniform(-12, 9, 20000))]).astype(np.float32)
    xs = np.concatenate([xs, -xs, [np.float32(np.nan), np.float32(np.inf), np.float32(-np.inf)]]).astype(np.float32)
    want = ref_e4m3(xs)
    got = np.array([f(float(x)) for x in xs], dtype=np.uint8)
    bad = np.nonzero(got != want)[0]
    assert bad.size == 0, "first mismatches: %s" % [(float(xs[i]), int(got[i]), int(want[i])) for i in bad[:5]]
    assert f(-0.0) == 0x80 and f(0.0) == 0x00, "the sign is kept on zero"
    for c in range(256):
        v = g(c)
        if c & 0x7F == 0x7F:
            assert v != v, "0x%02x is NaN" % c
        else:
            assert v == (-1 if c & 0x80 else 1) * TABLE[c & 0x7F], "value of 0x%02x" % c
            assert f(v) == c, "0x%02x round-trips" % c


def test_quantize_matches_reference():
    rng = np.random.default_rng(2)
    w = rand_bf16(rng, (300, 260))           # edge blocks in both dims
    w[0:128, 128:256] = 0                     # an all-zero block: scale 1
    w[200, 5] = 0x8000                        # -0
    tiny = rand_bf16(rng, (128, 128), scale=1e-6)  # codes in the subnormal range of some blocks
    tensors = {
        "model.layers.0.mlp.down_proj.weight": ("BF16", w),
        "model.layers.0.tiny.weight": ("BF16", tiny),
        "model.embed_tokens.weight": ("BF16", rand_bf16(rng, (256, 128))),
        "lm_head.weight": ("BF16", rand_bf16(rng, (256, 128))),
        "model.norm.weight": ("BF16", rand_bf16(rng, (260,))),
        "model.layers.0.narrow.weight": ("BF16", rand_bf16(rng, (127, 512))),
        "model.layers.0.f32.weight": ("F32", rng.standard_normal((128, 128)).astype(np.float32)),
        "model.layers.0.i32": ("I32", np.arange(200 * 130, dtype=np.int32).reshape(200, 130)),
    }
    with tempfile.TemporaryDirectory() as tmp:
        r, res = quantize(tmp, tensors)
        assert r.returncode == 0, r.stderr
        out, meta = res
        info = json.loads(r.stdout)
        assert info["tensors"] == 2 and info["blocks"] == 3 * 3 + 1, info
        assert meta.get("ferry.quantize") == "fp8-block128", meta
        for name in ("model.layers.0.mlp.down_proj.weight", "model.layers.0.tiny.weight"):
            codes, scale = ref_quantize(tensors[name][1])
            assert out[name][0] == "F8_E4M3" and out[name + "_scale_inv"][0] == "F32"
            assert np.array_equal(out[name][1], codes), name + ": codes differ from the reference"
            assert np.array_equal(out[name + "_scale_inv"][1].view(np.uint32), scale.view(np.uint32)), name + ": scales"
        assert out["model.layers.0.mlp.down_proj.weight_scale_inv"][1][0, 1] == 1.0, "zero block has scale 1"
        assert out["model.layers.0.mlp.down_proj.weight"][1][200, 5] == 0x80, "-0 keeps its sign"
        for name in ("model.embed_tokens.weight", "lm_head.weight", "model.norm.weight",
                     "model.layers.0.narrow.weight", "model.layers.0.f32.weight", "model.layers.0.i32"):
            assert out[name][0] == tensors[name][0] and np.array_equal(out[name][1], tensors[name][1]), name + " kept"
            assert name + "_scale_inv" not in out
        # FP32 masters under --cast-bf16: quantized as their BF16 cast
        r, res = quantize(tmp, tensors, "--cast-bf16")
        assert r.returncode == 0, r.stderr
        f32 = tensors["model.layers.0.f32.weight"][1]
        u = f32.view(np.uint32).astype(np.uint64)
        b16 = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
        codes, scale = ref_quantize(b16)
        assert np.array_equal(res[0]["model.layers.0.f32.weight"][1], codes), "cast FP32 codes"


def test_sticky_scales():
    rng = np.random.default_rng(3)
    w0 = rand_bf16(rng, (256, 384))
    w1 = w0.copy()
    w1[0, 0] = 0x3F80           # block (0,0): amax grows to 1.0: a fresh scale
    w1[130:140, 130:140] = 0    # a change that keeps the block's amax: the scale stays
    with tempfile.TemporaryDirectory() as tmp:
        r, res0 = quantize(tmp, {"a.weight": ("BF16", w0)})
        assert r.returncode == 0, r.stderr
        prev = os.path.join(tmp, "prev.safetensors")
        os.rename(os.path.join(tmp, "out.safetensors"), prev)
        r, res1 = quantize(tmp, {"a.weight": ("BF16", w1)}, "--scheme", "fp8-block128-sticky", "--prev", prev)
        assert r.returncode == 0, r.stderr
        s0 = res0[0]["a.weight_scale_inv"][1]
        codes, scale = ref_quantize(w1, prev_scale=s0)
        assert np.array_equal(res1[0]["a.weight"][1], codes), "sticky codes"
        assert np.array_equal(res1[0]["a.weight_scale_inv"][1], scale), "sticky scales"
        assert scale[0, 0] != s0[0, 0] and scale[1, 1] == s0[1, 1], "fresh where it grew, kept where it fits"
        assert json.loads(r.stdout)["scales_kept"] >= 5
        assert res1[1].get("ferry.quantize") == "fp8-block128-sticky"


def test_refusals():
    rng = np.random.default_rng(4)
    w = rand_bf16(rng, (128, 128))
    w[3, 7] = 0x7F80  # +inf
    with tempfile.TemporaryDirectory() as tmp:
        r, _ = quantize(tmp, {"a.weight": ("BF16", w)})
        assert r.returncode != 0 and "a.weight" in r.stderr and "[3, 7]" in r.stderr, r.stderr
        assert not os.path.exists(os.path.join(tmp, "out.safetensors")), "nothing written"
        r, _ = quantize(tmp, {"a.weight": ("BF16", rand_bf16(rng, (128, 128))),
                              "a.weight_scale_inv": ("F32", np.ones((1, 1), np.float32))})
        assert r.returncode != 0 and "a.weight_scale_inv" in r.stderr, r.stderr
        r, _ = quantize(tmp, {"a.weight": ("BF16", w)}, "--scheme", "fp4")
        assert r.returncode == 2 and "fp4" in r.stderr, r.stderr


def _masters(rng, steps):
    """FP32 masters of a few versions: about 1% of the words move by an
    Adam-like step each version; at version 3 one block's max grows 4x (a
    fresh scale under either scheme)."""
    v = {"model.layers.0.mlp.down_proj.weight": rng.standard_normal((300, 260)).astype(np.float32) * 0.02,
         "model.layers.0.attn.weight": rng.standard_normal((256, 128)).astype(np.float32) * 0.02,
         "model.embed_tokens.weight": rng.standard_normal((256, 128)).astype(np.float32) * 0.02,
         "model.norm.weight": np.ones(260, np.float32)}
    out = [v]
    for k in range(1, steps):
        v = {n: a.copy() for n, a in v.items()}
        for a in v.values():
            f = a.reshape(-1)
            idx = rng.choice(f.size, max(1, f.size // 100), replace=False)
            f[idx] += rng.choice([-1, 1], idx.size).astype(np.float32) * np.abs(f[idx]) * np.float32(0.02)
        if k == 2:
            v["model.layers.0.attn.weight"][5, 5] = np.float32(0.4)
        out.append(v)
    return out


def test_publish_fp8_memory_mode():
    """Publisher(quantize=...) from FP32 masters (cast_bf16) and a memory
    mode Subscriber: after every version (anchors, deltas, a publisher
    reopened between versions) the island's buffers hold bit for bit
    `ferry quantize --cast-bf16` of the version's masters (with --prev the
    previous output under the sticky scheme).  Reopening the run under
    another scheme, none included, is refused naming both."""
    sys.path.insert(0, os.path.join(ROOT, "python"))
    import ferry
    if not hasattr(ferry, "Publisher"):
        raise _harness.Skip("sync layer not built")
    versions = _masters(np.random.default_rng(5), 5)
    for scheme in ("fp8-block128", "fp8-block128-sticky"):
        with tempfile.TemporaryDirectory() as tmp:
            store = os.path.join(tmp, "store")
            pub = ferry.Publisher(store, "r", quantize=scheme, anchor_every=3, cast_bf16=True)
            sub = ferry.Subscriber(store, "r")
            weights, prev, kinds, moved = None, None, [], 0
            for i, masters in enumerate(versions):
                src = os.path.join(tmp, "m%d.safetensors" % i)
                st_write(src, {n: ("F32", a) for n, a in masters.items()})
                if i == 2:  # a new process would do the same: resume from the store
                    pub.close()
                    for other in ("fp8-block128", "fp8-block128-sticky", None):
                        if other == scheme:
                            continue
                        try:
                            ferry.Publisher(store, "r", quantize=other)
                            raise AssertionError("reopened under %s" % other)
                        except ferry.FerryError as e:
                            assert e.code == ferry.errors.ERR_ARG and scheme in str(e) and str(other or "none") in str(e), e
                    pub = ferry.Publisher(store, "r", quantize=scheme, anchor_every=3, cast_bf16=True)
                    assert pub.version == 2
                assert pub.publish(src) == i + 1
                kinds.append(pub.last_info["kind"])
                ref = os.path.join(tmp, "q%d.safetensors" % i)
                args = ["--cast-bf16", "--scheme", scheme] + (["--prev", prev] if prev and "sticky" in scheme else [])
                r = subprocess.run([FERRY, "quantize", src, ref] + args, capture_output=True, text=True)
                assert r.returncode == 0, r.stderr
                want, meta = st_read(ref)
                assert meta.get("ferry.quantize") == scheme
                if weights is None:  # the engine's buffers, laid out as the FP8 checkpoint
                    weights = {n: (np.zeros_like(a) if d == "F32" else ferry.Raw(d, a.shape, np.zeros_like(a)))
                               for n, (d, a) in want.items()}
                assert sub.sync_into(weights) == i + 1
                for n, (d, a) in want.items():
                    got = weights[n] if d == "F32" else weights[n].data
                    assert np.array_equal(got.view(np.uint8), a.view(np.uint8)), "%s v%d: %s differs" % (scheme, i + 1, n)
                assert want["model.layers.0.attn.weight"][0] == "F8_E4M3"
                assert want["model.embed_tokens.weight"][0] == "BF16" and "model.embed_tokens.weight_scale_inv" not in want
                if prev:
                    moved += int(np.count_nonzero(st_read(prev)[0]["model.layers.0.mlp.down_proj.weight"][1]
                                                  != want["model.layers.0.mlp.down_proj.weight"][1]))
                prev = ref
            assert kinds == ["anchor", "delta", "delta", "anchor", "delta"], kinds
            assert moved > 0, "the versions move FP8 codes (the deltas are not empty)"
            pub.close()
            sub.close()


if __name__ == "__main__":
    _harness.run("test_fp8", [test_scalar_codes, test_quantize_matches_reference, test_sticky_scales, test_refusals,
                              test_publish_fp8_memory_mode])
