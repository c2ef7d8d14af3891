"""Feeding a vLLM- or SGLang-style engine from a ferry run, at TP = 1.

The trainer publishes its Hugging Face-named state_dict (q_proj, k_proj,
gate_proj ...).  The engine holds fused parameters (qkv_proj,
gate_up_proj).  Two ways to feed it:

1. Through the engine's own entry point (load=): vLLM's
   `model.load_weights(iterable of (name, tensor))` or SGLang's
   `Engine.update_weights_from_tensor(list of (name, tensor))`; the
   engine's stacked_params_mapping fuses q/k/v and gate/up and skips a
   tied lm_head.  EngineFeeder keeps the version in checkpoint names on
   the host (a Subscriber in memory mode: patched in place, each version
   verified before a byte is written), reads which tensors the sync
   changed from the library's change lists (Subscriber.changes(), no pass
   over the model) and hands only those, whole, to the entry point:

       feeder = EngineFeeder(store, "run-7", vllm_loader(llm_model))
       feeder = EngineFeeder(store, "run-7", sglang_loader(engine))

2. Into the engine's parameters directly (model=): the checkpoint names
   are mapped onto views of the engine's parameters (q_proj onto its rows
   of qkv_proj ...: checkpoint_views), and each version writes only the
   elements that changed (Subscriber.sync_apply: index_copy_ of the
   listed positions on the parameter's device).  No host copy besides the
   library's own:

       feeder = EngineFeeder(store, "run-7", model=llm_model)

    while True:
        version = feeder.step(timeout_s=30)       # None: nothing new

With real vLLM, the model is the worker's model object (e.g.
llm.llm_engine.model_executor.driver_worker.model_runner.model); its
parameters must be plain (not quantized by the engine) for model=.

Memory: one host copy of the model in BF16 (load=: the checkpoint the
engine is fed from; model=: the library's copy).  Per version: the patch
applied to it in place, then (load=) a copy of each changed tensor into
the engine, or (model=) the changed elements only.
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


def checkpoint_views(model: Any, shapes: Dict[str, Tuple[int, ...]],
                     stacked: Optional[List[Tuple[str, str, Any]]] = None) -> Dict[str, Any]:
    """{checkpoint name: view of the engine parameter it loads into} at
    TP = 1: a name matching stacked (vLLM's stacked_params_mapping:
    (".qkv_proj", ".q_proj", "q") ...) is its rows of the fused
    parameter, the shards in the mapping's order along dim 0 (how
    QKVParallelLinear and MergedColumnParallelLinear hold them); any other
    name is the parameter of that name (lm_head.weight included, tied to
    embed_tokens or not).  shapes: the checkpoint's names and shapes.
    Raises KeyError for a name the engine lacks, ValueError when the
    shards do not fill their fused parameter."""
    if stacked is None:
        stacked = getattr(model, "stacked_params_mapping", None) or _vllm_stacked()
    params = dict(model.state_dict(keep_vars=True))   # tied names included
    out: Dict[str, Any] = {}
    fused: Dict[str, List[Tuple[int, str, int]]] = {}
    for name, shape in shapes.items():
        for i, (param_name, weight_name, _) in enumerate(stacked):
            if weight_name in name:
                fused.setdefault(name.replace(weight_name, param_name), []).append(
                    (i, name, int(shape[0])))
                break
        else:
            if name not in params:
                raise KeyError("the engine has no parameter %r" % name)
            out[name] = params[name].data
    for target, parts in fused.items():
        if target not in params:
            raise KeyError("the engine has no parameter %r (for %s)" % (target, [p[1] for p in parts]))
        p, off = params[target].data, 0
        for _, name, rows in sorted(parts):
            out[name] = p.narrow(0, off, rows)
            off += rows
        if off != p.shape[0]:
            raise ValueError("%s: %d rows, its shards %s %d" % (target, p.shape[0],
                                                                 [n for _, n, _ in parts], off))
    return out


def _vllm_stacked():
    return [(".qkv_proj", ".q_proj", "q"), (".qkv_proj", ".k_proj", "k"),
            (".qkv_proj", ".v_proj", "v"), (".gate_up_proj", ".gate_proj", 0),
            (".gate_up_proj", ".up_proj", 1)]


class EngineFeeder:
    """Follows RUN and brings an engine to each new version: load= (an
    entry point: vllm_loader / sglang_loader / any callable taking a list
    of (name, tensor)) gets each changed tensor whole, by checkpoint name;
    model= (the engine's model object) gets only the changed elements,
    written into its parameters (checkpoint_views; stacked= overrides the
    fused-name mapping).  Other keyword arguments go to ferry.Subscriber
    (keys=, stores=, create=, deadline_s=, tied= ...).  last_pushed: the
    checkpoint names written by the last sync that changed something."""

    def __init__(self, store: Any, run: str, load: Optional[Callable[[Named], None]] = None,
                 model: Any = None, stacked: Optional[List[Tuple[str, str, Any]]] = None,
                 **subscriber: Any):
        if (load is None) == (model is None):
            raise ValueError("EngineFeeder: give load= or model=")
        self.sub = ferry.Subscriber(store, run, **subscriber)
        self.load = load
        self.model, self.stacked = model, stacked
        self.host: Optional[Dict[str, Any]] = None     # load=: checkpoint names, BF16, host
        self.views: Optional[Dict[str, Any]] = None    # model=: checkpoint names onto the engine
        self.version = 0                                # what the engine was fed
        self.last_pushed: List[str] = []

    def sync(self, min_version: Optional[int] = None) -> int:
        """Brings the engine to the latest version (or at least
        min_version); returns it.  On a failed sync the engine keeps the
        version it has (nothing is pushed)."""
        if self.model is not None:
            return self._sync_direct(min_version)
        if self.host is None:
            # the first version: the library's own copy gives the names and
            # shapes; the host copy then claims that version (hash-checked)
            self.sub.sync(min_version=min_version)
            self.host = self.sub.tensors("pt")       # a copy, the caller's to patch
            got = self.sub.version
            self.sub.sync_into(self.host, exact_version=got, version=got)
            names = list(self.host)
        else:
            got = self.sub.sync_into(self.host, min_version=min_version)
            names = [n for n in self.sub.changes() if n in self.host] if got != self.version else []
        if got != self.version:
            self.load([(n, self.host[n]) for n in names])
            self.version, self.last_pushed = got, names
        return got

    def _sync_direct(self, min_version):
        if self.views is None:
            got = self.sub.sync(min_version=min_version)
            shapes = {n: tuple(s) for n, _, s, _ in self.sub.describe()}
            self.views = checkpoint_views(self.model, shapes, self.stacked)
            got = self.sub.sync_apply(self.views, exact_version=got)
        else:
            got = self.sub.sync_apply(self.views, min_version=min_version)
        if got != self.version or self.sub.last_apply["names"]:
            self.version, self.last_pushed = got, self.sub.last_apply["names"]
        return got

    def step(self, timeout_s: Optional[float] = None) -> Optional[int]:
        """Waits for a version above the engine's (or a refused one's),
        then syncs; None when none came within timeout_s."""
        if self.sub.wait(timeout_s=timeout_s) is None:
            return None
        return self.sync()

    def close(self) -> None:
        self.sub.close()
