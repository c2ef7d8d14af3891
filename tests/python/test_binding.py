"""The ctypes binding against real PyTorch and numpy: BF16 casts, zero-copy
in-place patching, dtype and layout checks, errors, load/save, diff/apply
on the rl-b checkpoints.  Run with Debian's /usr/bin/python3."""
import gc
import os
import subprocess
import sys
import tempfile

from _harness import DATA, ROOT, Skip, bits, run, torch_read_safetensors
from _helpers import raises as _raises

import numpy as np
import torch

import ferry

RLB = os.path.join(DATA, "rl-b")
TMP = tempfile.mkdtemp(prefix="ferry-py-")


def rlb(name):
    p = os.path.join(RLB, name)
    if not os.path.exists(p):
        raise Skip("no %s (FERRY_DATA)" % p)
    return p


def same(a, b):
    return a.keys() == b.keys() and all(np.array_equal(bits(a[k]), bits(b[k])) for k in a)


def torch_bf16_words(f32):
    return torch.from_numpy(np.ascontiguousarray(f32, np.float32)).to(torch.bfloat16) \
        .view(torch.int16).numpy().view(np.uint16)


def special_f32():
    """Every class of input the cast must get right, as FP32 bit patterns."""
    u = [0x00000000, 0x80000000,                          # +-0
         0x7F800000, 0xFF800000,                          # +-inf
         0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF800001,  # NaNs: quiet, signalling,
         0x7FFFFFFF, 0xFFFFFFFF, 0x7FA00000, 0x7F80FFFF,  #   payloads, either sign
         0x00000001, 0x80000001, 0x007FFFFF, 0x807FFFFF,  # subnormals
         0x00008000, 0x00018000, 0x00008001, 0x00007FFF,  # subnormal ties / near ties
         0x00800000, 0x80800000,                          # smallest normals
         0x7F7FFFFF, 0xFF7FFFFF, 0x7F7F7FFF, 0x7F7F8000,  # max finite -> inf / rounding to max
         0x3F808000, 0x3F818000, 0x3F808001, 0x3F807FFF,  # ties to even, above, below
         0xBF808000, 0xBF818000, 0x3F800000, 0x3F80FFFF]
    # Every tie and near tie across the exponent range.
    for e in range(0, 255):
        for m in (0x8000, 0x18000, 0x7FFF, 0x8001, 0x17FFF, 0x18001, 0x7F8000, 0x7FFFFF):
            for s in (0, 0x80000000):
                u.append(s | (e << 23) | m)
    return np.array(u, dtype=np.uint32).view(np.float32)


def random_f32(n=1 << 18, seed=1):
    rng = np.random.default_rng(seed)
    bitsv = rng.integers(0, 1 << 32, size=n, dtype=np.uint64).astype(np.uint32)
    weights = (rng.standard_normal(n) * 0.02).astype(np.float32)
    return np.concatenate([bitsv.view(np.float32), weights])


# ---------------------------------------------------------------- BF16

def _check_cast(x, ours, theirs):
    """ours == theirs bit for bit on every non-NaN input.  NaN inputs: both
    must give a NaN, but not the same one: libferry gives 0x7FC0 (c10's
    scalar rule), while Debian's torch 1.13.1 gives 0xFFFF on CPU (its
    vectorized cast; CUDA gives 0x7FFF).  No single NaN word matches every
    PyTorch backend, so only NaN-ness is compared."""
    nan = np.isnan(x)
    bad = np.nonzero((ours != theirs) & ~nan)[0]
    assert bad.size == 0, "first mismatch: f32 %08x -> ferry %04x, torch %04x" % (
        x.view(np.uint32)[bad[0]], ours[bad[0]], theirs[bad[0]])
    for w in (ours[nan], theirs[nan]):
        assert ((w & 0x7F80) == 0x7F80).all() and ((w & 0x7F) != 0).all()
    assert (ours[nan] == 0x7FC0).all()


def test_bf16_cast_matches_torch_values():
    for x in (special_f32(), random_f32()):
        _check_cast(x, ferry.f32_to_bf16(x), torch_bf16_words(x))
    # The vectors of docs/DESIGN.md.
    vec = {0x3F808000: 0x3F80, 0x3F818000: 0x3F82, 0x3F808001: 0x3F81, 0x7F7FFFFF: 0x7F80,
           0x00000001: 0x0000, 0xFF800000: 0xFF80, 0x7F800001: 0x7FC0}
    x = np.array(list(vec), np.uint32).view(np.float32)
    assert list(ferry.f32_to_bf16(x)) == list(vec.values())


