"""Ed25519 keys for signed runs and batches (include/ferry_sign.h,
docs/SECURITY.md).

    ferry.keygen("trainer")                       # trainer.key (0600) + trainer.pub
    pub = ferry.Publisher(url, "rl", keys=ferry.Keys(sign="trainer.key"))
    sub = ferry.Subscriber(url, "rl", keys=ferry.Keys(trust=["trainer.pub"]))

A Subscriber given trusted keys refuses anything unsigned or wrongly signed
(SignatureError) and checks every object against its signed SHA-256;
one given no keys (keys=None) reads signed and unsigned runs without
checking.  A Keys with no key in it is an error, never "no keys".

Every trusted key has one role (include/ferry_sign.h): a publisher key
(the trainer's) verifies versions — HEAD, manifests, the compaction index —
and the dock cursor; island I's key verifies island I's batches only, and
never a version.  The rings:

    trainer  = ferry.Keys(sign="trainer.key",                  # publisher
                          trust=[("island0.pub", 0), ("island1.pub", 1)])
    island_0 = ferry.Keys(trust=["trainer.pub"])                # versions
    batches  = ferry.Keys(sign="island0.key", island=0)        # batches only"""
from __future__ import annotations

from __future__ import annotations

import ctypes
import os
import warnings
from typing import Iterable, List, Optional, Tuple, Union
from typing import Iterable, List, Optional, Tuple, Union

from . import _lib
from .errors import ERR_ARG, FerryError, check, cpath
from ._typing import PathArg

L = _lib.lib
_P, _I, _S, _SZ = ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t
_lib._proto("ferry_keygen", _I, _S, ctypes.c_char_p)
_lib._proto("ferry_keys_create", _I, ctypes.POINTER(_P))
_lib._proto("ferry_keys_free", None, _P)
_lib._proto("ferry_keys_set_signer", _I, _P, _S, ctypes.c_char_p)
_lib._proto("ferry_keys_set_island_signer", _I, _P, _S, ctypes.c_int64, ctypes.c_char_p)
_lib._proto("ferry_keys_trust", _I, _P, _S, ctypes.c_int64, ctypes.c_char_p)
_lib._proto("ferry_keys_trusted", _SZ, _P)
_lib._proto("ferry_keys_publishers", _SZ, _P)


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
    """A key ring (see the module docstring for the trainer's and an
    island's).  sign = a private key file: a publisher key (its public half
    trusted as a publisher too), or with island=I island I's batch key
    (trusted for island I only; the ring then cannot sign a version).
    trust = public key files, each a PUBLISHER key (the trainer's: it
    verifies versions), or (path, island) pairs enrolling a key for that
    island's trajectory batches only.  A trust list given empty (a glob
    that matched nothing), or a ring with no key at all, raises FerryError
    (ERR_ARG) instead of reading unsigned runs.  Read-only once built; pass
    it as keys= to Publisher and Subscriber (they keep a reference)."""

    _FREE = "ferry_keys_free"

    def __init__(self, sign: Optional[PathArg] = None,
                 trust: Optional[Iterable[Union[PathArg, Tuple[PathArg, int]]]] = None,
                 island: Optional[int] = None) -> None:
        given = trust is not None
        trust = list(trust) if given else []
        if given and not trust:
            raise FerryError(ERR_ARG, "Keys: trust is empty (a glob that matched nothing?): "
                             "a ring must trust a key; pass keys=None to read unsigned runs")
        if sign is None and not trust:
            raise FerryError(ERR_ARG, "Keys: no signing key and no trusted key")
        if island is not None and sign is None:
            raise FerryError(ERR_ARG, "Keys: island= names the island whose key sign= is")
        h = ctypes.c_void_p()
        check(L.ferry_keys_create(ctypes.byref(h)))
        self._h = h
        self.ids: List[str] = []
        if sign is not None:
            kid = ctypes.create_string_buffer(17)
            if island is None:
                check(L.ferry_keys_set_signer(h, cpath(sign), kid))
            else:
                check(L.ferry_keys_set_island_signer(h, cpath(sign), int(island), kid))
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
        """Number of trusted keys, all roles (the signer's included)."""
        return L.ferry_keys_trusted(self.handle)

    @property
    def publishers(self) -> int:
        """Number of publisher keys: those that verify versions."""
        return L.ferry_keys_publishers(self.handle)
