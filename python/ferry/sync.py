"""Versioned policy distribution (include/ferry_sync.h): a Publisher on the
trainer, Subscribers on the rollout workers, sharing only an object store.

    pub = ferry.Publisher("file:///shared/policy", "run-7")
    version = pub.publish(model.state_dict())        # FP32 masters, cast to BF16 in C

    sub = ferry.Subscriber("file:///shared/policy", "run-7")
    version = sub.sync_into(engine_weights)          # patched in place, verified

A store is a URL (file:///dir, a plain path, s3://bucket/prefix,
http(s)://...) or a ferry.Store.  Network stores take their credentials and
endpoint from the environment (docs/STORE.md).
"""
from __future__ import annotations

import collections.abc
import ctypes
import os
import threading
import weakref
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterable, Optional, Union

from . import _lib
from . import _alias
from .errors import (ERR_ARG, ERR_NOT_FOUND, ERR_SHAPE_MISMATCH, ERR_SYNC_FOREIGN, FerryError, check,
                     cpath, cstr)
from .fp8 import scheme_code
from .model import Model, Raw, _Using, _torch
from .patch import diff as ferry_diff, inspect as ferry_inspect
from ._typing import ModelArg, PathArg, StoreArg, Tensors

if TYPE_CHECKING:
    from .sign import Keys

L = _lib.lib
_P, _I, _U32, _U64, _S = (ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32,
                          ctypes.c_uint64, ctypes.c_char_p)


# ----------------------------------------------------------------------
# C structures (mirrors of include/ferry_store.h and ferry_sync.h)
# ----------------------------------------------------------------------

class _StoreOptions(ctypes.Structure):
    _fields_ = [("deadline_ms", _U64), ("max_object_size", _U64),
                ("progress", _P), ("progress_user", _P), ("create", _I),
                ("connect_timeout_ms", _U32), ("stall_timeout_ms", _U32),
                ("max_attempts", _U32), ("retry_base_ms", _U32),
                ("max_bytes_per_s", _U64), ("ca_file", _S),
                ("endpoint", _S), ("region", _S), ("access_key", _S),
                ("secret_key", _S), ("session_token", _S), ("anonymous", _I),
                ("unsigned_payload", _I), ("part_size", _U64), ("cas_mode", _I),
                ("list_page_size", _U32), ("max_list_entries", _U64),
                ("upload_concurrency", ctypes.c_uint)]


class _PublisherOptions(ctypes.Structure):
    _fields_ = [("publisher_id", _S), ("anchor_every", _U32), ("cast_bf16", _I),
                ("level", _I), ("threads", _I), ("verify", _I),
                ("cache_path", _S), ("tmp_dir", _S),
                ("keys", _P),  # const ferry_keys * (ferry.Keys, include/ferry_sign.h)
                ("quantize", _I),  # a ferry_quant (include/ferry_quant.h)
                ("run_id", _S), ("new_run", _I)]


class _PublishInfo(ctypes.Structure):
    _fields_ = [("version", _U64), ("kind", _I), ("delta_bytes", _U64),
                ("full_bytes", _U64), ("model_bytes", _U64),
                ("model_hash", ctypes.c_uint8 * 16), ("id", ctypes.c_char * 17),
                ("seconds", ctypes.c_double)]


class _SubscriberOptions(ctypes.Structure):
    _fields_ = [("path", _S), ("model", _P), ("model_version", _U64),
                ("threads", _I), ("poll_interval_ms", _U32), ("max_attempts", _U32),
                ("no_compactions", _I), ("tmp_dir", _S),
                ("keys", _P),  # const ferry_keys * (ferry.Keys, include/ferry_sign.h)
                ("concurrency", ctypes.c_uint), ("chunk_size", _U64),
                ("run_id", _S)]


class _SyncInfo(ctypes.Structure):
    _fields_ = [("from_version", _U64), ("to_version", _U64), ("head_version", _U64),
                ("bytes_fetched", _U64), ("planned_bytes", _U64), ("chain_bytes", _U64),
                ("anchor_bytes", _U64), ("compacted_bytes", _U64), ("steps", _U32),
                ("rejected", _U32), ("path", ctypes.c_char * 128)]


class _SubscriberStats(ctypes.Structure):
    _fields_ = [("syncs", _U64), ("steps", _U64), ("bytes_fetched", _U64),
                ("objects_fetched", _U64), ("manifests_fetched", _U64),
                ("rejected", _U64), ("last_rejection", ctypes.c_char * 512)]


class _MirrorOptions(ctypes.Structure):
    _fields_ = [("keep", _U64), ("grace_s", ctypes.c_int64), ("tmp_dir", _S),
                ("max_versions", _U64), ("concurrency", ctypes.c_uint),
                ("chunk_size", _U64),
                ("keys", _P)]  # const ferry_keys * (ferry.Keys, include/ferry_sign.h)


class _MirrorInfo(ctypes.Structure):
    _fields_ = [("from_version", _U64), ("to_version", _U64), ("src_version", _U64),
                ("first_copied", _U64), ("versions_copied", _U32),
                ("objects_copied", _U32), ("objects_reused", _U32),
                ("bytes_copied", _U64), ("gc_deleted", _U64), ("seconds", ctypes.c_double),
                ("compactions_copied", _U32), ("index_copied", _U32)]


_PP = ctypes.POINTER(ctypes.c_void_p)
_lib._proto("ferry_store_open", _I, _S, ctypes.POINTER(_StoreOptions), _PP)
_lib._proto("ferry_store_free", None, _P)
_lib._proto("ferry_store_url", _S, _P)
_lib._proto("ferry_store_kind", _I, _P)
_lib._proto("ferry_publisher_open", _I, _P, _S, ctypes.POINTER(_PublisherOptions), _PP)
_lib._proto("ferry_publisher_free", None, _P)
_lib._proto("ferry_publish_ex", _I, _P, _P, ctypes.c_uint, ctypes.POINTER(_PublishInfo))
_lib._proto("ferry_publisher_version", _U64, _P)
_lib._proto("ferry_subscriber_open", _I, _P, _S, ctypes.POINTER(_SubscriberOptions), _PP)
_lib._proto("ferry_subscriber_free", None, _P)
_lib._proto("ferry_subscriber_sync", _I, _P, _I, _U64, ctypes.POINTER(_SyncInfo))
_lib._proto("ferry_subscriber_version", _U64, _P)
_lib._proto("ferry_subscriber_hash", _I, _P, ctypes.POINTER(ctypes.c_uint8))
_lib._proto("ferry_subscriber_min_head", _U64, _P, _U64)
_lib._proto("ferry_subscriber_model", _P, _P)
_lib._proto("ferry_subscriber_wait", _I, _P, _U64, _U64, ctypes.POINTER(_U64))
_lib._proto("ferry_subscriber_wake", None, _P)
_lib._proto("ferry_subscriber_get_stats", None, _P, ctypes.POINTER(_SubscriberStats))
_lib._proto("ferry_subscriber_add_store", _I, _P, _P)
_lib._proto("ferry_subscriber_store_used", ctypes.c_uint, _P)
_lib._proto("ferry_subscriber_objects_refetched", ctypes.c_uint, _P)
_lib._proto("ferry_subscriber_changes", _I, _P, ctypes.c_size_t, ctypes.POINTER(_I),
            ctypes.POINTER(ctypes.POINTER(ctypes.c_int64)), ctypes.POINTER(ctypes.c_void_p),
            ctypes.POINTER(ctypes.c_size_t))
