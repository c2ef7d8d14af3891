"""Sharded publish and sliced pull (include/ferry_shard.h), with the
collectives of torch.distributed around the library's calls.

Trainer ranks (any process group: gloo, nccl, one started by mpirun):

    pub = ferry.shard.ShardPublisher(store, "run-7")      # rank, world: the group's
    parts = ferry.shard.dim0_parts(model.state_dict(), pub.rank, pub.world)
    version = pub.publish(parts)    # begin on rank 0 -> broadcast_object_list;
                                    # put everywhere -> gather_object to rank 0;
                                    # commit on rank 0 -> broadcast; finish

Island ranks (an engine holding the model in TP layout, ferry.layout):

    lay = ferry.layout.Layout.llama(shapes, tp_size, rank)
    sub = ferry.shard.ShardSubscriber(store, "run-7", lay)
    version = sub.apply(engine_params)      # fetched, verified, then written

The library runs no collective: publish() moves its three small texts
(token, part records, commit status) with torch.distributed's own object
collectives, and an island rank needs none at all.
"""
from __future__ import annotations

import ctypes
import time
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from . import _alias, _lib
from .errors import ERR_ARG, ERR_SHAPE_MISMATCH, FerryError, check, cstr
from .model import _torch, _torch_tables, _view_bytes, _describe
from .fp8 import scheme_code
from .sync import _info_dict, _store, publish_info, wait_head
from ._typing import StoreArg, Tensors

if TYPE_CHECKING:
    from .layout import Layout
    from .sign import Keys

# One rank's part of a tensor: (name, full shape, row_begin, row_end, rows);
# row_begin == row_end == 0: the whole tensor (see dim0_parts).
Part = Tuple[str, Tuple[int, ...], int, int, Any]

L = _lib.lib
_P, _I, _U32, _U64, _S, _SZ = (ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_uint64,
                               ctypes.c_char_p, ctypes.c_size_t)
_PP = ctypes.POINTER(ctypes.c_void_p)


class _Options(ctypes.Structure):
    _fields_ = [("rank", _U32), ("world", _U32), ("publisher_id", _S), ("anchor_every", _U32),
                ("cast_bf16", _I), ("level", _I), ("threads", _I), ("min_tile_words", _U64),
                ("keys", _P),  # const ferry_keys * (ferry.Keys, include/ferry_sign.h)
                ("new_run", _I),  # ferry_shard_options.new_run (0: a deleted HEAD is refused)
                ("quantize", _I)]  # a ferry_quant (include/ferry_quant.h)


class _Part(ctypes.Structure):
    _fields_ = [("name", _S), ("dtype", _I), ("ndim", _U32),
                ("shape", ctypes.POINTER(_U64)), ("row_begin", _U64), ("row_end", _U64),
                ("data", _P)]


class _PublishInfo(ctypes.Structure):
    _fields_ = [("version", _U64), ("kind", _I), ("world", _U32), ("parts", _U64),
                ("tiles", _U64), ("delta_bytes", _U64), ("anchor_bytes", _U64),
                ("manifest_bytes", _U64), ("model_bytes", _U64),
                ("model_hash", ctypes.c_uint8 * 16), ("id", ctypes.c_char * 17)]


class _Region(ctypes.Structure):
    _fields_ = [("name", _S), ("row_begin", _U64), ("row_end", _U64),
                ("col_begin", _U64), ("col_end", _U64)]


class _SubOptions(ctypes.Structure):
    _fields_ = [("threads", _I), ("poll_interval_ms", _U32), ("coalesce_gap", _U64),
                ("keys", _P),  # const ferry_keys * (ferry.Keys, include/ferry_sign.h)
                ("get_bytes", _U64)]


class _PullInfo(ctypes.Structure):
    _fields_ = [("from_version", _U64), ("to_version", _U64), ("head_version", _U64),
                ("bytes_fetched", _U64), ("object_bytes", _U64), ("manifest_bytes", _U64),
                ("version_bytes", _U64), ("requests", _U64), ("tiles", _U64),
                ("path", ctypes.c_char * 128)]


class _SubStats(ctypes.Structure):
    _fields_ = [("pulls", _U64), ("bytes_fetched", _U64), ("object_bytes", _U64),
                ("manifest_bytes", _U64), ("requests", _U64), ("tiles", _U64),
                ("held_bytes", _U64)]