def test_bf16_cast_through_diff_gate():
    """FP32 masters diffed with cast_bf16 and applied give exactly
    tensor.to(torch.bfloat16) (NaN: see _check_cast), for special and
    random values, and for finite weights the result is bit-identical."""
    for x in (special_f32(), random_f32(1 << 16, seed=2)):
        master = torch.from_numpy(x.copy()).reshape(-1, 2)
        want = master.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16).reshape(-1)
        base = {"w": torch.zeros(master.shape, dtype=torch.bfloat16)}
        patch = ferry.diff(base, {"w": master}, cast_bf16=True)
        out = ferry.apply(base, patch)
        assert out["w"].dtype == torch.bfloat16
        _check_cast(x, out["w"].view(torch.int16).numpy().view(np.uint16).reshape(-1), want)
        ferry.apply_inplace(base, patch)
        _check_cast(x, base["w"].view(torch.int16).numpy().view(np.uint16).reshape(-1), want)
    finite = torch.randn(300, 7) * 0.02
    base = {"w": torch.zeros(300, 7, dtype=torch.bfloat16)}
    ferry.apply_inplace(base, ferry.diff(base, {"w": finite}, cast_bf16=True))
    assert torch.equal(base["w"].view(torch.int16), finite.to(torch.bfloat16).view(torch.int16))


# ---------------------------------------------------------------- zero-copy

def _two_versions(seed=0):
    g = torch.Generator().manual_seed(seed)
    w = (torch.randn(64, 48, generator=g) * 0.02)
    old = {"a": w.to(torch.bfloat16), "b": np.arange(100, dtype=np.float32),
           "c": np.zeros((3, 4), np.int64)}
    w2 = w.clone()
    w2[::3] += 1e-3
    new = {"a": w2.to(torch.bfloat16), "b": np.arange(100, dtype=np.float32) * 1.5,
           "c": np.ones((3, 4), np.int64)}
    return old, new


def test_apply_inplace_is_zero_copy():
    old, new = _two_versions()
    patch = ferry.diff(old, new)
    mine = {"a": old["a"].clone(), "b": old["b"].copy(), "c": old["c"].copy()}
    addr = {"a": mine["a"].data_ptr(), "b": mine["b"].ctypes.data, "c": mine["c"].ctypes.data}
    alias_b = mine["b"][10:20]          # another view of the same memory
    alias_a = mine["a"].view(torch.int16)
    ferry.apply_inplace(mine, patch)
    assert same(mine, new)
    assert mine["a"].data_ptr() == addr["a"] and mine["b"].ctypes.data == addr["b"] \
        and mine["c"].ctypes.data == addr["c"]
    assert np.array_equal(alias_b, new["b"][10:20])
    assert torch.equal(alias_a, new["a"].view(torch.int16))
    # verify_first: nothing written before everything verified; same result
    mine = {"a": old["a"].clone(), "b": old["b"].copy(), "c": old["c"].copy()}
    ferry.apply_inplace(mine, patch, verify_first=True)
    assert same(mine, new)


def test_model_borrows_without_copy():
    arr = np.arange(12, dtype=np.float32).reshape(3, 4)
    m = ferry.Model.from_tensors({"x": arr})
    t = m._tensor(0)
    assert t.data == arr.ctypes.data
    del arr
    gc.collect()
    # The model keeps the array alive: its bytes are still there.
    assert m.hash() == ferry.model_hash({"x": np.arange(12, dtype=np.float32).reshape(3, 4)})
    m.close()