_lib._proto("ferry_mirror_once", _I, _P, _P, _S, ctypes.POINTER(_MirrorOptions),
            ctypes.POINTER(_MirrorInfo))

SYNC_LATEST, SYNC_MIN, SYNC_EXACT = 0, 1, 2
ERR_SYNC_TIMEOUT = 88
_DEADLINE_MS = 300000   # ferry_store_options.deadline_ms 0 (include/ferry_store.h)
_STORE_FILE = 1         # FERRY_STORE_FILE


# Publisher.last_info and ferry.shard.ShardPublisher.last_info: one schema
# (README.md, "Python").  Keys a publisher does not have are None.
PUBLISH_INFO_KEYS = ("version", "kind", "id", "model_hash", "model_bytes", "delta_bytes",
                     "full_bytes", "anchor_bytes", "manifest_bytes", "seconds", "world",
                     "parts", "tiles")


def publish_info(**got: Any) -> Dict[str, Any]:
    """The last_info of both publishers: version (int), kind ("anchor" or
    "delta"), id (the version's random id, str), model_hash (16 bytes: the
    model hash; a sharded version's "shard hash", docs/FORMAT.md),
    model_bytes (tensor bytes of the published model), delta_bytes (the
    delta object(s), all ranks; 0 for version 1), full_bytes (the anchor
    object(s), all ranks; 0 for a delta; anchor_bytes: the same number,
    the name ferry_shard_publish_info gives it), manifest_bytes (sharded: the
    manifest; None unsharded), seconds (wall time of publish() in this
    process), world (trainer ranks: 1 unsharded), parts and tiles
    (sharded: tensor parts and tiles published; None unsharded)."""
    unknown = set(got) - set(PUBLISH_INFO_KEYS)
    if unknown:
        raise KeyError("publish_info: %s" % sorted(unknown))
    full = got.get("full_bytes", got.get("anchor_bytes"))
    got["full_bytes"] = got["anchor_bytes"] = full
    return {k: got.get(k) for k in PUBLISH_INFO_KEYS}


def _enc(s: Optional[PathArg], what: str = "path") -> Optional[bytes]:
    return None if s is None else cpath(s, what)


def _info_dict(st: ctypes.Structure) -> Dict[str, Any]:
    out = {}
    for name, _ in st._fields_:
        v = getattr(st, name)
        if isinstance(v, bytes):
            v = v.decode("utf-8", "replace")
        elif isinstance(v, ctypes.Array):
            v = bytes(v)
        out[name] = v
    return out


# ----------------------------------------------------------------------
# Store
# ----------------------------------------------------------------------

class Store(_lib.Handle):
    """An open object store.  url: "file:///abs/dir" or a plain path,
    "s3://BUCKET[/PREFIX]", "http[s]://HOST/PATH" (read-only).
    create: make a missing file:// root.  deadline_s: per call, retries
    included (default 300 s).  Other ferry_store_options by keyword
    (endpoint, region, max_attempts ...; see include/ferry_store.h).

    close() (or the end of a with block) frees it.  Publishers and
    Subscribers opened on it borrow it (their C handles use it and keep
    no reference): while one of them is still open, close() only refuses
    new uses, and the store is freed when it is garbage collected, which
    is after all of them.  So closing it early is safe, never a crash."""

    _FREE = "ferry_store_free"

    def __init__(self, url: Union[str, os.PathLike], create: bool = False,
                 deadline_s: Optional[float] = None, **options: Any) -> None:
        self._users: "weakref.WeakSet[Any]" = weakref.WeakSet()
        self._closed = False
        # what it was opened with: a twin with a shorter deadline
        # (Subscriber.wait(timeout_s)) is opened from it
        self._args = (str(url), dict(options))
        o = _StoreOptions(create=1 if create else 0)
        if deadline_s is not None:
            o.deadline_ms = max(1, int(deadline_s * 1000))
        self._keep = []
        for k, v in options.items():
            if k not in dict(o._fields_) or k in ("progress", "progress_user"):
                raise TypeError("ferry.Store: unknown option %r" % k)
            if isinstance(v, str):
                v = cstr(v, "store option %s" % k)
                self._keep.append(v)
            setattr(o, k, v)
        self.deadline_s = (o.deadline_ms or _DEADLINE_MS) / 1000.0
        h = ctypes.c_void_p()
        check(L.ferry_store_open(cpath(str(url), "store url"), ctypes.byref(o), ctypes.byref(h)))
        self._h = h

    def _twin(self, deadline_s: float) -> "Store":
        """The same store opened again with another per-call deadline."""
        url, options = self._args
        options = {k: v for k, v in options.items() if k != "deadline_ms"}
        return Store(url, create=False, deadline_s=deadline_s, **options)

    @property
    def url(self) -> str:
        """The store's URL as the library normalized it."""
        return L.ferry_store_url(self.handle).decode("utf-8")

    @property
    def handle(self) -> ctypes.c_void_p:
        if getattr(self, "_closed", False):
            raise ValueError("Store is closed")
        return super().handle

    def _lend(self, user: Any) -> "Store":
        """The store, borrowed by `user` (a Handle holding a reference to
        it) for as long as user's handle is open."""
        self.handle  # noqa: B018  (ValueError once closed: a closed store is not lent)
        self._users.add(user)
        return self

    def close(self) -> None:
        self._closed = True
        users = getattr(self, "_users", ())
        if not any(getattr(u, "_h", None) for u in users):
            super().close()


def _store(store: StoreArg, create: bool, user: Any = None) -> Store:
    """A Store for a URL (opened here) or a caller's Store; lent to `user`,
    which keeps it (self._store) while its own handle is open."""
    s = store if isinstance(store, Store) else Store(store, create=create)
    return s._lend(user) if user is not None else s


# ----------------------------------------------------------------------
# Publisher
# ----------------------------------------------------------------------