_CP = ctypes.POINTER(ctypes.c_char_p)
_lib._proto("ferry_shard_publisher_open", _I, _P, _S, ctypes.POINTER(_Options), _PP)
_lib._proto("ferry_shard_publisher_free", None, _P)
_lib._proto("ferry_shard_begin", _I, _P, ctypes.c_uint, _PP, ctypes.POINTER(_SZ))
_lib._proto("ferry_shard_put", _I, _P, _S, _SZ, ctypes.POINTER(_Part), _SZ, _PP,
            ctypes.POINTER(_SZ))
_lib._proto("ferry_shard_commit", _I, _P, _S, _SZ, _CP, ctypes.POINTER(_SZ), _SZ,
            ctypes.POINTER(_PublishInfo))
_lib._proto("ferry_shard_finish", _I, _P, _I)
_lib._proto("ferry_shard_publisher_version", _U64, _P)
_lib._proto("ferry_shard_subscriber_open", _I, _P, _S, ctypes.POINTER(_Region), _SZ,
            ctypes.POINTER(_SubOptions), _PP)
_lib._proto("ferry_shard_subscriber_free", None, _P)
_lib._proto("ferry_shard_pull", _I, _P, _I, _U64, ctypes.POINTER(_PullInfo))
_lib._proto("ferry_shard_wait", _I, _P, _U64, _U64, ctypes.POINTER(_U64))
_lib._proto("ferry_shard_subscriber_version", _U64, _P)
_lib._proto("ferry_shard_region_shape", _I, _P, _SZ, ctypes.POINTER(_I), ctypes.POINTER(_U64),
            ctypes.POINTER(_U64), ctypes.POINTER(_U64))
_lib._proto("ferry_shard_region_copy", _I, _P, _SZ, _P, _SZ)
_lib._proto("ferry_shard_region_changes", _I, _P, _SZ, ctypes.POINTER(_I),
            ctypes.POINTER(ctypes.POINTER(ctypes.c_int64)), _PP, ctypes.POINTER(_SZ))
_lib._proto("ferry_shard_subscriber_get_stats", None, _P, ctypes.POINTER(_SubStats))

FLAG_ANCHOR = 1
_WORD = {1: np.uint8, 2: np.int16, 4: np.int32, 8: np.int64}   # same-size views


def _take_text(ptr, size):
    try:
        return ctypes.string_at(ptr, size.value).decode("utf-8")
    finally:
        L.ferry_free(ptr)


# ----------------------------------------------------------------------
# Trainer side
# ----------------------------------------------------------------------

def dim0_parts(state_dict: Tensors, rank: int, world: int) -> List[Part]:
    """The FSDP-style parts of one rank: rows [b, e) of dim 0 of every
    tensor, the rows split as evenly as they go (the first rows % world
    ranks one more); a 0-D tensor (and a tensor with fewer rows than
    ranks, on the ranks past them) goes whole to rank 0 / nowhere.
    Returns [(name, full_shape, row_begin, row_end, rows tensor)]."""
    out = []
    for name, t in state_dict.items():
        shape = tuple(t.shape)
        if not shape:
            if rank == 0:
                out.append((name, shape, 0, 0, t))     # 0, 0: the whole tensor
            continue
        n = shape[0]
        b = rank * (n // world) + min(rank, n % world)
        e = b + n // world + (1 if rank < n % world else 0)
        if e > b:
            out.append((name, shape, b, e, t[b:e]))
    return out


_LAUNCHERS = (("RANK", "WORLD_SIZE"),                              # torchrun, by hand
              ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),  # Open MPI's mpirun
              ("PMI_RANK", "PMI_SIZE"),                          # MPICH, Intel MPI
              ("SLURM_PROCID", "SLURM_NTASKS"))                  # srun


def launcher_rank() -> Optional[Tuple[int, int]]:
    """(rank, world) as the launcher of this process gave them (torchrun
    or a hand-made RANK/WORLD_SIZE, mpirun, srun), or None."""
    import os
    for r, w in _LAUNCHERS:
        if r in os.environ and w in os.environ:
            return int(os.environ[r]), int(os.environ[w])
    return None


