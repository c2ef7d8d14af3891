"""Loading libferry.so and declaring the C prototypes (ctypes).

The library is searched, in order: the path in $FERRY_LIB; build/libferry.so
of the source tree this package sits in (python/ferry/../../build); the
libdir pkg-config gives for libferry (``make install PREFIX=P`` writes
P/lib/pkgconfig/libferry.pc: set PKG_CONFIG_PATH for a prefix outside
pkg-config's default search); the system's library path (libferry.so.0,
libferry.so).  Every prototype is declared here, so a call with a wrong argument
type fails in ctypes instead of in C.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
from typing import Any, Optional, TypeVar

_H = TypeVar("_H", bound="Handle")

c_u8p = ctypes.POINTER(ctypes.c_uint8)
c_u64p = ctypes.POINTER(ctypes.c_uint64)


class Tensor(ctypes.Structure):
    """struct ferry_tensor."""
    _fields_ = [
        ("name", ctypes.c_char_p),
        ("dtype", ctypes.c_int),
        ("ndim", ctypes.c_uint32),
        ("shape", c_u64p),
        ("nelem", ctypes.c_uint64),
        ("nbytes", ctypes.c_uint64),
        ("data", ctypes.c_void_p),
    ]


class DiffOptions(ctypes.Structure):
    """struct ferry_diff_options."""
    _fields_ = [
        ("level", ctypes.c_int),
        ("threads", ctypes.c_int),
        ("cast_bf16", ctypes.c_int),
        ("base_hash", c_u8p),
    ]


class ApplyOptions(ctypes.Structure):
    """struct ferry_apply_options."""
    _fields_ = [
        ("threads", ctypes.c_int),
        ("base_hash", c_u8p),
        ("undo_limit", ctypes.c_uint64),
        ("max_output_bytes", ctypes.c_uint64),
    ]


class PatchTensorInfo(ctypes.Structure):
    """struct ferry_patch_tensor_info."""
    _fields_ = [
        ("name", ctypes.c_char_p),
        ("dtype", ctypes.c_int),
        ("nelem", ctypes.c_uint64),
        ("changed", ctypes.c_uint64),
        ("bytes", ctypes.c_uint64),
        ("kind", ctypes.c_int),
    ]


def _pkg_config():
    """[libdir/libferry.so.0, libdir/libferry.so] of an installed libferry.pc,
    or [] (no pkg-config, no libferry.pc)."""
    import subprocess
    try:
        r = subprocess.run(["pkg-config", "--variable=libdir", "libferry"],
                           capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return []
    d = r.stdout.strip()
    if r.returncode != 0 or not d:
        return []
    return [os.path.join(d, n) for n in ("libferry.so.0", "libferry.so")]


def _candidates():
    env = os.environ.get("FERRY_LIB")
    if env:
        # An explicit choice is final: a wrong $FERRY_LIB must not silently
        # fall back to some other build.
        return [env], True
    here = os.path.dirname(os.path.abspath(__file__))
    tree = os.path.normpath(os.path.join(here, "..", "..", "build", "libferry.so"))
    names = [tree] + _pkg_config()
    found = ctypes.util.find_library("ferry")
    names += [n for n in (found, "libferry.so.0", "libferry.so") if n]
    return names, False


def _load():
    names, explicit = _candidates()
    errors = []
    for name in names:
        if os.sep in name and not os.path.exists(name):
            errors.append("%s: no such file" % name)
            continue
        try:
            return ctypes.CDLL(name), name
        except OSError as e:
            errors.append("%s: %s" % (name, e))
    hint = ("$FERRY_LIB is set but cannot be loaded: point it at a libferry.so that "
            "exists, or unset it" if explicit else
            "build it with `make` in the ferry source tree (this package finds "
            "build/libferry.so beside it); or point $FERRY_LIB at a libferry.so; "
            "or, after `make install PREFIX=P`, set PKG_CONFIG_PATH=P/lib/pkgconfig "
            "(when pkg-config does not search P) or LD_LIBRARY_PATH=P/lib")
    raise ImportError("ferry: libferry.so not found. To fix: %s. Tried: %s"
                      % (hint, "; ".join(errors)))


lib, path = _load()

_P = ctypes.c_void_p
_I = ctypes.c_int
_S = ctypes.c_size_t
_STR = ctypes.c_char_p
_PP = ctypes.POINTER(ctypes.c_void_p)


def _proto(name, restype, *argtypes):
    f = getattr(lib, name)
    f.restype = restype
    f.argtypes = list(argtypes)
    return f


_proto("ferry_strerror", _STR, _I)
_proto("ferry_last_error", _STR)
_proto("ferry_version", _STR)
_proto("ferry_free", None, _P)
_proto("ferry_f32_to_bf16_n", None, _P, _P, _S)
_proto("ferry_dtype_name", _STR, _I)
_proto("ferry_dtype_parse", _I, _STR, ctypes.POINTER(ctypes.c_int))
_proto("ferry_dtype_bits", ctypes.c_uint, _I)

_proto("ferry_model_create", _I, _PP)
_proto("ferry_model_open", _I, _STR, _PP)
_proto("ferry_model_free", None, _P)
_proto("ferry_model_add", _I, _P, _STR, _I, ctypes.c_uint32, c_u64p, _P,
       ctypes.c_uint64, ctypes.c_uint)
_proto("ferry_model_set_metadata", _I, _P, _STR, _STR)
_proto("ferry_model_count", _S, _P)
_proto("ferry_model_tensor", ctypes.POINTER(Tensor), _P, _S)
_proto("ferry_model_find", ctypes.POINTER(Tensor), _P, _STR)
_proto("ferry_model_data_mut", _P, _P, _S)
_proto("ferry_model_metadata_count", _S, _P)
_proto("ferry_model_metadata", _I, _P, _S, ctypes.POINTER(_STR), ctypes.POINTER(_STR))
_proto("ferry_model_metadata_get", _STR, _P, _STR)
_proto("ferry_model_nbytes", ctypes.c_uint64, _P)
_proto("ferry_model_save", _I, _P, _STR)
_proto("ferry_model_hash", _I, _P, c_u8p)

_proto("ferry_diff", _I, _P, _P, ctypes.POINTER(DiffOptions), _PP,
       ctypes.POINTER(ctypes.c_size_t))
_proto("ferry_apply_ex", _I, _P, _P, _S, ctypes.POINTER(ApplyOptions), _PP)
_proto("ferry_apply_file", _I, _P, _P, _S, ctypes.POINTER(ApplyOptions), _STR)
_proto("ferry_apply_inplace_ex", _I, _P, _P, _S, ctypes.POINTER(ApplyOptions))

_proto("ferry_patch_inspect", _I, _P, _S, _PP)
_proto("ferry_patch_info_free", None, _P)
_proto("ferry_patch_info_format", ctypes.c_uint, _P)
_proto("ferry_patch_info_hashes", None, _P, c_u8p, c_u8p)
_proto("ferry_patch_info_count", _S, _P)
_proto("ferry_patch_info_tensor", ctypes.POINTER(PatchTensorInfo), _P, _S)


def has(name: str) -> bool:
    """Whether this build of libferry exports symbol ``name`` (the sync layer
    is absent from NO_NET=1 builds and from libraries built before it)."""
    try:
        getattr(lib, name)
        return True
    except AttributeError:
        return False


class Handle:
    """An owned libferry handle (self._h): .handle (ValueError once
    closed), close() with the class's C free function (_FREE, its name),
    with-blocks, and a free at garbage collection."""
    _FREE: Optional[str] = None
    _h: ctypes.c_void_p

    @property
    def handle(self) -> ctypes.c_void_p:
        """The C handle; ValueError once closed."""
        if not getattr(self, "_h", None):
            raise ValueError("%s is closed" % type(self).__name__)
        return self._h

    def close(self) -> None:
        """Frees the C object now (again: nothing)."""
        if getattr(self, "_h", None):
            getattr(lib, self._FREE)(self._h)
            self._h = ctypes.c_void_p()

    def __enter__(self: _H) -> _H:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown: the library may be gone
            pass
