"""ferry.mirror_once and store lists on ferry.Subscriber (docs/MIRROR.md),
over file:// stores and a dead http:// endpoint, against real PyTorch: the
mirror's info dict, islands following the mirror bit for bit, signed runs
(keys), GC (keep), and islands falling back when the first store is down,
behind or corrupt."""
import glob
import os
import tempfile

from _harness import Skip, run
from _helpers import bf16_zeros, free_port, raises_ferry as raises, same_bits as equal

import torch

import ferry

TMP = tempfile.mkdtemp(prefix="ferry-pymirror-")
_n = [0]


def need_mirror():
    if not hasattr(ferry, "mirror_once"):
        raise Skip("this libferry has no mirror")


def fresh(tag):
    _n[0] += 1
    return os.path.join(TMP, "%s-%d" % (tag, _n[0]))


def models(n, seed=0):
    """n successive BF16 versions of a small model moved like AdamW."""
    torch.manual_seed(seed)
    net = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 32))
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    x = torch.randn(64, 64)
    out = []
    for _ in range(n):
        out.append({k: v.detach().to(torch.bfloat16).clone() for k, v in net.state_dict().items()})
        loss = net(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return out


def publish(store, run, ms, anchor_every=0, keys=None):
    pub = ferry.Publisher(store, run, anchor_every=anchor_every, keys=keys)
    for m in ms:
        pub.publish(m)
    pub.close()


engine = bf16_zeros


def dead_url():
    return "http://127.0.0.1:%d" % free_port()     # nothing listens there now


def test_mirror_once_info_and_islands():
    need_mirror()
    origin, mirror = fresh("origin"), fresh("mirror")
    ms = models(4)
    publish(origin, "r", ms[:3])
    info = ferry.mirror_once(origin, mirror, "r")
    assert info["from_version"] == 0 and info["to_version"] == 3 and info["src_version"] == 3, info
    assert info["versions_copied"] == 3 and info["first_copied"] == 1, info
    assert info["objects_copied"] == 3 and info["bytes_copied"] > 0 and info["seconds"] >= 0, info
    assert info["compactions_copied"] == 0 and info["index_copied"] == 0, info
    again = ferry.mirror_once(ferry.Store(origin), ferry.Store(mirror), "r")
    assert again["versions_copied"] == 0 and again["to_version"] == 3, again
    # the HEAD is the upstream's bytes
    with open(os.path.join(origin, "r", "HEAD"), "rb") as a, open(os.path.join(mirror, "r", "HEAD"), "rb") as b:
        assert a.read() == b.read()
    sub = ferry.Subscriber(mirror, "r")
    w = engine(ms[0])
    assert sub.sync_into(w) == 3 and equal(w, ms[2])
    publish(origin, "r", ms[3:])
    assert ferry.mirror_once(origin, mirror, "r", concurrency=2, chunk_size=1 << 16)["to_version"] == 4
    assert sub.sync_into(w) == 4 and equal(w, ms[3])
    assert sub.last_info["path"] == "chain 3..4" and sub.store_used == 0, sub.last_info
    # SRC without a version, DST ahead of SRC: refused, nothing written
    empty = fresh("empty")
    os.makedirs(empty)
    assert raises(ferry.mirror_once, empty, mirror, "r").code == 83       # NOT_YET
    behind = fresh("behind")
    publish(behind, "r", ms[:1])
    assert raises(ferry.mirror_once, behind, mirror, "r").code == 87      # BACKWARDS
    assert ferry.Subscriber(mirror, "r", path=fresh("i") + ".safetensors").sync() == 4
    assert raises(ferry.mirror_once, origin, mirror, "../run").code == 89


def test_mirror_keys_and_keep():
    need_mirror()
    ferry.keygen(fresh("trainer"))
    base = os.path.join(TMP, "trainer-%d" % _n[0])
    ferry.keygen(fresh("other"))
    other = os.path.join(TMP, "other-%d" % _n[0])
    sign = ferry.Keys(sign=base + ".key")
    trust, wrong = ferry.Keys(trust=[base + ".pub"]), ferry.Keys(trust=[other + ".pub"])
    origin, mirror = fresh("origin"), fresh("mirror")
    ms = models(6, seed=1)
    publish(origin, "s", ms, anchor_every=2, keys=sign)   # anchors 1, 3, 5
    e = raises(ferry.mirror_once, origin, fresh("m-wrong"), "s", keys=wrong)
    assert 140 <= e.code <= 144, e
    info = ferry.mirror_once(origin, mirror, "s", keys=trust, keep=1, grace_s=-1)
    assert info["to_version"] == 6 and info["first_copied"] == 5, info
    sub = ferry.Subscriber(mirror, "s", keys=trust)
    w = engine(ms[0])
    assert sub.sync_into(w) == 6 and equal(w, ms[5])
    pub = ferry.Publisher(origin, "s", keys=sign)
    more = models(8, seed=1)[6:]
    pub.publish(more[0], anchor=True)                       # 7 (anchor)
    pub.publish(more[1])                                    # 8
    pub.close()
    info = ferry.mirror_once(origin, mirror, "s", keys=trust, keep=1, grace_s=-1)
    assert info["versions_copied"] == 2 and info["gc_deleted"] > 0, info
    assert not glob.glob(os.path.join(mirror, "s", "v", "0000000000000000000[1-6]-*")), "GC kept old versions"


def test_fallback_when_down_behind_or_corrupt():
    need_mirror()
    origin, mirror = fresh("origin"), fresh("mirror")
    ms = models(4, seed=2)
    publish(origin, "r", ms[:2])
    ferry.mirror_once(origin, mirror, "r")
    publish(origin, "r", ms[2:])                       # origin at 4, mirror at 2
    # down: a dead http:// endpoint first
    down = ferry.Store(dead_url(), deadline_s=2)
    sub = ferry.Subscriber(down, "r", stores=[mirror, origin])
    w = engine(ms[0])
    assert sub.sync_into(w) == 2 and equal(w, ms[1])
    assert sub.store_used == 1 and sub.last_info["store_used"] == 1, sub.last_info
    # behind: the version asked for is above the mirror's HEAD
    assert sub.sync_into(w, min_version=4) == 4 and equal(w, ms[3])
    assert sub.store_used == 2, sub.last_info
    # corrupt: a delta in the mirror is damaged; islands take the origin's
    ferry.mirror_once(origin, mirror, "r")
    d = glob.glob(os.path.join(mirror, "r", "v", "00000000000000000004-*.patch"))[0]
    with open(d, "r+b") as f:
        f.seek(100)
        b = f.read(1)
        f.seek(100)
        f.write(bytes([b[0] ^ 0xFF]))
    alone = ferry.Subscriber(mirror, "r", path=fresh("island") + ".safetensors")
    assert alone.sync(exact_version=3) == 3
    assert raises(alone.sync).code in (82, 85)
    island = ferry.Subscriber(mirror, "r", stores=[origin], path=fresh("island") + ".safetensors")
    # the mirror serves the route; only the corrupt delta comes from the origin
    assert island.sync() == 4 and island.store_used == 0 and island.objects_refetched == 1, island.last_info
    assert island.last_info["objects_refetched"] == 1
    assert equal(island.tensors("torch"), ms[3])


def test_store_list_arguments():
    need_mirror()
    origin = fresh("origin")
    publish(origin, "r", models(1, seed=3))
    try:
        ferry.Subscriber(origin, "r", stores=origin)
        raise AssertionError("a single URL accepted as a list")
    except TypeError:
        pass
    # 9 stores in all: more than FERRY_SYNC_STORES_MAX
    e = raises(ferry.Subscriber, origin, "r", stores=[origin] * 8, path=fresh("p") + ".safetensors")
    assert e.code == 2, e
    sub = ferry.Subscriber(origin, "r", stores=[origin] * 7)
    assert sub.sync() == 1 and sub.store_used == 0


if __name__ == "__main__":
    import shutil
    try:
        run("mirror", [test_mirror_once_info_and_islands, test_mirror_keys_and_keep,
                       test_fallback_when_down_behind_or_corrupt, test_store_list_arguments])
    finally:
        shutil.rmtree(TMP, ignore_errors=True)