class Publisher(_lib.Handle):
    """Publishes successive versions of a model to RUN in a store.

    anchor_every: a full model every K versions (0 = the library's 10).
    cast_bf16 (default True): every F32 tensor is published as its BF16
    cast, computed inside the library (bit-identical to
    tensor.to(torch.bfloat16) for every non-NaN value), so a trainer
    publishes its FP32 masters directly.  Other options as
    ferry_publisher_options.  A second publisher on the same run makes
    publish() raise SyncError ERR_SYNC_CONFLICT.  keys: a
    ferry.Keys whose signing key signs every version (docs/SECURITY.md).
    quantize: "fp8-block128" or "fp8-block128-sticky" publishes each
    version as its FP8 checkpoint (NAME F8_E4M3 + NAME_scale_inv F32,
    include/ferry_quant.h; ferry.fp8.dequantize reads it back); a run
    keeps its scheme (reopening with another raises FerryError ERR_ARG).

    A Publisher opened on a run that has versions resumes after HEAD; its
    first publish is then checked against HEAD's model: a model far from
    it (more than max_resume_change of the words differ and it moved by
    more than max_resume_change of its norm: a fresh init under an old run
    name) raises SyncError ERR_SYNC_FOREIGN, HEAD unchanged, unless
    new_lineage=True (then it is published as the next version all the
    same).  Not checked for quantized runs.

    tied: {alias: name} (e.g. {"lm_head.weight":
    "model.embed_tokens.weight"}): each alias must hold the same values as
    its name (one storage, or equal copies; else FerryError ERR_ARG) and
    is published once, under the name; the version's metadata
    "ferry.tied" records the map.  Subscribers give the same map to
    Subscriber(tied=...); a file pulled from such a run lacks the alias
    names (as Hugging Face checkpoints of tied models do).
    tied="auto": the map is found at every publish: tensors that are one
    view of one memory (same data_ptr, shape, dtype, strides and device:
    model.lm_head.weight = model.embed_tokens.weight) are published once,
    under the first of them in the mapping's order (a state_dict lists
    embed_tokens first), the others as its aliases; last_info["tied"]
    gives the map found.  Subscribers pass the map (or tied="auto" on
    tensors tied the same way)."""

    _FREE = "ferry_publisher_free"

    def __init__(self, store: StoreArg, run: str, anchor_every: int = 0, cast_bf16: bool = True,
                 threads: int = 1, level: int = 0, verify: bool = False,
                 publisher_id: Optional[str] = None, cache_path: Optional[PathArg] = None,
                 tmp_dir: Optional[PathArg] = None, keys: Optional[Keys] = None,
                 quantize: Optional[str] = None, new_lineage: bool = False,
                 max_resume_change: float = 0.5,
                 tied: Union[None, str, Dict[str, str]] = None) -> None:
        q = scheme_code(quantize)
        self._tied_auto = _is_auto(tied, "Publisher")
        self._tied_map = {} if self._tied_auto else _tied_map(tied)
        self._store = _store(store, create=True, user=self)
        self._keys = keys  # the library borrows it: kept alive with the handle
        self._strs = [_enc(publisher_id, "publisher_id"), _enc(cache_path), _enc(tmp_dir)]
        o = _PublisherOptions(publisher_id=self._strs[0], anchor_every=int(anchor_every),
                              cast_bf16=1 if cast_bf16 else 0, level=int(level),
                              threads=int(threads), verify=1 if verify else 0,
                              cache_path=self._strs[1], tmp_dir=self._strs[2],
                              keys=keys.handle if keys is not None else None,
                              quantize=q)
        h = ctypes.c_void_p()
        check(L.ferry_publisher_open(self._store.handle, cstr(run, "run name"),
                                     ctypes.byref(o), ctypes.byref(h)))
        self._h = h
        self.run = run
        self.last_info: Optional[Dict[str, Any]] = None
        self._cast = bool(cast_bf16)
        # a resumed run: the first publish is checked against HEAD's model
        self._lineage = None if new_lineage or q else (self.version, float(max_resume_change))

    def _check_lineage(self, model: Model) -> None:
        """The first publish after resuming at HEAD (version v): refused
        (SyncError ERR_SYNC_FOREIGN) when more than max_resume_change of
        the published words (BF16 after the cast) differ from version v's
        AND the model moved by more than max_resume_change of its norm
        (||new - v|| > max_resume_change * ||v||, float tensors): what a
        freshly initialized model under an old run name looks like (about
        100% of the words and 1.0-1.4 of the norm), and not a trainer
        resumed from its checkpoint, which differs from HEAD by its last
        steps (a few percent of the norm, even where a large learning
        rate changes every word).  HEAD's model is read back through a
        private Subscriber: one fetch of the model and one diff, on the
        first publish after a resume only."""
        head, limit = self._lineage
        sub = Subscriber(self._store, self.run, keys=self._keys)
        try:
            sub.sync(exact_version=head)
            old = Model(L.ferry_subscriber_model(sub.handle))
            try:
                info = ferry_inspect(ferry_diff(old, model, cast_bf16=self._cast))
                n = sum(t["nelem"] for t in info["tensors"])
                changed = sum(t["changed"] for t in info["tensors"])
                moved = _relative_distance(old.tensors("np"), model) \
                    if n and changed > limit * n else 0.0
            except FerryError:
                moved = 0.0   # another layout: the publish itself decides
            finally:
                old._h = ctypes.c_void_p()   # borrowed: the subscriber owns it
        finally:
            sub.close()
        if moved > limit:
            raise FerryError(ERR_SYNC_FOREIGN, "run %s: resumed at version %d, but %.1f%% of the "
                             "model's words differ from that version's and it moved by %.2f of "
                             "its norm (both more than %.2f): a freshly initialized model under "
                             "an old run name?  Publisher(..., new_lineage=True) publishes it as "
                             "the next version all the same; another run name starts over"
                             % (self.run, head, 100.0 * changed / n, moved, limit))
        self._lineage = None

    def publish(self, named_tensors: Union[ModelArg, Iterable[Any]], anchor: bool = False) -> int:
        """Publishes a mapping name -> tensor (a state_dict; or a Model, or
        a checkpoint's path) as the next version and returns its number.  The tensors are read in place
        (CPU) or copied to the host once (GPU); the library keeps its own
        copy, so training may go on right after.  self.last_info holds
        what the publish did (ferry.sync.publish_info: the same keys as
        ShardPublisher.last_info)."""
        if not isinstance(named_tensors, (collections.abc.Mapping, Model, str, bytes,
                                          os.PathLike)):
            named_tensors = dict(named_tensors)  # named_parameters() and the like
        metadata = None
        tied = self._tied_map
        if self._tied_auto:
            tied = _find_tied(named_tensors)
        if tied:
            named_tensors, metadata = _drop_tied(named_tensors, tied)
        info = _PublishInfo()
        with _Using(named_tensors, metadata=metadata) as m:
            if self._lineage is not None and self._lineage[0] == self.version > 0:
                self._check_lineage(m)
            check(L.ferry_publish_ex(self.handle, m.handle, 1 if anchor else 0,
                                     ctypes.byref(info)))
        d = _info_dict(info)
        d["kind"] = "anchor" if info.kind == 1 else "delta"
        self.last_info = publish_info(world=1, **d)
        if self._tied_auto:
            self.last_info["tied"] = dict(tied)
        return info.version

    @property
    def version(self) -> int:
        """The last version published or resumed from (0 = none)."""
        return L.ferry_publisher_version(self.handle)


