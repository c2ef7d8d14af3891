"""Feeding a vLLM- or SGLang-style engine from a ferry run, at TP = 1.

The trainer publishes its Hugging Face-named state_dict (q_proj, k_proj,
gate_proj ...).  The engine holds fused parameters (qkv_proj,
gate_up_proj) and takes weights only through its own loader, so ferry's
in-place sync_into (exact names) does not fit.  EngineFeeder keeps the
version in checkpoint names on the host instead (a Subscriber in memory
mode: patched in place, each version verified before a byte is written),
finds the tensors whose bits changed (a 128-bit hash per tensor, compared
with the previous version's), and hands only those, checkpoint-named, to
the engine's entry point:

    feeder = EngineFeeder(store, "run-7", vllm_loader(llm_model))
    feeder = EngineFeeder(store, "run-7", sglang_loader(engine))
    while True:
        version = feeder.step(timeout_s=30)       # None: nothing new

vLLM: `model.load_weights(iterable of (name, tensor))` (the model object
of the worker, e.g. llm.llm_engine.model_executor.driver_worker.
model_runner.model); SGLang: `Engine.update_weights_from_tensor(list of
(name, tensor))`.  The engine's own stacked_params_mapping maps q/k/v and
gate/up into the fused parameters, and skips a tied lm_head.

Memory: one host copy of the model in BF16 (the checkpoint the engine is
fed from).  Per version: the patch applied to it in place, one hashing
pass over it (XXH3, C), and a copy of each changed tensor into the
engine (host-to-device for a GPU engine), not of the whole model.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple

import ferry

Named = List[Tuple[str, Any]]


def vllm_loader(model: Any) -> Callable[[Named], None]:
    """A loader calling vLLM's model.load_weights(iterable)."""
    def load(named: Named) -> None:
        model.load_weights(iter(named))
    return load


def sglang_loader(engine: Any, flush_cache: bool = True) -> Callable[[Named], None]:
    """A loader calling SGLang's engine.update_weights_from_tensor(list)."""
    def load(named: Named) -> None:
        ok, msg = engine.update_weights_from_tensor(named, flush_cache=flush_cache)
        if not ok:
            raise RuntimeError("update_weights_from_tensor: %s" % msg)
    return load


class EngineFeeder:
    """Follows RUN and pushes each new version's changed tensors, by
    checkpoint name, through `load` (vllm_loader / sglang_loader / any
    callable taking a list of (name, tensor)).  Other keyword arguments go
    to ferry.Subscriber (keys=, stores=, create=, deadline_s= ...)."""

    def __init__(self, store: Any, run: str, load: Callable[[Named], None], **subscriber: Any):
        self.sub = ferry.Subscriber(store, run, **subscriber)
        self.load = load
        self.host: Optional[Dict[str, Any]] = None     # checkpoint names, BF16, host
        self._hash: Dict[str, bytes] = {}
        self.version = 0                                # what the engine was fed
        self.last_pushed: List[str] = []

    def _changed(self) -> List[str]:
        out = []
        for name, t in self.host.items():
            h = ferry.model_hash({name: t})
            if self._hash.get(name) != h:
                self._hash[name] = h
                out.append(name)
        return out

    def sync(self, min_version: Optional[int] = None) -> int:
        """Brings the engine to the latest version (or at least
        min_version); returns it.  On a failed sync the engine keeps the
        version it has (the host copy is untouched, nothing is pushed)."""
        if self.host is None:
            # the first version: the library's own copy gives the names and
            # shapes; the host copy then claims that version (hash-checked)
            self.sub.sync(min_version=min_version)
            self.host = self.sub.tensors("pt")       # a copy, the caller's to patch
            got = self.sub.version
            self.sub.sync_into(self.host, exact_version=got, version=got)
        else:
            got = self.sub.sync_into(self.host, min_version=min_version)
        if got != self.version:
            names = self._changed()
            self.load([(n, self.host[n]) for n in names])
            self.version, self.last_pushed = got, names
        return got

    def step(self, timeout_s: Optional[float] = None) -> Optional[int]:
        """Waits for a version above the engine's (or a refused one's),
        then syncs; None when none came within timeout_s."""
        if self.sub.wait(timeout_s=timeout_s) is None:
            return None
        return self.sync()

    def close(self) -> None:
        self.sub.close()
