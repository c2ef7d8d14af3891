"""FP8 block-quantized weights (include/ferry_quant.h, docs/FORMAT.md "FP8
block quantization"): a quantized tensor NAME holds E4M3FN codes and
NAME_scale_inv one FP32 multiplier per 128 x 128 block of its 2-D view
(rows = dim 0; edge blocks partial), w ~ code * scale.

    w = ferry.fp8.dequantize(codes, scale_inv)        # float32

For tests and for engines without FP8 kernels; an engine with them takes
the codes and scales as they are (ferry.layout slices both together).
"""
from __future__ import annotations

import ctypes
from typing import Any, Optional

import numpy as np

from . import _lib
from .errors import ERR_ARG, ERR_SHAPE_MISMATCH, FerryError, check, cstr
from .model import Raw

BLOCK = 128
SCALE_SUFFIX = "_scale_inv"

_lib._proto("ferry_e4m3_to_f32", ctypes.c_float, ctypes.c_uint8)
_lib._proto("ferry_quant_parse", ctypes.c_int, ctypes.c_char_p, ctypes.POINTER(ctypes.c_int))
_TABLE: Optional[np.ndarray] = None


def scheme_code(name: Optional[str]) -> int:
    """The ferry_quant of a scheme name ("fp8-block128",
    "fp8-block128-sticky", "none"; None: 0, none), parsed by the library
    (FerryError ERR_ARG naming an unknown one): the publishers' quantize."""
    if name is None:
        return 0
    q = ctypes.c_int(0)
    check(_lib.lib.ferry_quant_parse(cstr(name, "quantize scheme"), ctypes.byref(q)))
    return q.value


def table() -> np.ndarray:
    """The FP32 value of every E4M3FN code 0..255 (NaN for S.1111.111),
    read once from the library (ferry_e4m3_to_f32): the one definition."""
    global _TABLE
    if _TABLE is None:
        t = np.array([_lib.lib.ferry_e4m3_to_f32(c) for c in range(256)], dtype=np.float32)
        t.setflags(write=False)
        _TABLE = t
    return _TABLE


def scale_shape(rows: int, cols: int) -> tuple:
    """Shape of NAME_scale_inv for a rows x cols tensor."""
    return (-(-int(rows) // BLOCK), -(-int(cols) // BLOCK))


def _check(name, shape, sshape):
    if len(shape) != 2:
        raise FerryError(ERR_ARG, "fp8.dequantize: %s is %s, not 2-D" % (name, list(shape)))
    want = scale_shape(*shape)
    if tuple(sshape) != want:
        raise FerryError(ERR_SHAPE_MISMATCH, "fp8.dequantize: %s is %s, its scale_inv %s; a %dx%d block grid "
                         "needs %s" % (name, list(shape), list(sshape), BLOCK, BLOCK, list(want)))


def dequantize(codes: Any, scale_inv: Any, name: str = "codes") -> Any:
    """code * scale per block, as float32 (the library's
    ferry_dequantize_fp8, bit for bit: one FP32 product per element).

    codes: a 2-D numpy uint8 array, a ferry.Raw("F8_E4M3", ...), or a torch
    tensor (torch.float8_e4m3fn, or uint8 holding the codes); scale_inv:
    numpy or torch float32 of shape [ceil(rows/128), ceil(cols/128)].
    numpy in, numpy out; torch in, torch out on the codes' device."""
    if isinstance(codes, Raw):
        if codes.dtype != "F8_E4M3":
            raise FerryError(ERR_ARG, "fp8.dequantize: %s is %s, not F8_E4M3" % (name, codes.dtype))
        codes = codes.data.view(np.uint8).reshape(codes.shape)
    if isinstance(codes, np.ndarray):
        if codes.dtype != np.uint8:
            raise FerryError(ERR_ARG, "fp8.dequantize: %s is numpy %s, not uint8 codes" % (name, codes.dtype))
        s = np.asarray(scale_inv)
        if s.dtype != np.float32:
            raise FerryError(ERR_ARG, "fp8.dequantize: the scale_inv of %s is %s, not float32" % (name, s.dtype))
        _check(name, codes.shape, s.shape)
        rows, cols = codes.shape
        full = np.repeat(np.repeat(s, BLOCK, axis=0), BLOCK, axis=1)[:rows, :cols]
        return table()[codes] * full
    return _dequantize_torch(codes, scale_inv, name)


def _dequantize_torch(codes, scale_inv, name):
    import torch
    f8 = getattr(torch, "float8_e4m3fn", None)
    if not isinstance(codes, torch.Tensor):
        raise FerryError(ERR_ARG, "fp8.dequantize: %s is %s, not a numpy array, ferry.Raw or torch tensor"
                         % (name, type(codes).__name__))
    s = scale_inv if isinstance(scale_inv, torch.Tensor) else torch.from_numpy(np.asarray(scale_inv))
    if s.dtype != torch.float32:
        raise FerryError(ERR_ARG, "fp8.dequantize: the scale_inv of %s is %s, not float32" % (name, s.dtype))
    _check(name, tuple(codes.shape), tuple(s.shape))
    rows, cols = codes.shape
    if f8 is not None and codes.dtype == f8:
        q = codes.to(torch.float32)           # exact: every E4M3FN value is an FP32 value
    elif codes.dtype == torch.uint8:
        lut = torch.from_numpy(table().copy()).to(codes.device)
        q = lut[codes.long()]
    else:
        raise FerryError(ERR_ARG, "fp8.dequantize: %s is %s, not float8_e4m3fn or uint8 codes" % (name, codes.dtype))
    s = s.to(codes.device)
    full = s.repeat_interleave(BLOCK, dim=0).repeat_interleave(BLOCK, dim=1)[:rows, :cols]
    return q * full


def dequantize_model(tensors: Any) -> dict:
    """Every NAME with a NAME_scale_inv of a mapping (a checkpoint as
    ferry.load returns it) dequantized to float32; the other tensors as
    they are, the scales left out."""
    out = {}
    for name, t in tensors.items():
        if name.endswith(SCALE_SUFFIX) and name[:-len(SCALE_SUFFIX)] in tensors:
            continue
        s = tensors.get(name + SCALE_SUFFIX)
        out[name] = t if s is None else dequantize(t, s, name)
    return out