def init_process_group(backend: str = "gloo", addr: Optional[str] = None, port: Optional[int] = None,
                       timeout_s: float = 300) -> Tuple[int, int]:
    """Joins this process to the trainer ranks' torch.distributed group
    with the rank and world its launcher gave (launcher_rank: so
    `mpirun -np R python train.py` works as torchrun does) and the
    rendezvous addr:port (default $MASTER_ADDR:$MASTER_PORT, else
    127.0.0.1:29500).  The collectives are then torch.distributed's; MPI
    only started the processes."""
    import datetime
    import os
    got = launcher_rank()
    if got is None:
        raise FerryError(ERR_ARG, "ferry.shard: no rank in the environment (RANK/WORLD_SIZE, "
                         "OMPI_COMM_WORLD_RANK/SIZE, PMI_RANK/SIZE, SLURM_PROCID/NTASKS)")
    addr = addr or os.environ.get("MASTER_ADDR", "127.0.0.1")
    port = int(port or os.environ.get("MASTER_PORT", 29500))
    torch = _torch(required=True)
    torch.distributed.init_process_group(backend, init_method="tcp://%s:%d" % (addr, port),
                                         rank=got[0], world_size=got[1],
                                         timeout=datetime.timedelta(seconds=timeout_s))
    return got


def _dist():
    torch = _torch(required=True)
    d = torch.distributed
    if not d.is_available() or not d.is_initialized():
        raise FerryError(ERR_ARG, "ferry.shard: torch.distributed is not initialized "
                         "(init_process_group first, or pass rank and world and move the "
                         "token and records yourself between begin, put, commit and finish)")
    return d


class ShardPublisher(_lib.Handle):
    """One trainer rank's publisher of RUN (ferry_shard_publisher_open).

    group: the torch.distributed group of the R trainer ranks (default the
    world); rank and world default to this process's in it.  Options as
    ferry_shard_options (anchor_every, cast_bf16: F32 parts published as
    their BF16 cast, min_tile_words ...).  keys: a ferry.Keys; with a
    signing key rank 0 signs the manifest and HEAD, with trusted keys what
    is read back must verify.  quantize="fp8-block128": the run holds the
    FP8 checkpoint (as Publisher(quantize=...)); each rank quantizes its
    own rows, which must then begin and end on multiples of 128."""

    _FREE = "ferry_shard_publisher_free"

    def __init__(self, store: StoreArg, run: str, rank: Optional[int] = None, world: Optional[int] = None,
                 group: Any = None, anchor_every: int = 0, cast_bf16: bool = True, level: int = 0,
                 threads: int = 1, min_tile_words: int = 0, publisher_id: Optional[str] = None,
                 keys: Optional[Keys] = None, quantize: Optional[str] = None) -> None:
        self.group = group
        q = scheme_code(quantize)
        self._keys = keys  # the library borrows it: kept alive with the handle
        if rank is None or world is None:
            d = _dist()
            rank = d.get_rank(group) if rank is None else rank
            world = d.get_world_size(group) if world is None else world
        self.rank, self.world, self.run = int(rank), int(world), run
        self._store = _store(store, create=True, user=self)
        self._id = None if publisher_id is None else cstr(publisher_id, "publisher_id")
        o = _Options(rank=self.rank, world=self.world, publisher_id=self._id,
                     anchor_every=int(anchor_every), cast_bf16=1 if cast_bf16 else 0,
                     level=int(level), threads=int(threads), min_tile_words=int(min_tile_words),
                     keys=keys.handle if keys is not None else None, quantize=q)
        h = ctypes.c_void_p()
        check(L.ferry_shard_publisher_open(self._store.handle, cstr(run, "run name"),
                                           ctypes.byref(o), ctypes.byref(h)))
        self._h = h
        self.last_info: Optional[Dict[str, Any]] = None

    # -- the library's four steps, for callers with their own collectives --
    def begin(self, anchor: bool = False) -> str:
        """Rank 0: the token (str) of the next version, to broadcast."""
        tok, size = ctypes.c_void_p(), ctypes.c_size_t()
        check(L.ferry_shard_begin(self.handle, FLAG_ANCHOR if anchor else 0,
                                  ctypes.byref(tok), ctypes.byref(size)))
        return _take_text(tok, size)

    def put(self, token: str, parts: Sequence[Part]) -> str:
        """Every rank: uploads its parts ([(name, full_shape, row_begin,
        row_end, rows)], see dim0_parts) and returns its part record
        (str), to gather on rank 0."""
        arr, keep = _parts(parts)
        tb = token.encode("utf-8")
        rec, size = ctypes.c_void_p(), ctypes.c_size_t()
        check(L.ferry_shard_put(self.handle, tb, len(tb), arr, len(keep), ctypes.byref(rec),
                                ctypes.byref(size)))
        return _take_text(rec, size)

    def commit(self, token: str, records: Sequence[str]) -> Dict[str, Any]:
        """Rank 0: validates the records of every rank, writes the manifest,
        moves HEAD; returns the publish info (ferry.sync.publish_info: the keys of
        Publisher.last_info; seconds: the commit's)."""
        tb = token.encode("utf-8")
        bs = [r.encode("utf-8") for r in records]
        ptrs = (ctypes.c_char_p * max(1, len(bs)))(*bs)
        sizes = (ctypes.c_size_t * max(1, len(bs)))(*[len(b) for b in bs])
        t0 = time.monotonic()
        info = _PublishInfo()
        check(L.ferry_shard_commit(self.handle, tb, len(tb), ptrs, sizes, len(bs),
                                   ctypes.byref(info)))
        d = _info_dict(info)
        d["kind"] = "anchor" if info.kind == 1 else "delta"
        d["seconds"] = time.monotonic() - t0
        return publish_info(**d)

    def finish(self, committed: bool) -> None:
        """Every rank, with rank 0's commit outcome."""
        check(L.ferry_shard_finish(self.handle, 1 if committed else 0))

    # -- all of it over torch.distributed --------------------------------
    def publish(self, parts: Sequence[Part], anchor: bool = False) -> int:
        """Publishes this rank's parts as the next version, collectively
        with the other ranks of the group (each calls publish), and returns
        the version.  Every rank raises the same FerryError when any rank
        failed (rank 0 then does not commit: HEAD stays)."""
        t0 = time.monotonic()
        d = _dist()
        src = _global_rank(d, self.group, 0)
        box = [None]
        if self.rank == 0:
            box = [_attempt(self.begin, anchor)]
        d.broadcast_object_list(box, src=src, group=self.group)
        token = _reraise(box[0])
        mine = _attempt(self.put, token, parts)
        got = [None] * self.world if self.rank == 0 else None
        d.gather_object(mine, got, dst=src, group=self.group)
        out = [None]
        if self.rank == 0:
            bad = next((r for r in got if r[0] != "ok"), None)
            out = [bad or _attempt(self.commit, token, [r[1] for r in got])]
        d.broadcast_object_list(out, src=src, group=self.group)
        committed = out[0][0] == "ok"
        self.finish(committed)
        info = dict(_reraise(out[0]))
        info["seconds"] = time.monotonic() - t0   # this rank's publish()
        self.last_info = info
        return info["version"]

    @property
    def version(self) -> int:
        """The last version published or resumed from (0 = none)."""
        return L.ferry_shard_publisher_version(self.handle)