# ----------------------------------------------------------------------
# Subscriber
# ----------------------------------------------------------------------

class Subscriber(_lib.Handle):
    """Follows RUN in a store.

    Memory mode: sync_into(weights) patches the caller's own tensors (an
    inference engine's weights: a mapping name -> CPU tensor or numpy
    array) in place; the call returns with the whole new version verified,
    or with the tensors exactly as they were.
    Tensors on a GPU are followed through a host mirror: patched there,
    then copied to the device (host memory of their size; one
    host-to-device copy per new version).  So are tied names (one storage
    under several names): a mirror each, which must come out identical
    (else FerryError ERR_ARG, tensors as they were), then the storage is written
    once; the first sync from no version mirrors every tensor.  Views that
    overlap without being the same view are refused (FerryError ERR_ARG).

    For tensors on a GPU, sync_apply(tensors) instead keeps no mirror:
    the library's own copy (private mode) is the only host copy, and each
    version writes only the changed elements into the tensors
    (index_copy_ on their device); changes() says what the last sync
    changed, per tensor (ferry_subscriber_changes).

    File mode (path=...): sync() keeps a local .safetensors file at the
    version, replaced atomically; load() reads it.

    Private mode (neither): sync() keeps the model inside the library;
    tensors() copies it out.

    tied: the {alias: name} map of a run published with
    Publisher(tied=...): sync_into patches the name (the alias may share
    its storage or not) and then gives each alias its values; the alias
    is not in what the library patches, so a tied pair in one storage
    needs no host mirrors.  Memory mode only.

    keys: a ferry.Keys of trusted public keys: every version must then be
    signed by one of them (else SignatureError) and every object match
    its signed SHA-256 (docs/SECURITY.md).

    stores: further stores holding the same run (mirrors of one another:
    URLs or ferry.Store), in order of preference after `store`, at most 7
    (ferry_subscriber_add_store).  A sync falls back to the next one when
    a store is down, behind or serves what does not verify
    (docs/MIRROR.md); store_used says which one served the last sync."""

    def __init__(self, store: StoreArg, run: str, path: Optional[PathArg] = None, threads: int = 1,
                 poll_interval_s: Optional[float] = None, max_attempts: int = 0,
                 no_compactions: bool = False, tmp_dir: Optional[PathArg] = None,
                 keys: Optional[Keys] = None, stores: Iterable[StoreArg] = (),
                 create: bool = False, deadline_s: Optional[float] = None,
                 tied: Union[None, str, Dict[str, str]] = None) -> None:
        self._tied_auto = _is_auto(tied, "Subscriber")
        self._tied_map = {} if self._tied_auto else _tied_map(tied)

        def opened(x):
            if isinstance(x, Store):
                return x._lend(self)
            return Store(x, create=create, deadline_s=deadline_s)._lend(self)
        self._store = opened(store)
        if isinstance(stores, (str, bytes, os.PathLike, Store)):
            raise TypeError("ferry.Subscriber: stores is a list of further stores")
        self._stores = [opened(x) for x in stores]
        self._keys = keys  # the library borrows it: kept alive with the handle
        self.run = run
        self.path = path
        self._opts = dict(threads=int(threads), max_attempts=int(max_attempts),
                          no_compactions=1 if no_compactions else 0,
                          poll_interval_ms=0 if poll_interval_s is None
                          else max(1, int(poll_interval_s * 1000)))
        self._tmp = _enc(tmp_dir)
        self._h = ctypes.c_void_p()
        self._model = None       # memory mode: the borrowed Model
        self._sig = None         # memory mode: (names, addresses) it borrows
        self._mirror = None      # memory mode: {name: (caller tensor, host mirror)}
        self._tied = []          # memory mode: groups of names sharing a storage
        self._all_mirrored = False
        self._version = 0
        self._claimed = 0
        self._floor = 0          # the highest version any handle of this island held
        self._refused = 0        # the highest HEAD version a sync failed to reach
        self._stats_before: Dict[str, Any] = {}  # counters of handles closed since
        self._applied = 0        # sync_apply: the version its tensors hold
        self._apply_sig = None   # sync_apply: (name, address) of those tensors
        self.last_apply: Optional[Dict[str, Any]] = None   # what sync_apply wrote
        # (names; whole: tensors copied; indexed: tensors index_copy_'d;
        # elements written; bytes sent: whole tensors, positions + values)
        self._waiter = None      # wait(timeout_s): (deadline_ms, handle, stores)
        self._wait_lock = threading.Lock()
        self._wake_pending = False
        self.last_info: Optional[Dict[str, Any]] = None
        if path is not None:
            self._open(path=_enc(path))

    def _open(self, path=None, model=None, model_version=0):
        o = _SubscriberOptions(path=path, model=model.handle if model else None,
                               model_version=model_version, tmp_dir=self._tmp,
                               keys=self._keys.handle if self._keys is not None else None, **self._opts)
        self._path_b = path
        h = ctypes.c_void_p()
        check(L.ferry_subscriber_open(self._store.handle, cstr(self.run, "run name"),
                                      ctypes.byref(o), ctypes.byref(h)))
        for st in self._stores:
            rc = L.ferry_subscriber_add_store(h, st.handle)
            if rc:
                L.ferry_subscriber_free(h)
                check(rc)
        # The floor below which HEAD is refused carries over to the new
        # handle (new buffers are the same island): a store put back to an
        # older version must not take it there.
        if self._h:
            self._floor = max(self._floor, L.ferry_subscriber_min_head(self._h, 0))
        self._floor = L.ferry_subscriber_min_head(h, self._floor)
        self._close_handle()
        self._h = h
        self._version = L.ferry_subscriber_version(h)
        # A claimed version is checked (by hash) at the first sync; until
        # then the library reports 0 but the tensors are said to hold it.
        self._claimed = model_version

    def _close_handle(self):
        if self._h:
            self._stats_before = self._stats_sum(self._stats_before, self._handle_stats())
            L.ferry_subscriber_free(self._h)
            self._h = ctypes.c_void_p()

    def _handle_stats(self):
        st = _SubscriberStats()
        if self._h:
            L.ferry_subscriber_get_stats(self._h, ctypes.byref(st))
        return _info_dict(st)

    @staticmethod
    def _stats_sum(a, b):
        out = dict(b)
        for k, v in a.items():
            if isinstance(v, int):
                out[k] = out.get(k, 0) + v
            elif not out.get(k):
                out[k] = v   # last_rejection: the newest one said
        return out

    @staticmethod
    def _target(min_version, exact_version):
        if min_version is not None and exact_version is not None:
            raise ValueError("give min_version or exact_version, not both")
        if exact_version is not None:
            return SYNC_EXACT, int(exact_version)
        if min_version is not None:
            return SYNC_MIN, int(min_version)
        return SYNC_LATEST, 0

    def _sync(self, min_version, exact_version):
        mode, v = self._target(min_version, exact_version)
        info = _SyncInfo()
        rc = L.ferry_subscriber_sync(self._h, mode, v, ctypes.byref(info))
        # after an error too: the library says what the tensors hold (the
        # version before the sync: a failed sync is undone as a whole)
        self._version = L.ferry_subscriber_version(self._h)
        if rc and mode != SYNC_EXACT and not _transient(rc):
            self._refuse(info.head_version)
        check(rc)
        self.last_info = _info_dict(info)
        self.last_info["store_used"] = L.ferry_subscriber_store_used(self._h)
        self.last_info["objects_refetched"] = L.ferry_subscriber_objects_refetched(self._h)
        return self._version

    def sync(self, min_version: Optional[int] = None, exact_version: Optional[int] = None) -> int:
        """File or private mode: brings the held model to the latest version
        (or at least min_version, or exactly exact_version) and returns the
        version now held.  Raises SyncError: ERR_SYNC_NOT_YET (asked for a
        version above HEAD), ERR_SYNC_GONE (collected), ERR_SYNC_NO_PATH ..."""
        if self._model is not None:
            raise ValueError("this Subscriber follows caller tensors: use sync_into()")
        if not self._h:
            self._open()
        return self._sync(min_version, exact_version)

    def sync_into(self, named_tensors: Union[Tensors, Iterable[Any]], min_version: Optional[int] = None,
                  exact_version: Optional[int] = None, version: Optional[int] = None) -> int:
        """Memory mode: patches named_tensors (the same tensors every call,
        e.g. an engine's weights) to the target version in place and
        returns the version they hold.  On any error they are untouched and
        still hold the previous version.  version: the version the tensors
        already hold when this Subscriber first sees them (checked by hash
        at the first sync); default: what this Subscriber last synced them
        to, else none (the first sync then fetches a full anchor)."""
        if self.path is not None:
            raise ValueError("this Subscriber keeps a file (path=...): use sync()")
        if not isinstance(named_tensors, collections.abc.Mapping):
            named_tensors = dict(named_tensors)
        if self._tied_auto:
            self._tied_map = _find_tied(named_tensors)
        aliases = {}
        if self._tied_map:
            aliases = {a: c for a, c in self._tied_map.items() if a in named_tensors}
            self._caller_aliases = {a: named_tensors[a] for a in aliases}
            missing = [c for c in aliases.values() if c not in named_tensors]
            if missing:
                raise FerryError(ERR_ARG, "Subscriber(tied=...): the tensors lack %s" % missing)
            named_tensors = {n: t for n, t in named_tensors.items() if n not in aliases}
            all_tensors = dict(named_tensors)
        self._bind(named_tensors, version)
        before = self._version or self._claimed
        got = self._sync(min_version, exact_version)
        if self._mirror and self._version != before:
            host = {n: h for n, (_, h) in self._mirror.items()}
            try:
                _alias.check_groups(self._tied, host)
            except FerryError as e:
                self._refuse(got)
                raise self._undo(before, e)
            _alias.write_back({n: d for n, (d, _) in self._mirror.items()}, host, self._tied)
            if self._all_mirrored:
                self._sig = None   # verified once: from now on borrow what can be
        if aliases and self._version != before:
            _copy_aliases(aliases, all_tensors, self._caller_aliases)
        return got

    def _bind(self, tensors, version):
        """(Re)opens the C subscriber on a model borrowing these tensors,
        unless it already borrows exactly them (same names and addresses).

        Patched through host mirrors instead of in place: tensors on a
        device, and names that share one storage (tied parameters, see
        _alias): each gets its own mirror, the sync must leave a group's
        mirrors identical, then the storage is written once.  When tied
        names are followed from no version (nothing to roll back to),
        every tensor is mirrored for that first sync, so that an untied
        version is refused before any caller byte changes."""
        tied = _alias.groups(tensors)   # before anything: refuses overlaps
        sig = tuple((n, _address(t)) for n, t in tensors.items())
        if self._h and sig == self._sig:
            return
        claim = self._version if version is None else int(version)
        in_group = {n for g in tied for n in g}
        everything = bool(tied) and claim == 0
        host, mirror = {}, {}
        old = self._mirror or {}
        for name, t in tensors.items():
            if not (everything or name in in_group or _needs_mirror(t)):
                host[name] = t
                continue
            prev = old.get(name)
            host[name] = prev[1] if prev is not None and prev[0] is t else _alias.host_copy(t)
            mirror[name] = (t, host[name])
        self._mirror = mirror or None
        self._tied, self._all_mirrored = tied, everything
        model = Model.from_tensors(host, writable=True)
        self._open(model=model, model_version=claim)
        self._model, self._sig = model, sig

    def _undo(self, before, err):
        """After check_groups refused a synced version: back to `before`.
        The mirrors were not pushed; the borrowed tensors (only when
        before > 0) are synced back to it by the library.  Returns the
        error to raise."""
        if before and not self._all_mirrored:
            try:
                self._sync(None, before)
                return err
            except FerryError as again:
                err = FerryError(err.code, "%s; rolling back to version %d failed too (%s): "
                                 "tensors outside the tied groups may hold the new version"
                                 % (err.message, before, again.message))
        self._close_handle()
        self._mirror, self._sig, self._version = None, None, before
        return err

    def _refuse(self, head):
        """A sync failed for what HEAD's version is (not for the store):
        wait() waits for a version above it."""
        if head > self._version:
            self._refused = max(self._refused, int(head))

    @property
    def refused(self) -> int:
        """The highest HEAD version a sync failed to bring (refused:
        signature, shape, tied names, corrupt or missing objects; not a
        store error), 0 if none.  wait() waits for a version above it."""
        return self._refused if self._refused > self._version else 0

    def wait(self, after_version: Optional[int] = None,
             timeout_s: Optional[float] = None) -> Optional[int]:
        """Blocks until HEAD names a version above after_version (default:
        the version held, or the version last refused if higher, so that a
        loop of wait() and sync_into() does not spin on a bad version);
        returns HEAD's version, or None on timeout (timeout_s None waits up
        to a day; 0 polls once).  A run or store root that does not exist
        yet is waited for.

        timeout_s holds with the store down too: when it is shorter than
        the store's per-call deadline (deadline_s, default 300 s), HEAD of
        an s3:// or http(s):// store is read through a twin of the store
        whose deadline is timeout_s (at
        least 1 s), so an unreachable store raises its StoreError
        (ERR_STORE_TIMEOUT, naming the last error) after about timeout_s
        instead of blocking up to the store's deadline."""
        after = max(self._version, self._refused) if after_version is None else int(after_version)
        stores = [self._store] + self._stores
        # file:// reads are not bounded by the deadline (nor slowed by a
        # server): only network stores need the twin
        if timeout_s is None or timeout_s >= min(s.deadline_s for s in stores) or \
                all(L.ferry_store_kind(s.handle) == _STORE_FILE for s in stores):
            if not self._h:
                self._open()
            return wait_head(L.ferry_subscriber_wait, self._h, after, timeout_s)
        deadline_ms = max(1000, int(timeout_s * 1000))
        with self._wait_lock:
            if self._waiter is None or self._waiter[0] != deadline_ms:
                self._free_waiter()
                self._waiter = (deadline_ms,) + self._open_waiter(stores, deadline_ms / 1000.0)
            h = self._waiter[1]
            if self._wake_pending:
                self._wake_pending = False
                timeout_s = 0
        return wait_head(L.ferry_subscriber_wait, h, after, timeout_s)

    def _open_waiter(self, stores, deadline_s):
        """A private-mode handle on twins of the stores, each with that
        per-call deadline: only its HEAD polls are used."""
        twins = [s._twin(deadline_s) for s in stores]
        o = _SubscriberOptions(keys=self._keys.handle if self._keys is not None else None,
                               **self._opts)
        h = ctypes.c_void_p()
        check(L.ferry_subscriber_open(twins[0].handle, cstr(self.run, "run name"),
                                      ctypes.byref(o), ctypes.byref(h)))
        for st in twins[1:]:
            rc = L.ferry_subscriber_add_store(h, st.handle)
            if rc:
                L.ferry_subscriber_free(h)
                check(rc)
        return h, twins

    def _free_waiter(self):
        if self._waiter is not None:
            L.ferry_subscriber_free(self._waiter[1])
            for st in self._waiter[2]:
                st.close()
            self._waiter = None

    def wake(self) -> None:
        """Makes a wait() in another thread return at once (or the next
        wait(), when none is waiting)."""
        with self._wait_lock:
            if self._waiter is not None:
                L.ferry_subscriber_wake(self._waiter[1])
            else:
                self._wake_pending = True
            if self._h:
                L.ferry_subscriber_wake(self._h)

    @property
    def version(self) -> int:
        """The version held (0 = none): always complete and verified."""
        return self._version

    @property
    def store_used(self) -> int:
        """Which store served the last successful sync: 0 = `store`, 1.. =
        the entries of `stores`, in order."""
        return L.ferry_subscriber_store_used(self._h) if self._h else 0

    @property
    def objects_refetched(self) -> int:
        """How many objects the last sync took from another store than the
        one it ran on, because that store's copy was refused (the route
        itself went on: one bad object on a mirror costs only itself)."""
        return L.ferry_subscriber_objects_refetched(self._h) if self._h else 0

    @property
    def hash(self) -> Optional[bytes]:
        """Model hash of the version held (16 bytes), or None."""
        if not self._h or not self._version:
            return None
        out = (ctypes.c_uint8 * 16)()
        check(L.ferry_subscriber_hash(self._h, out))
        return bytes(out)

    @property
    def stats(self) -> Dict[str, Any]:
        """The ferry_subscriber_stats counters since this Subscriber was
        made, as a dict (syncs, steps, bytes_fetched, objects_fetched,
        manifests_fetched, rejected, last_rejection): summed over the C
        handles it opened (a new one whenever the tensors given to
        sync_into are not the same as before), so every sync counts."""
        return self._stats_sum(self._stats_before, self._handle_stats())

    def tensors(self, framework: str = "auto") -> Dict[str, Any]:
        """The version held, as name -> array: file mode maps the file
        (copy-on-write, as ferry.load); private mode copies the library's
        model out; memory mode returns the caller's own tensors' names
        mapped to the host buffers ferry patches."""
        if self.path is not None:
            from .model import load
            return load(self.path, framework)
        if self._model is not None:
            return self._model.tensors(framework)
        p = L.ferry_subscriber_model(self._h) if self._h else None
        if not p:
            raise FerryError(ERR_NOT_FOUND, "subscriber holds no version yet")
        m = Model(p)
        try:
            return {k: _copy(v) for k, v in m.tensors(framework).items()}
        finally:
            m._h = ctypes.c_void_p()   # borrowed: the subscriber owns it

    def describe(self) -> list:
        """[(name, safetensors dtype, shape, nbytes)] of the version held
        (Model.describe), without copying it; [] while none is held."""
        if self._model is not None:
            return self._model.describe()
        if self.path is not None:
            from .model import Model as _M
            with _M.open(self.path) as m:
                return m.describe()
        m = self._held()
        if m is None:
            return []
        try:
            return m.describe()
        finally:
            m._h = ctypes.c_void_p()

    def _held(self):
        """The model the library holds (borrowed), or None."""
        p = L.ferry_subscriber_model(self._h) if self._h else None
        return Model(p) if p else None

    def _changes_of(self, m, i, framework):
        """(all, positions, values) of tensor i of the held model m: views
        of the library's lists (valid until the next sync)."""
        import numpy as np
        from .model import _view_bytes, _wrap
        allflag, pos, vals, n = ctypes.c_int(), ctypes.POINTER(ctypes.c_int64)(), \
            ctypes.c_void_p(), ctypes.c_size_t()
        check(L.ferry_subscriber_changes(self._h, i, ctypes.byref(allflag), ctypes.byref(pos),
                                         ctypes.byref(vals), ctypes.byref(n)))
        if allflag.value:
            return True, None, None
        if not n.value:
            return False, np.empty(0, np.int64), None
        t = m._tensor(i)
        es = t.nbytes // max(1, t.nelem)
        p = np.ctypeslib.as_array(pos, (n.value,))
        v = _wrap(_view_bytes(vals.value, n.value * es, self), t.dtype, (n.value,), framework)
        return False, p, v

    def changes(self, values: bool = False, framework: str = "auto") -> Dict[str, Any]:
        """What the last sync changed, per tensor (ferry_subscriber_changes):
        {name: positions}, the flat element positions (numpy int64,
        ascending) whose words the sync wrote, or None where the tensor is
        to be copied whole (a first sync or an anchor, file mode, a delta
        that carries it whole, more changes than a fifth of it); tensors
        the sync did not touch are absent ({} after a sync that changed
        nothing).  values=True: {name: (positions, new values)} (values
        as ferry.load gives arrays: torch for BF16, see framework), None
        for whole.  Aliases of Subscriber(tied=...) are listed with their
        name's changes.  Copies, valid after the next sync."""
        m = self._model if self._model is not None else self._held()
        if m is None or self.path is not None:
            return {} if m is None else {n: None for n in m.names()}
        out = {}
        try:
            for i in range(len(m)):
                whole, p, v = self._changes_of(m, i, framework)
                if not whole and not len(p):
                    continue
                name = m._tensor(i).name.decode("utf-8")
                if whole:
                    out[name] = None
                else:
                    p = p.copy()
                    out[name] = (p, _copy(v)) if values else p
        finally:
            if m is not self._model:
                m._h = ctypes.c_void_p()   # borrowed: the subscriber owns it
        for alias, name in self._tied_map.items():
            if name in out:
                out[alias] = out[name]
        return out

    def sync_apply(self, params: Union[Tensors, Iterable[Any]], min_version: Optional[int] = None,
                   exact_version: Optional[int] = None) -> int:
        """Private mode, for weights the library cannot patch itself (an
        engine's tensors on a GPU): syncs the library's own host copy of
        the model (verified as by sync()), then writes into params (name ->
        torch tensor, on any device) only what changed: each changed
        tensor's listed elements by index_copy_ on a flat view, or the
        tensor whole (changes() says which).  No host mirror of params is
        kept: the library's copy is the only one on the host.  params are
        the same tensors every call; they get every tensor whole on the
        first call, after a sync that failed between the two steps, or
        when they are other tensors (names or addresses) than the last
        call's.  They must name exactly the model's tensors (aliases of
        Subscriber(tied=...) included: an alias sharing its name's memory
        is written once), each of its dtype and shape; else FerryError
        (ERR_ARG / ERR_SHAPE_MISMATCH) naming what differs, and nothing
        is written.  Returns the version params hold."""
        if self.path is not None or self._model is not None:
            raise ValueError("sync_apply follows the library's own copy: a Subscriber "
                             "without path= that sync_into() did not bind")
        torch = _torch(required=True)
        if not isinstance(params, collections.abc.Mapping):
            params = dict(params)
        sig = tuple((n, _address(t)) for n, t in params.items())
        whole = sig != self._apply_sig or self._applied != self._version or not self._applied
        self._apply_sig = sig
        got = self.sync(min_version, exact_version)   # raises: params untouched
        self._applied = 0           # until written below
        m = self._held()
        try:
            plan = self._apply_plan(m, params, whole, torch)
            for name, dst, kind, a, b in plan:
                if kind == "copy":
                    dst.copy_(a)
                else:
                    dst.view(-1).index_copy_(0, a.to(dst.device), b.to(dst.device))
        finally:
            m._h = ctypes.c_void_p()
        self._applied = got
        self.last_apply = {"names": [n for n, _, _, _, _ in plan],
                           "whole": sum(k == "copy" for _, _, k, _, _ in plan),
                           "indexed": sum(k == "index" for _, _, k, _, _ in plan),
                           "elements": sum(int(a.numel()) for _, _, k, a, _ in plan),
                           "bytes": sum(int(a.numel()) * a.element_size() if k == "copy" else
                                        int(a.numel()) * (8 + b.element_size())
                                        for _, _, k, a, b in plan)}
        return got

    def _apply_plan(self, m, params, whole, torch):
        """[(name, param, "copy", source, None) | (name, param, "index",
        positions, values)], every check made before anything is written."""
        import warnings
        from .model import _torch_tables, _view_bytes, _wrap
        _, from_code = _torch_tables(torch)
        names = m.names()
        index = {n: i for i, n in enumerate(names)}
        src = {a: n for a, n in self._tied_map.items() if n in index}
        src.update({n: n for n in names})
        missing = sorted(set(src) - set(params))
        extra = sorted(set(params) - set(src))
        if missing or extra:
            raise FerryError(ERR_ARG, "run %s: sync_apply: the tensors given lack %s and have %s "
                             "the model does not%s" % (self.run, missing or "none", extra or "none",
                                                       " (a tied alias? Subscriber(tied=...))"
                                                       if extra else ""))
        seen, plan, cache = set(), [], {}
        for name, dst in params.items():
            i = index[src[name]]
            t = m._tensor(i)
            shape = tuple(t.shape[k] for k in range(t.ndim))
            want = from_code.get(t.dtype)
            if tuple(dst.shape) != shape or dst.dtype != want:
                raise FerryError(ERR_SHAPE_MISMATCH, "run %s: %r is %s %s in the model, the tensor "
                                 "given is %s %s" % (self.run, name, want, list(shape), dst.dtype,
                                                     list(dst.shape)))
            key = (dst.data_ptr(), tuple(dst.shape), tuple(dst.stride()), str(dst.device))
            if key in seen and dst.numel():
                continue            # one memory under two names: written once
            seen.add(key)
            if i not in cache:
                cache[i] = (True, None, None) if whole else self._changes_of(m, i, "pt")
            all_, pos, vals = cache[i]
            if all_ or not dst.is_contiguous():
                if not all_ and not len(pos):
                    continue
                with warnings.catch_warnings():   # a read-only mapping, read only
                    warnings.simplefilter("ignore")
                    plan.append((name, dst, "copy",
                                 _wrap(_view_bytes(t.data, t.nbytes, m), t.dtype, shape, "pt"), None))
            elif len(pos):
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    plan.append((name, dst, "index", torch.from_numpy(pos), vals))
        return plan

    def close(self) -> None:
        if not hasattr(self, "_wait_lock"):
            return   # __init__ failed before the handles
        self._close_handle()
        with self._wait_lock:
            self._free_waiter()
        if self._model is not None:
            self._model.close()
            self._model = None