def test_apply_inplace_untouched_on_error():
    old, new = _two_versions()
    patch = ferry.diff(old, new)
    other = {"a": new["a"].clone(), "b": new["b"].copy(), "c": new["c"].copy()}
    snap = {k: bits(v) for k, v in other.items()}
    try:
        ferry.apply_inplace(other, patch)
        raise AssertionError("applied to the wrong base")
    except ferry.FerryError as e:
        assert e.code == 45, e
    assert all(np.array_equal(bits(other[k]), snap[k]) for k in other)
    # A damaged patch on the right base: refused, base untouched.
    mine = {"a": old["a"].clone(), "b": old["b"].copy(), "c": old["c"].copy()}
    snap = {k: bits(v) for k, v in mine.items()}
    bad = bytearray(patch)
    bad[len(bad) // 2] ^= 0x10
    try:
        ferry.apply_inplace(mine, bad)
        raise AssertionError("a damaged patch applied")
    except ferry.FerryError as e:
        assert e.code in (42, 43, 44, 46), e
    assert all(np.array_equal(bits(mine[k]), snap[k]) for k in mine)
    # Structure differs: a tensor missing.
    try:
        ferry.apply_inplace({"a": old["a"].clone(), "b": old["b"].copy()}, patch)
        raise AssertionError("applied to a model with a tensor missing")
    except ferry.FerryError as e:
        assert e.code in (45, 47), e


# ---------------------------------------------------------------- checks

def test_dtype_and_layout_errors():
    base = np.zeros((4, 6), np.float32)
    e = _raises(ValueError, ferry.model_hash, {"x": base[:, ::2]})
    assert "contiguous" in str(e) and "'x'" in str(e)
    _raises(ValueError, ferry.model_hash, {"x": base.T})
    _raises(ValueError, ferry.model_hash, {"x": torch.zeros(4, 6).t()})
    _raises(ValueError, ferry.model_hash, {"x": torch.zeros(8)[::2]})
    _raises(ValueError, ferry.model_hash, {"x": base.astype(">f4")})
    _raises(TypeError, ferry.model_hash, {"x": np.array(["a", "b"])})
    _raises(TypeError, ferry.model_hash, {"x": np.zeros(3, np.complex128)})
    _raises(TypeError, ferry.model_hash, {"x": np.zeros(3, object)})
    _raises(TypeError, ferry.model_hash, {"x": torch.zeros(3, dtype=torch.complex128)})
    _raises(TypeError, ferry.model_hash, {"x": [1.0, 2.0]})
    _raises(TypeError, ferry.model_hash, {1: base})
    _raises(TypeError, ferry.model_hash, [base])
    _raises(ValueError, ferry.model_hash, {"x": torch.zeros(3, 3).to_sparse()})
    e = _raises(TypeError, ferry.save, os.path.join(TMP, "bad.safetensors"), {"x": base[0].tolist()})
    assert not os.path.exists(os.path.join(TMP, "bad.safetensors"))
    # In place needs writable memory.
    ro = np.zeros(4, np.float32)
    ro.flags.writeable = False
    patch = ferry.diff({"x": ro}, {"x": np.ones(4, np.float32)})
    e = _raises(ValueError, ferry.apply_inplace, {"x": ro}, patch)
    assert "read-only" in str(e)
    # The library's own argument checks surface as FerryError.
    e = _raises(ferry.FerryError, ferry.model_hash, {"": base})
    assert e.code == 2


def test_ferry_error_fields():
    old, new = _two_versions()
    patch = ferry.diff(old, new)
    e = _raises(ferry.FerryError, ferry.apply, new, patch)
    assert e.code == 45 and isinstance(e.code, int)
    assert e.name == ferry.strerror(45) and e.name
    assert "hash" in e.message and e.message in str(e) and "45" in str(e)
    e = _raises(ferry.FerryError, ferry.apply, old, b"not a patch at all, really")
    assert e.code in (40, 42), e
    e = _raises(ferry.FerryError, ferry.load, os.path.join(TMP, "missing.safetensors"))
    assert e.code in (3, 5) and "missing.safetensors" in e.message
    junk = os.path.join(TMP, "junk.safetensors")
    with open(junk, "wb") as f:
        f.write(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}      ")
    e = _raises(ferry.FerryError, ferry.load, junk)
    assert e.code == 12, e
    assert isinstance(e, Exception) and issubclass(ferry.FerryError, Exception)


def test_missing_library_message():
    env = dict(os.environ, FERRY_LIB="/nonexistent/libferry.so")
    r = subprocess.run([sys.executable, "-c", "import ferry"], env=env, cwd=os.path.join(ROOT, "python"),
                       capture_output=True, text=True)
    assert r.returncode != 0 and "ImportError" in r.stderr and "/nonexistent/libferry.so" in r.stderr, r.stderr


# ---------------------------------------------------------------- load / save

def test_save_load_every_dtype():
    rng = np.random.default_rng(3)
    t = {
        "bool": rng.integers(0, 2, 7).astype(np.bool_),
        "u8": rng.integers(0, 255, (2, 3), dtype=np.uint8),
        "i8": rng.integers(-128, 127, 5, dtype=np.int8),
        "i16": rng.integers(-3000, 3000, 5, dtype=np.int16),
        "u16": rng.integers(0, 65535, 5, dtype=np.uint16),
        "f16": rng.standard_normal(9).astype(np.float16),
        "i32": rng.integers(-1 << 30, 1 << 30, 4, dtype=np.int32),
        "u32": rng.integers(0, 1 << 32, 4, dtype=np.uint32),
        "f32": rng.standard_normal((2, 2, 2)).astype(np.float32),
        "f64": rng.standard_normal(3),
        "i64": rng.integers(-1 << 62, 1 << 62, 3, dtype=np.int64),
        "u64": rng.integers(0, 1 << 63, 3, dtype=np.uint64),
        "c64": (rng.standard_normal(4) + 1j * rng.standard_normal(4)).astype(np.complex64),
        "bf16": torch.randn(5, 3).to(torch.bfloat16),
        "t_f32": torch.randn(4, 4),
        "t_i64": torch.arange(6).reshape(2, 3),
        "t_bool": torch.tensor([True, False]),
        "t_c64": torch.randn(3, dtype=torch.complex64),
        "scalar": np.array(2.5, np.float32),
        "empty": np.zeros((0, 4), np.float32),
        "f8": ferry.Raw("F8_E4M3", (4,), np.array([0, 1, 0x38, 0xFE], np.uint8)),
        "f4": ferry.Raw("F4", (6,), np.array([0x12, 0x34, 0x56], np.uint8)),
        "f6": ferry.Raw("F6_E2M3", (4,), np.array([1, 2, 3], np.uint8)),
    }
    path = os.path.join(TMP, "all.safetensors")
    ferry.save(path, t, metadata={"format": "pt", "step": 7})
    m = ferry.Model.open(path)
    assert m.metadata == {"format": "pt", "step": "7"}
    kinds = {n: d for n, d, _, _ in m.describe()}
    assert kinds["bf16"] == "BF16" and kinds["c64"] == "C64" and kinds["f4"] == "F4"
    assert ferry.model_hash(path) == ferry.model_hash(t, {"format": "pt", "step": 7}) == m.hash()
    m.close()
    for fw in ("auto", "np", "pt"):
        back = ferry.load(path, framework=fw)
        assert back.keys() == t.keys()
        for k, v in t.items():
            got = back[k]
            if isinstance(v, ferry.Raw):
                assert isinstance(got, ferry.Raw) and got.dtype == v.dtype and got.shape == v.shape
                assert np.array_equal(got.data, v.data)
                continue
            assert tuple(got.shape) == tuple(v.shape), k
            assert np.array_equal(bits(got), bits(v)), k
        if fw == "auto":
            assert isinstance(back["bf16"], torch.Tensor) and back["bf16"].dtype == torch.bfloat16
            assert isinstance(back["f32"], np.ndarray) and back["f32"].dtype == np.float32
            assert isinstance(back["t_i64"], np.ndarray)
        if fw == "np":
            assert isinstance(back["bf16"], ferry.Raw) and back["bf16"].data.dtype == np.uint16
        if fw == "pt":
            assert all(isinstance(back[k], torch.Tensor) for k in t
                       if k not in ("u16", "u32", "u64") and not isinstance(t[k], ferry.Raw))
    # The torch reader agrees on the torch-representable ones.
    ref = torch_read_safetensors(path)
    for k in ("bf16", "f32", "t_i64", "i16", "c64", "bool", "scalar", "empty"):
        assert np.array_equal(bits(ref[k]), bits(t[k])), k


def test_load_is_copy_on_write():
    path = os.path.join(TMP, "cow.safetensors")
    ferry.save(path, {"w": np.arange(1000, dtype=np.float32), "h": torch.ones(10, dtype=torch.bfloat16)})
    before = open(path, "rb").read()
    d = ferry.load(path)
    assert d["w"].flags.writeable
    d["w"][:] = -1
    d["h"].add_(1)
    assert (d["w"] == -1).all() and (d["h"].float() == 2).all()
    assert open(path, "rb").read() == before      # the file never changes
    assert ferry.load(path)["w"][5] == 5


def test_arrays_outlive_their_models():
    old, new = _two_versions()
    patch = ferry.diff(old, new)
    out = ferry.apply(old, patch)
    path = os.path.join(TMP, "keep.safetensors")
    ferry.save(path, new)
    loaded = ferry.load(path)
    gc.collect()
    junk = [np.ones(1 << 16) for _ in range(50)]  # reuse freed memory, if any
    del junk
    assert same(out, new) and same(loaded, new)
    a = out["a"]
    del out
    gc.collect()
    assert torch.equal(a.view(torch.int16), new["a"].view(torch.int16))


def test_state_dict_of_a_module():
    net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    sd = net.state_dict()
    params = dict(net.named_parameters())          # requires_grad leaves
    assert ferry.model_hash(sd) == ferry.model_hash(params)
    bf = {k: v.detach().to(torch.bfloat16) for k, v in sd.items()}
    with torch.no_grad():
        for p in net.parameters():
            p.add_(1e-2)
    patch = ferry.diff(bf, net.state_dict(), cast_bf16=True)
    ferry.apply_inplace(bf, patch)
    for k, v in net.state_dict().items():
        assert torch.equal(bf[k].view(torch.int16), v.to(torch.bfloat16).view(torch.int16)), k


# ---------------------------------------------------------------- rl-b

def test_rlb_load_matches_torch():
    for i in range(5):
        p = rlb("step-%03d.safetensors" % i)
        ours, ref = ferry.load(p), torch_read_safetensors(p)
        assert ours.keys() == ref.keys()
        for k in ref:
            assert ours[k].dtype == ref[k].dtype and ours[k].shape == ref[k].shape
            assert torch.equal(ours[k].view(torch.int16), ref[k].view(torch.int16)), k
    for i in range(2):
        p = rlb("master-%03d.safetensors" % i)
        ours, ref = ferry.load(p), torch_read_safetensors(p)
        assert all(np.array_equal(ours[k], ref[k].numpy()) for k in ref)


def test_rlb_diff_apply_round_trip():
    steps = [rlb("step-%03d.safetensors" % i) for i in range(5)]
    held = {k: v.clone() for k, v in ferry.load(steps[0]).items()}
    md = ferry.Model.open(steps[0]).metadata
    total = full = 0
    for i in range(4):
        a, b = ferry.load(steps[i]), ferry.load(steps[i + 1])
        # Paths, loaded dicts and torch-read dicts all make working patches.
        p_files = ferry.diff(steps[i], steps[i + 1], threads=2)
        p_dicts = ferry.diff(a, b)
        ref_a, ref_b = torch_read_safetensors(steps[i]), torch_read_safetensors(steps[i + 1])
        p_torch = ferry.diff(ref_a, ref_b)
        assert p_dicts == p_torch
        assert same(ferry.apply(steps[i], p_files), b)
        assert same(ferry.apply(a, p_dicts), b)
        assert same(ferry.apply(ref_a, p_torch), ref_b)
        # In place on the caller's own tensors, following the chain.
        ferry.apply_inplace(held, p_dicts)
        assert same(held, b)
        out = os.path.join(TMP, "applied-%d.safetensors" % i)
        ferry.apply_file(steps[i], p_files, out)
        assert ferry.model_hash(out) == ferry.model_hash(steps[i + 1]) == ferry.model_hash(b, md)
        info = ferry.inspect(p_files)
        assert info["target_hash"] == ferry.model_hash(steps[i + 1])
        total += len(p_dicts)
        full += sum(v.numel() * v.element_size() for v in b.values())
    assert total * 10 < full, (total, full)


def test_rlb_masters_cast_like_torch():
    """The data set's BF16 steps are PyTorch casts of its FP32 masters: a
    diff from step 0 to master 1 with cast_bf16 reproduces step 1."""
    m1 = ferry.load(rlb("master-001.safetensors"))
    s0, s1 = rlb("step-000.safetensors"), ferry.load(rlb("step-001.safetensors"))
    for k, v in m1.items():
        assert torch.equal(torch.from_numpy(v).to(torch.bfloat16).view(torch.int16),
                           s1[k].view(torch.int16)), k
    patch = ferry.diff(ferry.load(s0), m1, cast_bf16=True)
    assert same(ferry.apply(ferry.load(s0), patch), s1)
    m1t = {k: torch.from_numpy(v) for k, v in m1.items()}
    assert ferry.diff(ferry.load(s0), m1t, cast_bf16=True) == patch


def test_without_torch():
    """numpy-only callers never import torch; with no torch at all, BF16
    loads as uint16 words."""
    path = os.path.join(TMP, "nt.safetensors")
    ferry.save(path, {"h": torch.tensor([1.0, -2.0], dtype=torch.bfloat16),
                      "f": np.array([3.0], np.float32)})
    code = ("import sys; sys.modules['torch'] = None\n"
            "import ferry, numpy as np\n"
            "d = ferry.load(%r)\n"
            "h = d['h']\n"
            "assert isinstance(h, ferry.Raw) and h.dtype == 'BF16' and h.shape == (2,)\n"
            "assert h.data.dtype == np.uint16 and list(h.data) == [0x3F80, 0xC000], h\n"
            "assert d['f'].dtype == np.float32\n"
            "new = {'h': ferry.Raw('BF16', (2,), np.array([0x3F80, 0xC001], np.uint16)), 'f': d['f']}\n"
            "p = ferry.diff(d, new)\n"
            "ferry.apply_inplace(d, p)\n"
            "assert list(h.data) == [0x3F80, 0xC001]\n"
            % path)
    r = subprocess.run([sys.executable, "-c", code], cwd=os.path.join(ROOT, "python"),
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    code = ("import sys, ferry\nferry.load(%r, framework='np')\nferry.model_hash(%r)\n"
            "assert 'torch' not in sys.modules\n" % (path, path))
    r = subprocess.run([sys.executable, "-c", code], cwd=os.path.join(ROOT, "python"),
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_load_sharded_checkpoint():
    import json
    d = os.path.join(TMP, "sharded")
    os.makedirs(d)
    a = {"x.a": torch.randn(8, 4).to(torch.bfloat16), "x.b": np.arange(5, dtype=np.int32)}
    b = {"y": np.ones((2, 2), np.float32)}
    ferry.save(os.path.join(d, "m-1.safetensors"), a, {"format": "pt"})
    ferry.save(os.path.join(d, "m-2.safetensors"), b, {"format": "pt"})
    wm = {k: "m-1.safetensors" for k in a}
    wm.update({k: "m-2.safetensors" for k in b})
    idx = os.path.join(d, "model.safetensors.index.json")
    with open(idx, "w") as f:
        json.dump({"metadata": {"total_size": 0}, "weight_map": wm}, f)
    whole = dict(a, **b)
    for p in (d, idx):
        got = ferry.load(p)
        assert same(got, whole)
        got["y"][0, 0] = 7                     # copies: writable, file unchanged
    assert ferry.load(idx)["y"][0, 0] == 1
    assert ferry.model_hash(idx) == ferry.model_hash(whole, {"format": "pt"})
    patch = ferry.diff(idx, dict(whole, y=np.zeros((2, 2), np.float32)), threads=2)
    e = _raises(ferry.FerryError, ferry.apply, whole, patch)   # metadata differs
    assert e.code == 45
    out = ferry.apply(idx, patch, threads=2)
    assert np.array_equal(out["y"], np.zeros((2, 2), np.float32))


def test_callers_model_stays_open():
    old, new = _two_versions()
    m = ferry.Model.from_tensors(new, {"k": "v"})
    path = os.path.join(TMP, "from-model.safetensors")
    ferry.save(path, m)
    assert ferry.model_hash(m) == m.hash() == ferry.model_hash(path)
    assert len(m) == 3 and m.metadata == {"k": "v"}
    _raises(ValueError, ferry.save, path, m, {"x": "y"})
    base = ferry.Model.from_tensors({"a": old["a"].clone(), "b": old["b"].copy(),
                                     "c": old["c"].copy()}, writable=True)
    ferry.apply_inplace(base, ferry.diff(old, new))
    assert base.hash() == ferry.model_hash(new)
    m.close()
    _raises(ValueError, ferry.model_hash, m)


if __name__ == "__main__":
    import shutil
    try:
        run("binding", [v for k, v in list(globals().items()) if k.startswith("test_")])
    finally:
        shutil.rmtree(TMP, ignore_errors=True)