def _attempt(f, *a):
    """("ok", result) or ("err", code, message): what crosses ranks."""
    try:
        return ("ok", f(*a))
    except FerryError as e:
        return ("err", e.code, e.message)
    except Exception as e:   # a bad part on this rank: still answer the collective
        return ("err", ERR_ARG, "%s: %s" % (type(e).__name__, e))


def _reraise(r):
    if r[0] == "ok":
        return r[1]
    raise FerryError(r[1], r[2])


def _global_rank(d, group, r):
    if group is None:
        return r
    f = getattr(d, "get_global_rank", None) or d.distributed_c10d._get_global_rank
    return f(group, r)


def _parts(parts):
    """ctypes array of ferry_shard_part over the callers' rows (CPU, as
    contiguous tensors/arrays: a GPU tensor is copied to the host)."""
    keep = []
    arr = (_Part * max(1, len(parts)))()
    for i, (name, shape, b, e, rows) in enumerate(parts):
        code, _, ptr, nbytes, obj = _describe(name, _contig(rows), False)
        nb = cstr(name, "tensor name")
        dims = (ctypes.c_uint64 * max(1, len(shape)))(*shape)
        keep.append((nb, dims, obj))
        arr[i] = _Part(name=nb, dtype=code, ndim=len(shape), shape=dims,
                       row_begin=int(b), row_end=int(e), data=ptr or None)
    return arr, keep


def _contig(t):
    return t.contiguous() if hasattr(t, "contiguous") else np.ascontiguousarray(t)


# ----------------------------------------------------------------------
# Island side
# ----------------------------------------------------------------------