# ----------------------------------------------------------------------
# Mirror
# ----------------------------------------------------------------------

def mirror_once(src: StoreArg, dst: StoreArg, run: str, keep: int = 0, keys: Optional[Keys] = None,
                concurrency: int = 0, chunk_size: int = 0, grace_s: int = 0,
                tmp_dir: Optional[PathArg] = None, max_versions: int = 0) -> Dict[str, Any]:
    """Brings DST's copy of RUN up to SRC's HEAD, once (ferry_mirror_once,
    docs/MIRROR.md): every object verified before the manifest that names
    it, HEAD last by compare-and-swap; sharded versions and compacted
    deltas included.  src, dst: URLs or ferry.Store (a missing file:// DST
    is created).  keep: GC DST keeping that many versions (0 = no GC),
    with grace_s as ferry_gc's.  keys: a ferry.Keys whose trusted keys
    SRC's records must verify against.  concurrency, chunk_size: the
    parallel ranged GETs of large objects.  Returns the ferry_mirror_info
    as a dict (from_version, to_version, src_version, first_copied,
    versions_copied, objects_copied, objects_reused, bytes_copied,
    gc_deleted, seconds, compactions_copied, index_copied).  Raises
    SyncError ERR_SYNC_MANIFEST / _CORRUPT (SRC served what does not
    verify; DST unchanged), _CONFLICT, _BACKWARDS (DST ahead),
    SignatureError, StoreError."""
    s, d = _store(src, create=False), _store(dst, create=True)
    tmp = _enc(tmp_dir)
    o = _MirrorOptions(keep=int(keep), grace_s=int(grace_s), tmp_dir=tmp,
                       max_versions=int(max_versions), concurrency=int(concurrency),
                       chunk_size=int(chunk_size),
                       keys=keys.handle if keys is not None else None)
    info = _MirrorInfo()
    check(L.ferry_mirror_once(s.handle, d.handle, cstr(run, "run name"), ctypes.byref(o),
                              ctypes.byref(info)))
    return _info_dict(info)


