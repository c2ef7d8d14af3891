"""Publisher / Subscriber over a file:// store, against real PyTorch: FP32
masters published with the BF16 cast inside the library, subscribers in
memory mode (the caller's own tensors, patched in place), file mode and
private mode, version targets, errors, and untouched tensors on failure."""
import os
import shutil
import tempfile

from _harness import bits, run
from _helpers import SmallTrainer as Trainer, bf16_zeros, need_sync
from _helpers import raises as _raises, same_bits as equal

import numpy as np
import torch

import ferry

TMP = tempfile.mkdtemp(prefix="ferry-pysync-")
_n = [0]


def fresh_store():
    _n[0] += 1
    d = os.path.join(TMP, "store-%d" % _n[0])
    return "file://" + d


def engine_like(tr):
    """An engine's own BF16 weights: same names and shapes, other values."""
    return bf16_zeros(tr.net.state_dict())


def test_publish_sync_into_follows_bit_for_bit():
    need_sync()
    store, tr = fresh_store(), Trainer()
    pub = ferry.Publisher(store, "r/a", anchor_every=4)
    assert pub.version == 0
    sub = ferry.Subscriber(store, "r/a")
    assert sub.version == 0 and sub.hash is None
    w = engine_like(tr)
    ptrs = {k: v.data_ptr() for k, v in w.items()}
    history = {}
    for i in range(9):
        if i:
            tr.step()
        v = pub.publish(tr.net.state_dict())
        assert v == i + 1 and pub.version == v
        assert pub.last_info["kind"] == ("anchor" if i % 4 == 0 else "delta"), (i, pub.last_info)
        history[v] = tr.bf16()
        if i % 3 != 1:                 # skip some versions: the next sync chains over them
            assert sub.sync_into(w) == v and sub.version == v
            assert equal(w, history[v]), v
            assert sub.hash == ferry.model_hash(w)
    assert {k: v.data_ptr() for k, v in w.items()} == ptrs          # in place
    assert sub.last_info["to_version"] == 9 and sub.stats["syncs"] >= 6
    # Older and exact versions, through an anchor.
    assert sub.sync_into(w, exact_version=3) == 3 and equal(w, history[3])
    assert sub.sync_into(w, min_version=2) == 3                      # already there
    assert sub.sync_into(w, min_version=4) == 9 and equal(w, history[9])
    e = _raises(ferry.FerryError, sub.sync_into, w, min_version=10)
    assert e.code == 83 and sub.version == 9 and equal(w, history[9])
    _raises(ValueError, sub.sync_into, w, min_version=1, exact_version=2)
    pub.close()
    sub.close()


def test_cast_inside_library_matches_torch():
    """What subscribers receive is tensor.to(torch.bfloat16) of the FP32
    masters, for weights spread over many binades, with exact ties."""
    need_sync()
    store = fresh_store()
    g = torch.Generator().manual_seed(5)
    master = {"w": torch.randn(4096, generator=g) * torch.logspace(-6, 3, 4096),
              "ties": torch.from_numpy(np.array([0x3F808000, 0x3F818000, 0x3F808001, 0x00008000,
                                                 0x7F7FFFFF, 0x80000001], np.uint32).view(np.float32)),
              "step": torch.tensor(7, dtype=torch.int64)}
    pub = ferry.Publisher(store, "cast")
    pub.publish(master)
    sub = ferry.Subscriber(store, "cast")
    mine = {"w": torch.zeros(4096, dtype=torch.bfloat16), "ties": torch.zeros(6, dtype=torch.bfloat16),
            "step": torch.tensor(0, dtype=torch.int64)}
    sub.sync_into(mine)
    for k in ("w", "ties"):
        assert torch.equal(mine[k].view(torch.int16), master[k].to(torch.bfloat16).view(torch.int16)), k
    assert int(mine["step"]) == 7


def test_file_and_private_modes():
    need_sync()
    store, tr = fresh_store(), Trainer(1)
    pub = ferry.Publisher(store, "files")
    path = os.path.join(TMP, "local-policy.safetensors")
    fsub = ferry.Subscriber(store, "files", path=path)
    psub = ferry.Subscriber(store, "files")
    for i in range(4):
        if i:
            tr.step()
        v = pub.publish(tr.net.state_dict())
        assert fsub.sync() == v and psub.sync() == v
        want = tr.bf16()
        assert equal(ferry.load(path, framework="pt"), want)
        assert equal(fsub.tensors(framework="pt"), want)
        got = psub.tensors(framework="pt")
        assert equal(got, want)
    # A new subscriber on the same file resumes at its version.
    again = ferry.Subscriber(store, "files", path=path)
    assert again.version == 4
    _raises(ValueError, fsub.sync_into, engine_like(tr))


def test_numpy_weights_and_claimed_version():
    need_sync()
    store, tr = fresh_store(), Trainer(2)
    pub = ferry.Publisher(store, "np")
    pub.publish(tr.net.state_dict())
    tr.step()
    pub.publish(tr.net.state_dict())
    # An engine that already holds version 2 (loaded from elsewhere) says so:
    # the first sync checks it by hash and then only fetches deltas.
    held = {k: v.clone() for k, v in tr.bf16().items()}
    tr.step()
    pub.publish(tr.net.state_dict())
    sub = ferry.Subscriber(store, "np")
    assert sub.sync_into(held, version=2) == 3
    assert equal(held, tr.bf16())
    assert "anchor" not in sub.last_info["path"], sub.last_info


