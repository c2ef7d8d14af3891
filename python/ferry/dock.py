"""The trajectory dock (include/ferry_dock.h, docs/DOCK.md): rollout
engines ("islands") put version-tagged batches into an object store; the
trainer takes them under a staleness policy, each at most once.

    # engine (island 3), signing with its own island key
    with ferry.Dock(url, "rl", keys=ferry.Keys(sign="island3.key", island=3)) as dock:
        seq = dock.resume_seq(3)
        dock.put(rollout_tensor, island=3, version=policy_version, seq=seq)

    # trainer: signs the cursor with its publisher key, enrolls island keys
    keys = ferry.Keys(sign="trainer.key", trust=[("island3.pub", 3)])
    with ferry.Dock(url, "rl", role="consumer", keys=keys) as dock:
        for b in dock.take(trainer_version=7, max_batches=64, timeout_s=1.0,
                           max_staleness=2):          # async, T - v <= 2
            x = b.torch(torch.float32, (-1, 128))

The dock carries bytes.  put() takes bytes-like objects, numpy arrays and
torch tensors (a GPU tensor is copied to the host); it stores their raw
bytes only, so dtype and shape are the caller's convention.  take()
returns Batch objects: the payload as bytes (a copy: the library's buffer
is freed at once) plus the header's metadata (run, version, island, seq,
staleness, put_time_ms); Batch.numpy(dtype, shape) and
Batch.torch(dtype, shape) view it as an array.

Keys: the Dock keeps the Keys object it was given alive for as long as its
C handle is open (the library borrows the ring), so a Keys going out of
scope in the caller's code is harmless.  Closing the Keys explicitly
(keys.close()) while a Dock uses it is not: don't.
"""
from __future__ import annotations

import ctypes
import sys
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple

from . import _lib
from .errors import ERR_ARG, FerryError, check, cstr
from .sync import _store
from ._typing import StoreArg

if TYPE_CHECKING:
    from .sign import Keys

L = _lib.lib
_P, _I, _U32, _U64, _S, _SZ = (ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32,
                               ctypes.c_uint64, ctypes.c_char_p, ctypes.c_size_t)

RUN_MAX = 64    # FERRY_DOCK_RUN_MAX
HIST = 32       # FERRY_DOCK_HIST
PRODUCER, CONSUMER = 0, 1       # FERRY_DOCK_PRODUCER, _CONSUMER
SEQUENTIAL, ASYNC = 1, 2        # FERRY_DOCK_SEQUENTIAL, _ASYNC
EV_DROPPED, EV_DUPLICATE, EV_REJECTED, EV_GAP = 1, 2, 3, 4
_EV_NAMES = {EV_DROPPED: "dropped", EV_DUPLICATE: "duplicate", EV_REJECTED: "rejected",
             EV_GAP: "gap"}


# ----------------------------------------------------------------------
# C structures (mirrors of include/ferry_dock.h; tests/python/test_layout.py)
# ----------------------------------------------------------------------

class _Policy(ctypes.Structure):
    _fields_ = [("mode", _I), ("max_staleness", _U64)]


class _Event(ctypes.Structure):
    _fields_ = [("kind", _I), ("code", _I), ("key", _S), ("version", _U64),
                ("island", _U32), ("seq", _U64), ("count", _U64),
                ("trainer_version", _U64), ("message", _S)]


_EventFn = ctypes.CFUNCTYPE(None, _P, ctypes.POINTER(_Event))


class _Options(ctypes.Structure):
    _fields_ = [("role", _I), ("max_payload", _U64), ("max_scan", _U32),
                ("sweep_every", _U32), ("corrupt_grace_ms", ctypes.c_int32),
                ("poll_ms", _U32), ("delete_rejected", _I),
                ("allow_version_regress", _I), ("on_event", _EventFn),
                ("event_user", _P),
                ("keys", _P),  # const ferry_keys * (ferry.Keys)
                ("resume_commits", _U64)]


class _Batch(ctypes.Structure):
    _fields_ = [("run", ctypes.c_char * (RUN_MAX + 1)), ("version", _U64),
                ("island", _U32), ("seq", _U64), ("staleness", _U64),
                ("put_time_ms", _U64), ("payload", _P), ("size", _SZ),
                ("internal_", _P)]