def wait_head(fn: Callable[..., int], handle: ctypes.c_void_p, after: int,
              timeout_s: Optional[float]) -> Optional[int]:
    """fn (ferry_subscriber_wait, ferry_shard_wait) until HEAD passes
    `after`: HEAD's version, or None on timeout (None waits up to a day)."""
    ms = 86400000 if timeout_s is None else max(0, int(timeout_s * 1000))
    head = ctypes.c_uint64()
    rc = fn(handle, int(after), ms, ctypes.byref(head))
    if rc == ERR_SYNC_TIMEOUT:
        return None
    check(rc)
    return head.value


def _tied_map(tied):
    """{alias: name}, checked: no alias is also a name, none twice."""
    if not tied:
        return {}
    m = {str(a): str(c) for a, c in dict(tied).items()}
    bad = [a for a, c in m.items() if a == c or c in m]
    if bad:
        raise FerryError(ERR_ARG, "tied: %s map to themselves or to another alias" % bad)
    return m


def _is_auto(tied, who):
    if isinstance(tied, str):
        if tied != "auto":
            raise FerryError(ERR_ARG, "%s(tied=%r): a map {alias: name} or \"auto\"" % (who, tied))
        return True
    return False


def _find_tied(tensors):
    """{alias: name} of the tensors that are one view of one memory (same
    data_ptr, shape, dtype, strides, device), each group published under
    its first name in the mapping's order."""
    if not isinstance(tensors, collections.abc.Mapping):
        return {}
    first, out = {}, {}
    for name, t in tensors.items():
        if not (hasattr(t, "data_ptr") and hasattr(t, "stride")) or not t.numel():
            continue
        key = (t.data_ptr(), tuple(t.shape), str(t.dtype), tuple(t.stride()), str(t.device))
        if key in first:
            out[name] = first[key]
        else:
            first[key] = name
    return out


