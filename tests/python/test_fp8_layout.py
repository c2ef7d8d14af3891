"""The engine side of FP8 runs (issue 25 item 4): ferry.fp8.dequantize and
ferry.layout on FP8 checkpoints.

  - dequantize (numpy codes, ferry.Raw, torch uint8 codes; torch
    float8_e4m3fn where this torch has it) is bit for bit the library's
    ferry_dequantize_fp8 on a tensor with edge blocks and every code;
  - Layout.llama of an FP8 checkpoint (`ferry quantize` of a small
    Llama-style model) gives every quantized parameter its _scale_inv
    parameter, split on the block grid; at TP 1 and 2 each rank's
    codes and scales (Layout.shard) dequantize to exactly its slice of the
    full dequantized parameter;
  - a split that cuts a 128x128 block (TP 4 of 256 rows, a fused part
    ending inside a block) is refused naming the parameter, before any
    parameter is recorded.
Plain torch on the CPU, /usr/bin/python3."""
import ctypes
import os
import subprocess
import tempfile

import numpy as np
import torch

from _harness import ROOT, Skip, run

import ferry
from ferry import fp8
from ferry.errors import ERR_ARG, ERR_SHAPE_MISMATCH, FerryError
from ferry.layout import Layout

BUILD = os.environ.get("FERRY_BUILD", os.path.join(ROOT, "build"))
FERRY = os.environ.get("FERRY_BIN", os.path.join(BUILD, "ferry"))


def _lib_dequantize(codes, scale):
    f = ferry._lib.lib.ferry_dequantize_fp8
    f.restype = None
    f.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_void_p]
    out = np.empty(codes.shape, np.float32)
    codes, scale = np.ascontiguousarray(codes), np.ascontiguousarray(scale, dtype=np.float32)
    f(codes.ctypes.data, scale.ctypes.data, codes.shape[0], codes.shape[1], out.ctypes.data)
    return out


def _same(a, b):
    """Bit-identical float32 arrays (NaN payloads included)."""
    a = a.numpy() if isinstance(a, torch.Tensor) else a
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


def test_dequantize_matches_library():
    rng = np.random.default_rng(7)
    codes = rng.integers(0, 256, (300, 260), dtype=np.uint8)
    codes[:16, :16] = np.arange(256, dtype=np.uint8).reshape(16, 16)   # every code, NaNs included
    scale = (rng.random((3, 3)) * 1e-3).astype(np.float32)
    scale[1, 2] = 1.0
    want = _lib_dequantize(codes, scale)
    assert np.isnan(want[15, 15]) and np.isnan(want[7, 15]), "0x7F and 0xFF are NaN"
    assert _same(fp8.dequantize(codes, scale), want), "numpy"
    assert _same(fp8.dequantize(ferry.Raw("F8_E4M3", codes.shape, codes.copy()), scale), want), "ferry.Raw"
    t = fp8.dequantize(torch.from_numpy(codes), torch.from_numpy(scale))
    assert isinstance(t, torch.Tensor) and t.dtype == torch.float32 and _same(t, want), "torch uint8 codes"
    assert _same(fp8.dequantize(torch.from_numpy(codes), scale), want), "torch codes, numpy scales"
    for bad, code in (((codes, scale[:2]), ERR_SHAPE_MISMATCH), ((codes.astype(np.int8), scale), ERR_ARG),
                      ((codes, scale.astype(np.float64)), ERR_ARG), ((codes.reshape(-1), scale), ERR_ARG),
                      ((torch.from_numpy(codes).float(), scale), ERR_ARG)):
        try:
            fp8.dequantize(*bad, name="w")
            raise AssertionError("accepted %s" % ([type(x).__name__ for x in bad],))
        except FerryError as e:
            assert e.code == code and "w" in str(e), e


def test_dequantize_float8_dtype():
    f8 = getattr(torch, "float8_e4m3fn", None)
    if f8 is None:
        raise Skip("torch %s has no float8_e4m3fn (the uint8 table path is tested)" % torch.__version__)
    rng = np.random.default_rng(8)
    codes = rng.integers(0, 256, (200, 130), dtype=np.uint8)
    codes[codes & 0x7F == 0x7F] = 0                 # NaN payloads aside: torch's own NaN
    scale = (rng.random((2, 2)) * 1e-2).astype(np.float32)
    t = fp8.dequantize(torch.from_numpy(codes).view(f8), torch.from_numpy(scale))
    assert _same(t, _lib_dequantize(codes, scale))


# ---- layouts of an FP8 checkpoint ----

