"""Issue 16's Python faults, each a regression test that failed before its
fix: tied parameters (one storage under two names, as the state_dict of a
tied-embedding LLM has) followed in place by Subscriber.sync_into and
patched by apply_inplace, "untouched on error" for them; partially
overlapping views refused; NUL bytes in tensor names, metadata and other
strings refused instead of silently truncated."""
import os
import shutil
import tempfile

from _harness import bits, run
from _helpers import same_bits as equal

import numpy as np
import torch

import ferry

TMP = tempfile.mkdtemp(prefix="ferry-pytied-")
_n = [0]


def fresh_store():
    _n[0] += 1
    return "file://" + os.path.join(TMP, "store-%d" % _n[0])


class TiedLM(torch.nn.Module):
    """The tied-embedding layout: lm_head.weight IS embed.weight."""

    def __init__(self, seed):
        super().__init__()
        torch.manual_seed(seed)
        self.embed = torch.nn.Embedding(96, 32)
        self.mid = torch.nn.Linear(32, 32)
        self.lm_head = torch.nn.Linear(32, 96, bias=False)
        self.lm_head.weight = self.embed.weight
        self.opt = torch.optim.AdamW(self.parameters(), lr=1e-3)

    def step(self):
        x = torch.arange(48) % 96
        loss = self.lm_head(self.mid(self.embed(x))).pow(2).mean()
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()

    def bf16(self):
        return {k: v.to(torch.bfloat16) for k, v in self.state_dict().items()}


def tied_engine():
    """An engine's BF16 weights with the same tie (one storage, two names)."""
    w = {"embed.weight": torch.zeros(96, 32, dtype=torch.bfloat16),
         "mid.weight": torch.zeros(32, 32, dtype=torch.bfloat16),
         "mid.bias": torch.zeros(32, dtype=torch.bfloat16)}
    w["lm_head.weight"] = w["embed.weight"]
    return w


def snapshot(w):
    return {k: bits(v) for k, v in w.items()}


def same_as(w, snap):
    return all(np.array_equal(bits(w[k]), snap[k]) for k in w)


def test_tied_state_dict_follows_in_place():
    tr = TiedLM(0)
    assert tr.state_dict()["lm_head.weight"].data_ptr() == tr.state_dict()["embed.weight"].data_ptr()
    store = fresh_store()
    pub = ferry.Publisher(store, "tied", anchor_every=3)
    sub = ferry.Subscriber(store, "tied")
    w = tied_engine()
    ptr = w["embed.weight"].data_ptr()
    for i in range(6):
        if i:
            tr.step()
        v = pub.publish(tr.state_dict())
        assert sub.sync_into(w) == v, (i, sub.last_info)
        assert equal(w, tr.bf16()), i
        assert sub.stats["rejected"] == 0, sub.stats
    # Still one storage, the caller's own.
    assert w["embed.weight"].data_ptr() == w["lm_head.weight"].data_ptr() == ptr


def test_tied_untouched_on_error():
    """A version whose two names differ cannot live in one storage: the
    sync is refused with a message naming both, the storage still holds
    the version before, and the Subscriber still says that version."""
    tr = TiedLM(1)
    store = fresh_store()
    pub = ferry.Publisher(store, "untied")
    sub = ferry.Subscriber(store, "untied")
    w = tied_engine()
    v = pub.publish(tr.state_dict())
    assert sub.sync_into(w) == v == 1
    tr.step()
    untied = {k: v.clone() for k, v in tr.state_dict().items()}
    untied["lm_head.weight"] += 1.0
    pub.publish(untied)
    snap = snapshot(w)
    try:
        sub.sync_into(w)
        raise AssertionError("an untied version was written into a tied storage")
    except ferry.FerryError as e:
        assert e.code == ferry.errors.ERR_ARG and "lm_head.weight" in e.message \
            and "embed.weight" in e.message, e
    assert same_as(w, snap) and sub.version == 1
    # The run goes on tied again: the subscriber follows from version 1.
    tr.step()
    v = pub.publish(tr.state_dict())
    assert sub.sync_into(w) == v == 3
    assert equal(w, tr.bf16())


