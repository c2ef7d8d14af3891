"""Issue 23, items 2 and 4 through the binding (memory mode, real PyTorch
tensors): a sync whose last step fails leaves the tensors bit-identical to
what they held before it and the Subscriber's version says so (the label is
refreshed from the library after an error too); a HEAD put back to an older
version is refused by a Subscriber whose tensors are re-allocated (the
binding reopens its C handle: the floor carries over) and by one created
again with version=N."""
import glob
import os
import shutil
import tempfile

from _harness import bits, run
from _helpers import SmallTrainer as Trainer, bf16_zeros, need_sync
from _helpers import raises_ferry as raises

import numpy as np

import ferry

TMP = tempfile.mkdtemp(prefix="ferry-pyrollback-")
_n = [0]
ERR_SYNC_BACKWARDS = 87


def fresh_store():
    _n[0] += 1
    return os.path.join(TMP, "store-%d" % _n[0])


def zeros_like(tr):
    return bf16_zeros(tr.net.state_dict())


def snap(w):
    return {k: bits(v).copy() for k, v in w.items()}


def same(w, s):
    return w.keys() == s.keys() and all(np.array_equal(bits(w[k]), s[k]) for k in w)


def publish(store, run_name, tr, n, history):
    pub = ferry.Publisher("file://" + store, run_name, anchor_every=100)
    for _ in range(n):
        if pub.version:
            tr.step()
        v = pub.publish(tr.net.state_dict())
        history[v] = snap(tr.bf16())
    pub.close()


def test_failed_route_is_undone():
    """Versions 1..5; the island at 1; version 5's delta has a byte flipped.
    The chain 1..5 applies 2, 3 and 4 in place before 5 fails, then no path
    is left: the tensors must hold version 1 again and say so."""
    need_sync()
    store, tr, hist = fresh_store(), Trainer(1), {}
    publish(store, "u", tr, 5, hist)
    sub = ferry.Subscriber("file://" + store, "u", no_compactions=True)
    w = zeros_like(tr)
    assert sub.sync_into(w, exact_version=1) == 1 and same(w, hist[1])
    (delta5,) = glob.glob(os.path.join(store, "u", "v", "%020d-*.patch" % 5))
    with open(delta5, "r+b") as f:
        data = bytearray(f.read())
        data[len(data) // 2] ^= 0x40
        f.seek(0)
        f.write(data)
    e = raises(sub.sync_into, w)
    assert e.code == 85, e                       # ERR_SYNC_NO_PATH
    assert sub.stats["steps"] >= 4               # 1, then 2..4 applied before 5 failed
    assert same(w, hist[1])                      # ... and undone
    assert sub.version == 1 and sub.hash == ferry.model_hash(w)


def test_reopened_handle_keeps_floor():
    """An island at 5 whose tensors are re-allocated (the binding opens a
    new C handle on them): HEAD put back to 3 is refused, whether the new
    tensors are said to hold 5 (the default: what this Subscriber synced)
    or nothing (version=0)."""
    need_sync()
    store, tr, hist = fresh_store(), Trainer(2), {}
    publish(store, "f", tr, 3, hist)
    head = os.path.join(store, "f", "HEAD")
    with open(head, "rb") as f:
        head3 = f.read()
    publish(store, "f", tr, 2, hist)
    sub = ferry.Subscriber("file://" + store, "f")
    w = zeros_like(tr)
    assert sub.sync_into(w) == 5 and same(w, hist[5])
    with open(head, "wb") as f:
        f.write(head3)
    again = {k: v.clone() for k, v in w.items()}          # re-allocated, still 5
    e = raises(sub.sync_into, again)
    assert e.code == ERR_SYNC_BACKWARDS, e
    assert same(again, hist[5])
    fresh = zeros_like(tr)                                # re-allocated, empty
    e = raises(sub.sync_into, fresh, version=0)
    assert e.code == ERR_SYNC_BACKWARDS, e
    assert all(not bits(v).any() for v in fresh.values()) and sub.version == 0


def test_restart_with_version_refuses_older_head():
    """A restarted island that says its tensors hold 5 (version=5) is not
    taken back to 3 by a HEAD put back; a HEAD at 5 again is taken."""
    need_sync()
    store, tr, hist = fresh_store(), Trainer(3), {}
    publish(store, "r", tr, 3, hist)
    head = os.path.join(store, "r", "HEAD")
    with open(head, "rb") as f:
        head3 = f.read()
    publish(store, "r", tr, 2, hist)
    with open(head, "rb") as f:
        head5 = f.read()
    w = tr.bf16()                                        # what the island held at 5
    assert same(w, hist[5])
    with open(head, "wb") as f:
        f.write(head3)
    sub = ferry.Subscriber("file://" + store, "r")
    e = raises(sub.sync_into, w, version=5)
    assert e.code == ERR_SYNC_BACKWARDS, e
    assert same(w, hist[5])
    with open(head, "wb") as f:
        f.write(head5)
    assert sub.sync_into(w) == 5 and same(w, hist[5])
    assert sub.last_info["bytes_fetched"] < 4096         # the claim held: nothing fetched but records


if __name__ == "__main__":
    try:
        run("sync_rollback", [v for k, v in list(globals().items()) if k.startswith("test_")])
    finally:
        shutil.rmtree(TMP, ignore_errors=True)
