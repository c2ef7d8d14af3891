"""Ed25519 keys for signed runs and batches (include/ferry_sign.h,
docs/SECURITY.md).

    ferry.keygen("trainer")                       # trainer.key (0600) + trainer.pub
    pub = ferry.Publisher(url, "rl", keys=ferry.Keys(sign="trainer.key"))
    sub = ferry.Subscriber(url, "rl", keys=ferry.Keys(trust=["trainer.pub"]))

A Subscriber given trusted keys refuses anything unsigned or wrongly signed
(SignatureError) and checks every object against its signed SHA-256;
one given no keys reads signed and unsigned runs without checking."""
from __future__ import annotations

import ctypes
import os
import warnings
from typing import Iterable, List, Optional, Tuple, Union

from . import _lib
from .errors import check, cpath
from ._typing import PathArg

L = _lib.lib
_P, _I, _S, _SZ = ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t
_lib._proto("ferry_keygen", _I, _S, ctypes.c_char_p)
_lib._proto("ferry_keys_create", _I, ctypes.POINTER(_P))
_lib._proto("ferry_keys_free", None, _P)
_lib._proto("ferry_keys_set_signer", _I, _P, _S, ctypes.c_char_p)
_lib._proto("ferry_keys_trust", _I, _P, _S, ctypes.c_int64, ctypes.c_char_p)
_lib._proto("ferry_keys_trusted", _SZ, _P)


def keygen(prefix: PathArg) -> str:
    """Makes PREFIX.key (private, mode 0600) and PREFIX.pub; neither may
    exist.  Returns the key id (16 hex digits)."""
    kid = ctypes.create_string_buffer(17)
    check(L.ferry_keygen(cpath(prefix), kid))
    return kid.value.decode()


def _holds_private_key(path: PathArg) -> bool:
    """Whether a key file holds a PEM private key.  The library trusts its
    public half (documented), but a private key given to trust is usually a
    mistake that copies the secret to every reader: Keys warns (issue 27;
    the CLI's --trust-key the same)."""
    try:
        with open(path, "rb") as f:
            first = f.read(128).split(b"\n", 1)[0]
    except OSError:
        return False  # the library's load reports it
    return first.startswith(b"-----BEGIN ") and b"PRIVATE KEY-----" in first


class Keys(_lib.Handle):
    """A key ring: sign = a private key file (its public half is trusted
    too); trust = public key files, or (path, island) pairs enrolling a key
    for one island's trajectory batches.  Read-only once built; pass it as
    keys= to Publisher and Subscriber (they keep a reference)."""

    _FREE = "ferry_keys_free"

    def __init__(self, sign: Optional[PathArg] = None,
                 trust: Iterable[Union[PathArg, Tuple[PathArg, int]]] = ()) -> None:
        h = ctypes.c_void_p()
        check(L.ferry_keys_create(ctypes.byref(h)))
        self._h = h
        self.ids: List[str] = []
        if sign is not None:
            kid = ctypes.create_string_buffer(17)
            check(L.ferry_keys_set_signer(h, cpath(sign), kid))
            self.ids.append(kid.value.decode())
        for t in trust:
            path, island = (t, -1) if isinstance(t, (str, bytes, os.PathLike)) else t
            if _holds_private_key(path):
                warnings.warn("ferry.Keys: trusted key %s is a PRIVATE key: only its public half is "
                              "trusted; give readers the .pub file and keep the .key on the trainer"
                              % os.fsdecode(path), UserWarning, stacklevel=2)
            kid = ctypes.create_string_buffer(17)
            check(L.ferry_keys_trust(h, cpath(path), int(island), kid))
            self.ids.append(kid.value.decode())

    @property
    def trusted(self) -> int:
        """Number of trusted keys (readers enforce signatures when > 0)."""
        return L.ferry_keys_trusted(self.handle)