def test_tied_apply_inplace():
    tr = TiedLM(2)
    old = {k: v.clone() for k, v in tr.bf16().items()}
    tr.step()
    patch = ferry.diff(old, tr.state_dict(), cast_bf16=True)
    for verify_first in (False, True):
        w = {k: v.clone() for k, v in old.items() if k != "lm_head.weight"}
        w["lm_head.weight"] = w["embed.weight"]
        ferry.apply_inplace(w, patch, verify_first=verify_first)
        assert equal(w, tr.bf16()) and w["lm_head.weight"].data_ptr() == w["embed.weight"].data_ptr()
        # Applied again, the base is wrong: refused, untouched.
        snap = snapshot(w)
        try:
            ferry.apply_inplace(w, patch, verify_first=verify_first)
            raise AssertionError("second apply accepted")
        except ferry.FerryError as e:
            assert e.code == ferry.errors.ERR_BASE_MISMATCH, e
        assert same_as(w, snap)


def test_tied_numpy_views():
    """Two numpy arrays over one buffer are tied the same way."""
    base = {"a": np.arange(64, dtype=np.float32), "c": np.ones(8, np.float32)}
    new = {"a": base["a"].copy(), "c": base["c"]}
    new["a"][::7] += 1          # sparse: decoded against the base's bytes
    base["b"], new["b"] = base["a"], new["a"]
    patch = ferry.diff(base, new)
    buf = np.arange(64, dtype=np.float32)
    w = {"a": buf, "b": buf[:], "c": np.ones(8, np.float32)}
    ferry.apply_inplace(w, patch)
    assert np.array_equal(buf, new["a"]) and w["b"].base is buf


def test_overlapping_views_refused():
    store = fresh_store()
    tr = TiedLM(3)
    ferry.Publisher(store, "ov").publish(tr.state_dict())
    w = tied_engine()
    # A partial overlap: a second view shifted by one row.
    store2 = torch.zeros(97 * 32, dtype=torch.bfloat16)
    w["embed.weight"] = store2[:96 * 32].view(96, 32)
    w["lm_head.weight"] = store2[32:].view(96, 32)
    snap = snapshot(w)
    for f in (lambda: ferry.Subscriber(store, "ov").sync_into(w),
              lambda: ferry.apply_inplace(w, ferry.diff(tr.bf16(), tr.bf16()))):
        try:
            f()
            raise AssertionError("overlapping views accepted")
        except ferry.FerryError as e:
            assert e.code == ferry.errors.ERR_ARG and "overlap" in e.message \
                and "lm_head.weight" in e.message and "embed.weight" in e.message, e
        assert same_as(w, snap)
    # Same start, other dtype or shape: also a different view.
    buf = torch.zeros(64, dtype=torch.bfloat16)
    bad = {"x": buf, "y": buf.view(8, 8)}
    try:
        ferry.apply_inplace(bad, ferry.diff(bad, bad))
        raise AssertionError("same memory, two shapes accepted")
    except ferry.FerryError as e:
        assert e.code == ferry.errors.ERR_ARG and "overlap" in e.message, e


def _refused(f, what):
    try:
        f()
    except ferry.FerryError as e:
        assert e.code == ferry.errors.ERR_ARG and "NUL" in e.message, e
        return
    raise AssertionError("%s with a NUL byte accepted" % what)


def test_nul_in_names_and_metadata_refused():
    x = np.zeros(4, np.float32)
    # Before the fix "a\0one" and "a\0two" both became "a": one silently
    # overwrote or shadowed the other.
    _refused(lambda: ferry.model_hash({"a\0one": x, "a\0two": x + 1}), "tensor name")
    _refused(lambda: ferry.model_hash({"w": x}, metadata={"k\0a": "1", "k\0b": "2"}), "metadata key")
    _refused(lambda: ferry.model_hash({"w": x}, metadata={"k": "v\0hidden"}), "metadata value")
    path = os.path.join(TMP, "nul.safetensors")
    _refused(lambda: ferry.save(path + "\0.tmp", {"w": x}), "path")
    _refused(lambda: ferry.Publisher(fresh_store(), "run\0b"), "run name")
    _refused(lambda: ferry.sync.Store(fresh_store() + "\0x", create=True), "store url")
    ferry.save(path, {"w": x}, metadata={"k": "v"})
    with ferry.Model.open(path) as m:
        _refused(lambda: "w\0" in m, "lookup")
        assert "w" in m and m.metadata == {"k": "v"}


if __name__ == "__main__":
    try:
        run("tied", [v for k, v in list(globals().items()) if k.startswith("test_")])
    finally:
        shutil.rmtree(TMP, ignore_errors=True)