def test_refusals_leave_tensors_untouched():
    need_sync()
    store, tr = fresh_store(), Trainer(3)
    pub = ferry.Publisher(store, "bad")
    pub.publish(tr.net.state_dict())
    sub = ferry.Subscriber(store, "bad")
    w = engine_like(tr)
    sub.sync_into(w)
    # Wrong structure: a tensor missing / a different shape.
    small = dict(w)
    small.pop(next(iter(small)))
    sub2 = ferry.Subscriber(store, "bad")
    e = _raises(ferry.FerryError, sub2.sync_into, small)
    assert e.code == 86, e
    other = {k: torch.zeros(v.shape[::-1] if v.dim() == 2 else v.shape, dtype=v.dtype) for k, v in w.items()}
    e = _raises(ferry.FerryError, ferry.Subscriber(store, "bad").sync_into, other)
    assert e.code == 86, e
    # Damage every object of the next version: the sync is refused and the
    # tensors still hold the version before.
    before = {p: os.path.getmtime(p) for p in _files(store)}
    tr.step()
    pub.publish(tr.net.state_dict())
    new = [p for p in _files(store) if p not in before and not p.endswith((".json", "HEAD"))]
    assert new, sorted(_files(store))
    for p in new:
        with open(p, "r+b") as f:
            f.seek(os.path.getsize(p) // 2)
            b = f.read(1)
            f.seek(-1, 1)
            f.write(bytes([b[0] ^ 0x40]))
    snap = {k: bits(v) for k, v in w.items()}
    e = _raises(ferry.FerryError, sub.sync_into, w)
    assert e.code in (82, 85, 44, 46), e
    assert sub.version == 1 and all(np.array_equal(bits(w[k]), snap[k]) for k in w)
    assert e.message


def test_publisher_conflict_and_wait():
    need_sync()
    store, tr = fresh_store(), Trainer(4)
    a = ferry.Publisher(store, "c", publisher_id="trainer-a")
    a.publish(tr.net.state_dict())
    b = ferry.Publisher(store, "c", publisher_id="trainer-b")      # resumes after HEAD
    assert b.version == 1
    b.publish(tr.net.state_dict())
    e = _raises(ferry.FerryError, a.publish, tr.net.state_dict())
    assert e.code == 80 and "trainer-b" in e.message, e
    path = os.path.join(TMP, "c.safetensors")
    ferry.save(path, tr.net.state_dict())
    assert b.publish(path) == 3                                    # a checkpoint file
    sub = ferry.Subscriber(store, "c")
    assert sub.wait(after_version=0, timeout_s=5) == 3
    assert sub.wait(after_version=3, timeout_s=0.2) is None
    sub.sync()
    assert sub.version == 3 and equal(sub.tensors(framework="pt"), tr.bf16())


def test_errors_before_io():
    need_sync()
    e = _raises(ferry.FerryError, ferry.Publisher, fresh_store(), "../escape")
    assert e.code == 89, e
    e = _raises(ferry.FerryError, ferry.Subscriber, "file:///nonexistent/ferry-store", "r")
    assert e.code in (62, 3), e
    e = _raises(ferry.FerryError, ferry.Subscriber(fresh_store_made(), "empty").sync)
    assert e.code == 83, e
    _raises(TypeError, ferry.Publisher(fresh_store(), "t").publish, {"x": [1, 2]})
    _raises(ValueError, ferry.Publisher(fresh_store(), "t2").publish, {"x": torch.zeros(4, 4).t()})


def fresh_store_made():
    s = fresh_store()
    os.makedirs(s[len("file://"):], exist_ok=True)
    return s


def _files(store):
    root = store[len("file://"):]
    out = []
    for d, _, fs in os.walk(root):
        out += [os.path.join(d, f) for f in fs if not f.startswith(".ferry-")]
    return out


def test_device_tensors_through_host_mirror():
    """GPU weights are patched in a host mirror, then copied to the device.
    No GPU here: the mirror path is forced on CPU tensors, which it must
    treat exactly like device memory (never handed to the library)."""
    need_sync()
    import ferry.sync as fs
    store, tr = fresh_store(), Trainer(5)
    pub = ferry.Publisher(store, "dev")
    sub = ferry.Subscriber(store, "dev")
    w = engine_like(tr)
    ptrs = {k: v.data_ptr() for k, v in w.items()}
    saved = fs._needs_mirror
    fs._needs_mirror = lambda t: isinstance(t, torch.Tensor)
    try:
        for i in range(4):
            if i:
                tr.step()
            pub.publish(tr.net.state_dict())
            h = sub._h.value if sub._h else None
            assert sub.sync_into(w) == i + 1
            assert equal(w, tr.bf16()), i
            if i:
                assert sub._h.value == h            # same mirrors, same handle
            borrowed = sub._model._keep
            assert all(b.data_ptr() not in ptrs.values() for b in borrowed)
        assert {k: v.data_ptr() for k, v in w.items()} == ptrs
        # A refused sync leaves the device tensors as they were.
        snap = {k: bits(v) for k, v in w.items()}
        _raises(ferry.FerryError, sub.sync_into, w, min_version=99)
        assert all(np.array_equal(bits(w[k]), snap[k]) for k in w)
    finally:
        fs._needs_mirror = saved


if __name__ == "__main__":
    try:
        run("sync", [v for k, v in list(globals().items()) if k.startswith("test_")])
    finally:
        shutil.rmtree(TMP, ignore_errors=True)