def _same_values(a, b):
    """Whether two tensors/arrays hold the same bits (one storage: at once)."""
    if hasattr(a, "data_ptr") and hasattr(b, "data_ptr") and a.data_ptr() == b.data_ptr() \
            and a.shape == b.shape and a.dtype == b.dtype and a.stride() == b.stride():
        return True
    torch = _torch()
    if torch is not None and isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.shape == b.shape and a.dtype == b.dtype and bool(torch.equal(a, b))
    import numpy as np
    a = a.data if isinstance(a, Raw) else a
    b = b.data if isinstance(b, Raw) else b
    return np.shape(a) == np.shape(b) and np.array_equal(np.asarray(a), np.asarray(b))


def _drop_tied(tensors, tied):
    """The mapping without its aliases, and the "ferry.tied" metadata."""
    import json
    if not isinstance(tensors, collections.abc.Mapping):
        raise TypeError("Publisher(tied=...): publish a mapping name -> tensor")
    out = dict(tensors)
    for alias, name in tied.items():
        if alias not in out or name not in out:
            raise FerryError(ERR_ARG, "Publisher(tied=...): %r is tied to %r, but the model "
                             "lacks %r" % (alias, name, alias if alias not in out else name))
        if not _same_values(out[alias], out[name]):
            raise FerryError(ERR_ARG, "Publisher(tied=...): %r and %r differ: not tied"
                             % (alias, name))
        del out[alias]
    return out, {"ferry.tied": json.dumps(tied, sort_keys=True)}