class _Stats(ctypes.Structure):
    _fields_ = [("admitted", _U64), ("dropped_stale", _U64), ("duplicates", _U64),
                ("rejected_corrupt", _U64), ("rejected_run", _U64),
                ("rejected_future", _U64), ("rejected_by_code", _U64 * 10),
                ("gaps", _U64), ("staleness_hist", _U64 * HIST),
                ("puts", _U64), ("put_bytes", _U64), ("takes", _U64), ("passes", _U64),
                ("lists", _U64), ("gets", _U64), ("deletes", _U64), ("quarantined", _U64),
                ("cursor_writes", _U64), ("cursor_conflicts", _U64),
                ("delete_failures", _U64), ("deferred", _U64),
                ("rejected_signature", _U64), ("rejected_replay", _U64),
                ("cursor_commits", _U64), ("listed", _U64), ("junk_skipped", _U64)]


_lib._proto("ferry_dock_open", _I, _P, _S, ctypes.POINTER(_Options), ctypes.POINTER(_P))
_lib._proto("ferry_dock_free", None, _P)
_lib._proto("ferry_dock_put", _I, _P, _U32, _U64, _U64, _P, _SZ)
_lib._proto("ferry_dock_resume_seq", _I, _P, _U32, ctypes.POINTER(_U64))
_lib._proto("ferry_dock_take", _I, _P, ctypes.POINTER(_Policy), _U64, _SZ, _U32,
            ctypes.POINTER(ctypes.POINTER(_Batch)), ctypes.POINTER(_SZ))
_lib._proto("ferry_dock_batches_free", None, ctypes.POINTER(_Batch), _SZ)
_lib._proto("ferry_dock_sweep", _I, _P, ctypes.POINTER(_Policy), _U64)
_lib._proto("ferry_dock_get_stats", None, _P, ctypes.POINTER(_Stats))


class Batch:
    """One batch take() returned: data (the payload bytes) and the header's
    run, version (the policy version that produced it), island, seq,
    staleness (trainer_version - version at admission) and put_time_ms
    (the producer's clock at put, ms since the epoch)."""

    __slots__ = ("data", "run", "version", "island", "seq", "staleness", "put_time_ms")

    def __init__(self, data: bytes, run: str, version: int, island: int, seq: int,
                 staleness: int, put_time_ms: int) -> None:
        self.data = data
        self.run = run
        self.version = version
        self.island = island
        self.seq = seq
        self.staleness = staleness
        self.put_time_ms = put_time_ms

    def numpy(self, dtype: Any = "uint8", shape: Optional[Tuple[int, ...]] = None) -> Any:
        """The payload as a read-only numpy array of dtype (reshaped to
        shape if given); no copy."""
        import numpy as np
        a = np.frombuffer(self.data, dtype=dtype)
        return a.reshape(shape) if shape is not None else a

    def torch(self, dtype: Any = None, shape: Optional[Tuple[int, ...]] = None) -> Any:
        """The payload as a CPU torch tensor of dtype (torch.uint8 if None),
        reshaped to shape if given; a copy (torch tensors are writable)."""
        import torch
        dt = torch.uint8 if dtype is None else dtype
        raw = bytearray(self.data)
        t = torch.frombuffer(raw, dtype=dt) if raw else torch.empty(0, dtype=dt)
        return t.reshape(shape) if shape is not None else t

    def __repr__(self) -> str:
        return ("Batch(run=%r, version=%d, island=%d, seq=%d, staleness=%d, %d bytes)"
                % (self.run, self.version, self.island, self.seq, self.staleness, len(self.data)))


def _payload(data: Any) -> Tuple[Any, int, Any]:
    """(pointer, length, keep-alive) of a bytes-like object, a numpy array
    or a torch tensor, read in place where it is contiguous host memory."""
    if isinstance(data, (bytes, bytearray, memoryview)):
        mv = memoryview(data).cast("B")
        if not mv.contiguous:
            mv = memoryview(mv.tobytes())
        if mv.readonly:
            buf = mv.tobytes()
            return ctypes.cast(ctypes.c_char_p(buf), _P), len(buf), buf
        arr = (ctypes.c_char * len(mv)).from_buffer(mv)
        return ctypes.cast(arr, _P), len(mv), (mv, arr)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(data, torch.Tensor):
        t = data.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        t = t.contiguous()
        return _P(t.data_ptr()), t.numel() * t.element_size(), t
    if hasattr(data, "__array_interface__"):
        import numpy as np
        a = np.ascontiguousarray(data)
        return _P(a.ctypes.data), a.nbytes, a
    raise TypeError("ferry.Dock.put: a batch is bytes, a numpy array or a torch tensor, not %s"
                    % type(data).__name__)