class ShardSubscriber(_lib.Handle):
    """One island rank: pulls the regions of `layout` (ferry.layout.Layout)
    from RUN and applies them to the engine's parameters in place.

    apply(params) is transactional per rank: the library fetches every
    tile this rank needs, checks each against the manifest's SHA-256 and
    its target hash, before it returns; only then is any parameter
    written, on its own device (index_copy_ of the changed elements, or
    whole regions on a cold start or an anchor).  Tied parameters (one
    storage under several engine names) are written once, after their
    regions are checked identical."""

    _FREE = "ferry_shard_subscriber_free"

    def __init__(self, store: StoreArg, run: str, layout: Layout, threads: int = 1, coalesce_gap: int = 0,
                 poll_interval_s: Optional[float] = None, keys: Optional[Keys] = None,
                 get_bytes: int = 0) -> None:
        self.layout, self.run = layout, run
        self._keys = keys  # trusted keys (ferry.Keys): HEAD and manifests must verify
        self._store = _store(store, create=False, user=self)
        self._names = [cstr(r.source, "tensor name") for r in layout.regions]
        regs = (_Region * max(1, len(self._names)))()
        for i, r in enumerate(layout.regions):
            # An end at the tensor's end is given as 0 ("to the end"): the
            # region then takes the checkpoint's real size, and a checkpoint
            # larger than the layout believes shows in region_shape.
            rows, cols = layout.dims(r.source)
            regs[i] = _Region(name=self._names[i], row_begin=r.row_begin,
                              row_end=0 if r.row_end == rows else r.row_end,
                              col_begin=r.col_begin, col_end=0 if r.col_end == cols else r.col_end)
        o = _SubOptions(threads=int(threads), coalesce_gap=int(coalesce_gap),
                        poll_interval_ms=0 if poll_interval_s is None
                        else max(1, int(poll_interval_s * 1000)),
                        keys=keys.handle if keys is not None else None, get_bytes=int(get_bytes))
        h = ctypes.c_void_p()
        check(L.ferry_shard_subscriber_open(self._store.handle, cstr(run, "run name"), regs,
                                            len(self._names), ctypes.byref(o), ctypes.byref(h)))
        self._h = h
        self.version = 0          # the version the ENGINE's parameters hold
        self._whole = True        # next apply copies whole regions (cold, or after a refusal)
        self._sig: Optional[tuple] = None   # the engine tensors of the last apply
        self.last_info: Optional[Dict[str, Any]] = None
        # {"copied": regions, "indexed": regions, "elements": n}
        self.last_apply: Optional[Dict[str, int]] = None

    def pull(self, min_version: Optional[int] = None, exact_version: Optional[int] = None) -> int:
        """The library's pull alone (fetch + verify into its own cover);
        returns the version it holds.  apply() calls it."""
        from .sync import Subscriber
        mode, v = Subscriber._target(min_version, exact_version)
        info = _PullInfo()
        check(L.ferry_shard_pull(self.handle, mode, v, ctypes.byref(info)))
        self.last_info = _info_dict(info)
        return L.ferry_shard_subscriber_version(self.handle)

    def apply(self, params: Tensors, min_version: Optional[int] = None,
              exact_version: Optional[int] = None) -> int:
        """Brings the engine's parameters (mapping engine name -> tensor,
        any device; the same tensors every call, else whole regions are
        copied) to the target version and returns it.  On any error
        nothing was written and they hold self.version still."""
        self.layout.check_engine(params)
        tied = _alias.groups(params)        # refuses overlapping views too
        sig = tuple((n, t.data_ptr(), str(t.device)) for n, t in params.items())
        if sig != self._sig:
            self._whole, self._sig = True, sig    # other tensors: they hold no known version
        held = L.ferry_shard_subscriber_version(self.handle)
        got = self.pull(min_version, exact_version)
        if got == self.version and not self._whole:
            return got
        # The changes the library lists lead from `held` to `got`: they do
        # for the engine only if it holds `held`; else (a cold start, other
        # tensors, a refused or interrupted apply) whole regions are copied.
        whole = self._whole or held != self.version
        self._whole = True
        # Everything below reads the library's verified cover; nothing is
        # written until the whole plan is built and checked.
        plan = self._plan(params, whole)
        _check_tied(tied, plan)
        skip = {n for g in tied for n in g[1:]}
        for name, steps in plan.items():
            if name in skip:
                continue                      # the same storage as its group's first
            flat = params[name].view(-1)
            for kind, off, a, b in steps:
                if kind == "copy" and b is None:
                    flat[off:off + a.numel()].copy_(a.to(flat.device))
                elif kind == "copy":          # an interleaved region: b, its positions
                    flat.index_copy_(0, b.to(flat.device), a.to(flat.device))
                else:
                    flat.index_copy_(0, a.to(flat.device) + off, b.to(flat.device))
        self._whole = False
        self.version = got
        steps = [st for n, sts in plan.items() if n not in skip for st in sts]
        self.last_apply = {"copied": sum(st[0] == "copy" for st in steps),
                           "indexed": sum(st[0] == "index" for st in steps),
                           "elements": sum(st[2].numel() for st in steps)}
        return got

    def _plan(self, params, whole):
        """{engine name: [("copy", offset, values, None | positions) |
        ("index", offset, positions, values)]} from the library's cover
        (positions of a region that is not contiguous in its parameter
        are mapped through its pitch, offset included: then offset 0)."""
        torch = _torch(required=True)
        _, from_code = _torch_tables(torch)
        plan = {n: [] for n in self.layout.params}
        for i, r in enumerate(self.layout.regions):
            dt, rows, cols, nbytes = _I(), _U64(), _U64(), _U64()
            check(L.ferry_shard_region_shape(self.handle, i, ctypes.byref(dt), ctypes.byref(rows),
                                             ctypes.byref(cols), ctypes.byref(nbytes)))
            p = params[r.param]
            if (rows.value, cols.value) != (r.rows, r.cols):
                raise FerryError(ERR_SHAPE_MISMATCH, "region %d (%r rows %d..%d, cols %d..%d of parameter %r) "
                                 "is %dx%d in the checkpoint, the layout says %dx%d"
                                 % (i, r.source, r.row_begin, r.row_end, r.col_begin, r.col_end,
                                    r.param, rows.value, cols.value, r.rows, r.cols))
            if from_code.get(dt.value) != p.dtype:
                raise FerryError(ERR_SHAPE_MISMATCH, "parameter %r is %s, the checkpoint's %r is published as "
                                 "%s" % (r.param, p.dtype, r.source, from_code.get(dt.value)))
            esz = p.element_size()
            allflag, pos, vals, count = _I(), ctypes.POINTER(ctypes.c_int64)(), ctypes.c_void_p(), \
                ctypes.c_size_t()
            check(L.ferry_shard_region_changes(self.handle, i, ctypes.byref(allflag),
                                               ctypes.byref(pos), ctypes.byref(vals),
                                               ctypes.byref(count)))
            if whole or allflag.value:
                buf = torch.empty(r.nelem, dtype=p.dtype)
                check(L.ferry_shard_region_copy(self.handle, i, buf.data_ptr(), r.nelem * esz))
                if r.contiguous:
                    plan[r.param].append(("copy", r.offset, buf, None))
                else:
                    plan[r.param].append(("copy", 0, buf, r.positions(torch.arange(r.nelem))))
            elif count.value:
                n = count.value
                idx = torch.from_numpy(np.ctypeslib.as_array(pos, (n,)).copy())
                words = _view_bytes(vals.value, n * esz, self).view(_WORD[esz]).copy()
                v = torch.from_numpy(words).view(p.dtype)
                if r.contiguous:
                    plan[r.param].append(("index", r.offset, idx, v))
                else:
                    plan[r.param].append(("index", 0, r.positions(idx), v))
        return plan

    def wait(self, after_version: Optional[int] = None,
             timeout_s: Optional[float] = None) -> Optional[int]:
        """Blocks until HEAD names a version above after_version (default:
        the version the engine holds); HEAD's version, or None on timeout."""
        return wait_head(L.ferry_shard_wait, self.handle,
                         self.version if after_version is None else after_version, timeout_s)

    @property
    def stats(self) -> Dict[str, Any]:
        """The ferry_shard_sub_stats counters, as a dict."""
        st = _SubStats()
        L.ferry_shard_subscriber_get_stats(self.handle, ctypes.byref(st))
        return _info_dict(st)


def _check_tied(tied, plan):
    """Each tied group's plans must write the same bytes (else the version
    gives one storage two values: refused before anything is written)."""
    torch = _torch(required=True)
    for g in tied:
        first = plan[g[0]]
        for other in g[1:]:
            o = plan[other]
            same = len(o) == len(first) and all(
                a[0] == b[0] and a[1] == b[1] and torch.equal(_bits(a[2]), _bits(b[2])) and
                (a[3] is None or torch.equal(_bits(a[3]), _bits(b[3]))) for a, b in zip(first, o))
            if not same:
                raise FerryError(ERR_ARG, "parameters %r and %r share one storage in the engine, "
                                 "but the version gives them different values; nothing was "
                                 "written" % (g[0], other))


def _bits(t):
    torch = _torch(required=True)
    return t.view(torch.int16) if t.dtype == torch.bfloat16 else t