def _copy_aliases(aliases, tensors, caller):
    """After a sync: each alias that does not share its name's storage gets
    its values."""
    for alias, name in aliases.items():
        dst, src = caller[alias], tensors[name]
        if not _same_values(dst, src):
            if hasattr(dst, "copy_"):
                dst.copy_(src)
            else:
                import numpy as np
                d = dst.data if isinstance(dst, Raw) else dst
                np.copyto(d, src.data if isinstance(src, Raw) else np.asarray(src))


def _as_f32(x):
    """A float array's values as float32 numpy (BF16 words widened), or
    None for other dtypes."""
    import numpy as np
    if isinstance(x, Raw):
        if x.dtype != "BF16":
            return None
        return (x.data.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    if isinstance(x, np.ndarray) and x.dtype.kind == "f":
        return x.astype(np.float32)
    return None


def _relative_distance(head, model):
    """||new - head|| / ||head|| over the float tensors both hold by name
    (new: a Model), NaNs ignored; 0 when nothing compares."""
    import numpy as np
    new = model.tensors("np")
    num = den = 0.0
    for name, h in head.items():
        a, b = _as_f32(h), _as_f32(new.get(name)) if name in new else None
        if a is None or b is None or a.shape != b.shape:
            continue
        d = np.nan_to_num(b.astype(np.float64) - a, nan=0.0, posinf=0.0, neginf=0.0)
        num += float(np.dot(d.ravel(), d.ravel()))
        a64 = np.nan_to_num(a.astype(np.float64), nan=0.0, posinf=0.0, neginf=0.0)
        den += float(np.dot(a64.ravel(), a64.ravel()))
    if den == 0.0:
        return float("inf") if num else 0.0
    return (num / den) ** 0.5


def _transient(rc):
    """Errors of the store (60..79: down, slow, refusing), not of the
    version HEAD names."""
    return 60 <= rc < 80


def _needs_mirror(t):
    """Whether the library cannot write t's memory itself (a tensor on a
    GPU or another device): it is then patched through a host mirror."""
    torch = _torch()
    return torch is not None and isinstance(t, torch.Tensor) and t.device.type != "cpu"


def _copy(v):
    if isinstance(v, Raw):
        return Raw(v.dtype, v.shape, v.data.copy())
    return v.clone() if hasattr(v, "clone") else v.copy()


def _address(t):
    if hasattr(t, "data_ptr"):
        return (t.data_ptr(), tuple(t.shape), str(t.dtype), str(t.device))
    if hasattr(t, "__array_interface__"):
        return (t.__array_interface__["data"][0], t.shape, str(t.dtype))
    if hasattr(t, "data") and hasattr(t.data, "__array_interface__"):  # Raw
        return (t.data.__array_interface__["data"][0], t.shape, t.dtype)
    return id(t)