def _checkpoint(tmp):
    """A small Llama-style BF16 checkpoint and its FP8 version, loaded as
    torch tensors (F8_E4M3 as uint8: ferry.load gives Raw, viewed here)."""
    rng = np.random.default_rng(9)
    shapes = {"model.embed_tokens.weight": (512, 256), "lm_head.weight": (512, 256), "model.norm.weight": (256,)}
    for m, s in (("q_proj", (256, 256)), ("k_proj", (256, 256)), ("v_proj", (256, 256)), ("o_proj", (256, 256))):
        shapes["model.layers.0.self_attn.%s.weight" % m] = s
    for m, s in (("gate_proj", (512, 256)), ("up_proj", (512, 256)), ("down_proj", (256, 512))):
        shapes["model.layers.0.mlp.%s.weight" % m] = s
    shapes["model.layers.0.input_layernorm.weight"] = (256,)
    src, dst = os.path.join(tmp, "bf16.safetensors"), os.path.join(tmp, "fp8.safetensors")
    ferry.save(src, {n: torch.from_numpy(rng.standard_normal(s).astype(np.float32) * 0.02).to(torch.bfloat16)
                     for n, s in shapes.items()})
    r = subprocess.run([FERRY, "quantize", src, dst], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    out = {}
    for n, t in ferry.load(dst).items():
        if isinstance(t, ferry.Raw):
            t = t.data.view(np.uint8).reshape(t.shape)
        out[n] = torch.from_numpy(t.copy()) if isinstance(t, np.ndarray) else t
    return out


def test_layout_slices_scales_with_codes():
    with tempfile.TemporaryDirectory() as tmp:
        full = _checkpoint(tmp)
    shapes = {n: tuple(t.shape) for n, t in full.items()}
    whole = Layout.llama(shapes, 1, 0).shard(full)
    assert "model.layers.0.self_attn.qkv_proj.weight_scale_inv" in whole
    deq = {n: fp8.dequantize(whole[n], whole[n + "_scale_inv"], n)
           for n in whole if n + "_scale_inv" in whole}
    assert sorted(deq) == sorted(n for n in whole if n.endswith("_proj.weight")), sorted(deq)
    for tp in (1, 2):
        for rank in range(tp):
            lay = Layout.llama(shapes, tp, rank)
            p = lay.params["model.layers.0.self_attn.qkv_proj.weight"]
            assert p.scale == "model.layers.0.self_attn.qkv_proj.weight_scale_inv"
            assert lay.params[p.scale].shape == (p.shape[0] // 128, 2), lay.params[p.scale].shape
            assert lay.params["model.embed_tokens.weight"].scale is None, "BF16 tensors have no scales"
            part = lay.shard(full)
            lay.check_engine(part)
            for name, ref in deq.items():
                pp = lay.params[name]
                got = fp8.dequantize(part[name], part[pp.scale], name)
                if pp.kind == "row":
                    c = ref.shape[1] // tp
                    want = ref[:, rank * c:(rank + 1) * c]
                else:   # column / fused: each source's rows of this rank, in order
                    want = torch.cat([deq_rows(full, r) for r in pp.regions])
                assert torch.equal(got.view(torch.int32), want.contiguous().view(torch.int32)), \
                    "tp %d rank %d: %s dequantizes to another slice" % (tp, rank, name)
    try:   # TP 4: 64 rows of q_proj per rank
        Layout.llama(shapes, 4, 0)
        raise AssertionError("TP 4 of a 256-row FP8 q_proj was accepted")
    except FerryError as e:
        assert e.code == ERR_ARG and "qkv_proj.weight" in str(e) and "rows 0..64 of 'model.layers.0.self_attn.q_proj" \
            in str(e), e


def deq_rows(full, r):
    """The full dequantized source of region r, cut to the region."""
    d = fp8.dequantize(full[r.source], full[r.source + "_scale_inv"], r.source)
    return d[r.row_begin:r.row_end, r.col_begin:r.col_end]


def test_layout_refuses_cut_blocks():
    shapes = {"model.layers.0.self_attn.o_proj.weight": (256, 256),
              "model.layers.0.self_attn.o_proj.weight_scale_inv": (2, 2),
              "model.layers.0.mlp.down_proj.weight": (256, 384),
              "model.layers.0.mlp.down_proj.weight_scale_inv": (2, 3)}
    try:   # TP 4: 64 columns per rank of o_proj
        Layout.llama(shapes, 4, 1)
        raise AssertionError("a 64-column split of an FP8 tensor was accepted")
    except FerryError as e:
        assert e.code == ERR_ARG and "o_proj.weight" in str(e) and "cuts a 128x128" in str(e), e
    try:   # TP 2 of down_proj's 384 columns: 192 per rank
        Layout.llama(shapes, 2, 1)
        raise AssertionError("a 192-column split of an FP8 tensor was accepted")
    except FerryError as e:
        assert e.code == ERR_ARG and "down_proj.weight" in str(e) and "cols 192..384" in str(e), e
    del shapes["model.layers.0.mlp.down_proj.weight"], shapes["model.layers.0.mlp.down_proj.weight_scale_inv"]
    lay = Layout.llama(shapes, 2, 1)       # 128 per rank: fine
    assert lay.params["model.layers.0.self_attn.o_proj.weight_scale_inv"].shape == (2, 1)
    assert [(r.source, r.col_begin, r.col_end) for r in lay.params[
        "model.layers.0.self_attn.o_proj.weight_scale_inv"].regions] == [
        ("model.layers.0.self_attn.o_proj.weight_scale_inv", 1, 2)]
    # a fused part that ends inside a block: q 192 rows + k + v at TP 1
    shapes = {"a.q_proj.weight": (192, 128), "a.q_proj.weight_scale_inv": (2, 1),
              "a.k_proj.weight": (128, 128), "a.k_proj.weight_scale_inv": (1, 1),
              "a.v_proj.weight": (128, 128), "a.v_proj.weight_scale_inv": (1, 1)}
    lay = Layout(shapes, 1, 0)
    try:
        lay.add("a.qkv_proj.weight", "fused", ["a.q_proj.weight", "a.k_proj.weight", "a.v_proj.weight"])
        raise AssertionError("a fused part ending inside a block was accepted")
    except FerryError as e:
        assert e.code == ERR_ARG and "a.qkv_proj.weight" in str(e) and "a.q_proj.weight" in str(e), e
    assert not lay.params and not lay.regions, "nothing recorded"
    # a scale of the wrong shape
    try:
        Layout({"w": (256, 128), "w_scale_inv": (1, 1)}, 1, 0).add("w", "replicated", "w")
        raise AssertionError("a wrong scale shape was accepted")
    except FerryError as e:
        assert e.code == ERR_SHAPE_MISMATCH and "w_scale_inv" in str(e), e


if __name__ == "__main__":
    run("fp8_layout", [test_dequantize_matches_library, test_dequantize_float8_dtype,
                       test_layout_slices_scales_with_codes, test_layout_refuses_cut_blocks])