def _policy(max_staleness: Optional[int]) -> _Policy:
    if max_staleness is None:
        return _Policy(mode=SEQUENTIAL, max_staleness=0)
    if int(max_staleness) < 0:
        raise FerryError(ERR_ARG, "ferry.Dock: max_staleness %d is negative" % max_staleness)
    return _Policy(mode=ASYNC, max_staleness=int(max_staleness))


class Dock(_lib.Handle):
    """A dock of run `run` on a store (a URL or a ferry.Store).

    role: "producer" (an engine: put, resume_seq) or "consumer" (the
    trainer: take, sweep; a consumer may put too).  keys: a ferry.Keys
    (kept alive by this object): an island ring (Keys(sign=K, island=I))
    signs every batch put; the trainer's ring (Keys(sign=trainer.key,
    trust=[(island_I.pub, I), ...])) signs the cursor and admits only
    batches signed by the key enrolled for their island, rejecting forged
    ones (DockError ERR_DOCK_SIGNATURE) and replays of a batch already
    taken (ERR_DOCK_REPLAY), quarantined and counted in stats.
    resume_commits: the stats["cursor_commits"] saved with the trainer's
    last checkpoint (a consumer then refuses a cursor rolled back below
    it).  on_event: called as on_event(dict) for every object take did not
    return (kind "dropped", "duplicate", "rejected", "gap"; code, key,
    version, island, seq, count, trainer_version, message); it must not
    call back into this Dock.  Other options as ferry_dock_options:
    max_payload, max_scan, sweep_every, corrupt_grace_ms, poll_s,
    delete_rejected, allow_version_regress.

    Not thread-safe: one Dock per thread.  close() (or leaving a with
    block) frees it; closing again does nothing."""

    _FREE = "ferry_dock_free"

    def __init__(self, store: StoreArg, run: str, role: str = "producer",
                 keys: Optional[Keys] = None, resume_commits: int = 0,
                 on_event: Optional[Callable[[Dict[str, Any]], None]] = None,
                 max_payload: int = 0, max_scan: int = 0, sweep_every: int = 0,
                 corrupt_grace_ms: int = 0, poll_s: Optional[float] = None,
                 delete_rejected: bool = False, allow_version_regress: bool = False) -> None:
        if role not in ("producer", "consumer"):
            raise FerryError(ERR_ARG, "ferry.Dock: role %r is neither 'producer' nor 'consumer'"
                             % (role,))
        self._h = ctypes.c_void_p()
        self.run = run
        self.role = role
        # The C dock borrows both: they must outlive its handle.
        self._store = _store(store, create=True, user=self)
        self._keys = keys
        self._on_event = on_event
        self._event_fn = _EventFn(self._event) if on_event is not None else _EventFn()
        o = _Options(role=CONSUMER if role == "consumer" else PRODUCER,
                     max_payload=int(max_payload), max_scan=int(max_scan),
                     sweep_every=int(sweep_every), corrupt_grace_ms=int(corrupt_grace_ms),
                     poll_ms=0 if poll_s is None else max(1, int(poll_s * 1000)),
                     delete_rejected=1 if delete_rejected else 0,
                     allow_version_regress=1 if allow_version_regress else 0,
                     on_event=self._event_fn,
                     keys=keys.handle if keys is not None else None,
                     resume_commits=int(resume_commits))
        h = ctypes.c_void_p()
        check(L.ferry_dock_open(self._store.handle, cstr(run, "run name"), ctypes.byref(o),
                                ctypes.byref(h)))
        self._h = h

    def _event(self, _user: Any, ev: Any) -> None:
        e = ev.contents
        d = {"kind": _EV_NAMES.get(e.kind, str(e.kind)), "code": e.code,
             "key": e.key.decode("utf-8", "replace") if e.key else None,
             "version": e.version, "island": e.island, "seq": e.seq, "count": e.count,
             "trainer_version": e.trainer_version,
             "message": e.message.decode("utf-8", "replace") if e.message else ""}
        try:
            self._on_event(d)  # type: ignore[misc]
        except Exception as exc:  # an exception cannot cross the C frames
            print("ferry.Dock on_event raised %r (ignored)" % (exc,), file=sys.stderr)

    def put(self, data: Any, island: int, version: int, seq: int) -> None:
        """Puts one batch (bytes-like, numpy array or torch tensor: its raw
        bytes) as island's batch number seq, produced by policy version
        `version`; signed when this Dock's keys hold a signing key.
        seq: unique per (run, island), ideally consecutive; a re-put of
        the same (island, seq) replaces it (a retry after a crash)."""
        ptr, n, keep = _payload(data)
        check(L.ferry_dock_put(self.handle, int(island), int(version), int(seq), ptr, n))
        del keep

    def resume_seq(self, island: int) -> int:
        """The next seq for an island restarting without its own record
        (ferry_dock_resume_seq: above every seq of it in the store or the
        consumer's cursor; 0 for a new island)."""
        out = _U64()
        check(L.ferry_dock_resume_seq(self.handle, int(island), ctypes.byref(out)))
        return out.value

    def take(self, trainer_version: int, max_batches: int = 1, timeout_s: float = 0.0,
             max_staleness: Optional[int] = None) -> List[Batch]:
        """Up to max_batches batches admitted under the policy (consumer).

        max_staleness None: SEQUENTIAL, trainer_version is the version the
        trainer requests and only batches of exactly that version are
        admitted (older ones dropped as stale, newer ones left for later).
        max_staleness S: ASYNC, trainer_version is the newest version
        published and a batch of version v is admitted iff
        trainer_version - v <= S (older dropped; newer rejected as
        ERR_DOCK_FUTURE).  Waits up to timeout_s for max_batches (0: one
        pass); returns what it has then, possibly [].  Never returns the
        same (island, seq) twice over the life of the run."""
        pol = _policy(max_staleness)
        ms = max(0, min(int(timeout_s * 1000), 0xFFFFFFFF))
        out = ctypes.POINTER(_Batch)()
        n = _SZ()
        check(L.ferry_dock_take(self.handle, ctypes.byref(pol), int(trainer_version),
                                int(max_batches), ms, ctypes.byref(out), ctypes.byref(n)))
        try:
            return [Batch(ctypes.string_at(b.payload, b.size) if b.size else b"",
                          b.run.decode("utf-8", "replace"), b.version, b.island, b.seq,
                          b.staleness, b.put_time_ms)
                    for b in (out[i] for i in range(n.value))]
        finally:
            if n.value:
                L.ferry_dock_batches_free(out, n.value)

    def sweep(self, trainer_version: int, max_staleness: Optional[int] = None) -> None:
        """One housekeeping pass over the whole run (consumer): drops the
        stale, rejects the future (async), deletes duplicates; admits
        nothing.  Policy as take()."""
        pol = _policy(max_staleness)
        check(L.ferry_dock_sweep(self.handle, ctypes.byref(pol), int(trainer_version)))

    @property
    def stats(self) -> Dict[str, Any]:
        """The ferry_dock_stats counters as a dict: the run's (admitted,
        dropped_stale, duplicates, rejected_corrupt, rejected_run,
        rejected_future, rejected_signature, rejected_replay, gaps,
        cursor_commits, staleness_hist as a list) and this handle's (puts,
        put_bytes, takes, quarantined ...).  rejected_by_code maps each
        ERR_DOCK_* code 100..109 to its count; "rejected" sums every
        rejection kind."""
        st = _Stats()
        L.ferry_dock_get_stats(self.handle, ctypes.byref(st))
        out: Dict[str, Any] = {}
        for name, _ in st._fields_:
            v = getattr(st, name)
            out[name] = list(v) if isinstance(v, ctypes.Array) else int(v)
        out["rejected_by_code"] = {100 + i: c for i, c in enumerate(out["rejected_by_code"])}
        out["rejected"] = (out["rejected_corrupt"] + out["rejected_run"] + out["rejected_future"]
                           + out["rejected_signature"] + out["rejected_replay"])
        return out

    def close(self) -> None:
        """Frees the C dock (again: nothing); the Keys and Store it
        borrowed are released with it."""
        super().close()
        self._keys = None

    def __repr__(self) -> str:
        state = "closed" if not self._h else self.role
        return "ferry.Dock(%r, %s)" % (self.run, state)


__all__ = ["Dock", "Batch"]
