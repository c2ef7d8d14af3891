"""Patches: diff two models, apply a patch (new arrays, a file, or in place).

Every model argument may be a mapping name -> array (a state_dict; borrowed
zero-copy), a path to a .safetensors file or sharded checkpoint, or a
ferry.Model.  A patch is any bytes-like object.
"""
from __future__ import annotations

import collections.abc
import ctypes
from typing import Any, Dict, Optional

from . import _alias, _lib
from .errors import check, cpath
from .model import Model, _Using
from ._typing import Buffer, ModelArg, PathArg, Tensors

L = _lib.lib

KINDS = ("sparse", "whole", "removed", "same")


def _patch_arg(patch):
    """(pointer argument, size, object to keep alive) for a bytes-like patch."""
    if isinstance(patch, bytes):
        return patch, len(patch), patch
    mv = memoryview(patch).cast("B")
    if mv.readonly:
        b = mv.tobytes()
        return b, len(b), b
    buf = (ctypes.c_char * mv.nbytes).from_buffer(mv)
    return buf, mv.nbytes, (buf, mv)


def _apply_options(threads, base_hash):
    o = _lib.ApplyOptions(threads=int(threads))
    keep = None
    if base_hash is not None:
        if len(base_hash) != 16:
            raise ValueError("base_hash must be 16 bytes")
        keep = (ctypes.c_uint8 * 16)(*bytes(base_hash))
        o.base_hash = ctypes.cast(keep, _lib.c_u8p)
    return o, keep


def diff(old: ModelArg, new: ModelArg, cast_bf16: bool = False, threads: int = 1, level: int = 0,
         base_hash: Optional[bytes] = None) -> bytes:
    """The patch old -> new, as bytes.

    cast_bf16=True: new holds FP32 masters; every F32 tensor of new is taken
    as its bfloat16 cast (bit-identical to tensor.to(torch.bfloat16)),
    computed inside the library without a BF16 copy.  base_hash: old's
    16-byte model hash when known (the target of the previous patch), which
    saves a pass over old."""
    o = _lib.DiffOptions(level=int(level), threads=int(threads), cast_bf16=1 if cast_bf16 else 0)
    if base_hash is not None:
        if len(base_hash) != 16:
            raise ValueError("base_hash must be 16 bytes")
        hb = (ctypes.c_uint8 * 16)(*bytes(base_hash))
        o.base_hash = ctypes.cast(hb, _lib.c_u8p)
    out, size = ctypes.c_void_p(), ctypes.c_size_t()
    with _Using(old) as a, _Using(new) as b:
        check(L.ferry_diff(a.handle, b.handle, ctypes.byref(o), ctypes.byref(out),
                           ctypes.byref(size)))
    try:
        return ctypes.string_at(out.value, size.value)
    finally:
        L.ferry_free(out)


def apply(base: ModelArg, patch: Buffer, threads: int = 1, framework: str = "auto") -> Dict[str, Any]:
    """Applies patch to base and returns the result as name -> array (views
    of the library's new model, no further copy).  Raises PatchError with
    code ERR_BASE_MISMATCH if base is not the patch's base,
    ERR_TARGET_MISMATCH if the result does not verify.  framework: as for
    ferry.load."""
    p, n, _keep = _patch_arg(patch)
    o, _hk = _apply_options(threads, None)
    out = ctypes.c_void_p()
    with _Using(base) as b:
        check(L.ferry_apply_ex(b.handle, p, n, ctypes.byref(o), ctypes.byref(out)))
    return Model(out.value).tensors(framework)


def apply_file(base: ModelArg, patch: Buffer, path: PathArg, threads: int = 1) -> None:
    """Applies patch to base and writes the verified result to path as one
    .safetensors file, streaming with bounded memory; nothing is left at
    path on failure."""
    p, n, _keep = _patch_arg(patch)
    o, _hk = _apply_options(threads, None)
    with _Using(base) as b:
        check(L.ferry_apply_file(b.handle, p, n, ctypes.byref(o), cpath(path)))


def apply_inplace(tensors: ModelArg, patch: Buffer, threads: int = 1, base_hash: Optional[bytes] = None,
                  verify_first: bool = False) -> None:
    """Patches the caller's own arrays (mapping name -> numpy array / CPU
    torch tensor) in place.  On any error (wrong base, corrupt patch) they
    hold exactly their old bytes again: the library writes while it
    verifies and puts back what it wrote.  verify_first=True: nothing is
    written before the whole result verified (it decodes twice; for arrays
    that others read meanwhile).  base_hash: the caller vouches the arrays
    hash to this (the target of its last apply), which saves hashing them
    again.  Tied names (one storage under several names, as a tied
    embedding's state_dict has) are patched in private copies of the
    tensors the patch changes, must come out identical, and are written
    once; views that overlap otherwise are refused (FerryError ERR_ARG)."""
    p, n, _keep = _patch_arg(patch)
    o, _hk = _apply_options(threads, base_hash)
    if verify_first:
        o.undo_limit = 1
    tied = _alias.groups(tensors) if isinstance(tensors, collections.abc.Mapping) else []
    if not tied:
        with _Using(tensors, writable=True) as m:
            check(L.ferry_apply_inplace_ex(m.handle, p, n, ctypes.byref(o)))
        return
    # Tied names (one storage under several names): the library patches a
    # private copy of every tensor the patch changes, the group's copies
    # must agree, and only then is the caller's memory written: whether a
    # patch keeps a tie is only known once it is applied, and a refusal
    # must leave every tensor as it was.
    same = {t["name"] for t in inspect(patch)["tensors"] if t["kind"] == "same"}
    work = {k: (v if k in same and not any(k in g for g in tied) else _alias.host_copy(v))
            for k, v in tensors.items()}
    with _Using(work, writable=True) as m:
        check(L.ferry_apply_inplace_ex(m.handle, p, n, ctypes.byref(o)))
    _alias.check_groups(tied, work)
    _alias.write_back(tensors, work, tied)


def inspect(patch: Buffer) -> Dict[str, Any]:
    """What a patch holds, without a base: {"format", "base_hash",
    "target_hash", "tensors": [{"name", "dtype", "nelem", "changed",
    "bytes", "kind"}]}."""
    from .model import DTYPE_NAMES
    p, n, _keep = _patch_arg(patch)
    h = ctypes.c_void_p()
    check(L.ferry_patch_inspect(p, n, ctypes.byref(h)))
    try:
        base, target = (ctypes.c_uint8 * 16)(), (ctypes.c_uint8 * 16)()
        L.ferry_patch_info_hashes(h, base, target)
        tensors = []
        for i in range(L.ferry_patch_info_count(h)):
            t = L.ferry_patch_info_tensor(h, i).contents
            tensors.append({"name": t.name.decode("utf-8"), "dtype": DTYPE_NAMES[t.dtype],
                            "nelem": t.nelem, "changed": t.changed, "bytes": t.bytes,
                            "kind": KINDS[t.kind] if 0 <= t.kind < len(KINDS) else t.kind})
        return {"format": L.ferry_patch_info_format(h), "base_hash": bytes(base),
                "target_hash": bytes(target), "tensors": tensors}
    finally:
        L.ferry_patch_info_free(h)
