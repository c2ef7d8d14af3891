"""Signed runs from Python (ferry.Keys, ferry.keygen; docs/SECURITY.md): a
trainer publishing FP32 masters with its key, an engine following with the
trainer's public key trusted, bit for bit; a run signed by another key and
an unsigned run refused (FerryError 142, 140) with the engine's tensors
untouched; a subscriber without keys reading the signed run."""
import os
import shutil
import stat
import tempfile

from _harness import Skip, bits, run
from _helpers import raises as _raises

import numpy as np
import torch

import ferry

TMP = tempfile.mkdtemp(prefix="ferry-pysign-")


def need_keys():
    if not hasattr(ferry, "Keys") or not hasattr(ferry, "Publisher"):
        raise Skip("this libferry has no signing or sync layer")


def masters(seed):
    g = torch.Generator().manual_seed(seed)
    return {"a.w": torch.randn(256, 128, generator=g), "b.w": torch.randn(512, generator=g)}


def engine():
    return {"a.w": torch.zeros(256, 128, dtype=torch.bfloat16), "b.w": torch.zeros(512, dtype=torch.bfloat16)}


def same(w, m):
    return all(np.array_equal(bits(w[k]), bits(m[k].to(torch.bfloat16))) for k in m)


def test_keygen_and_rings():
    need_keys()
    kid = ferry.keygen(os.path.join(TMP, "trainer"))
    assert len(kid) == 16
    assert stat.S_IMODE(os.stat(os.path.join(TMP, "trainer.key")).st_mode) == 0o600
    e = _raises(ferry.FerryError, ferry.keygen, os.path.join(TMP, "trainer"))   # never overwrites
    assert e.code == 3
    k = ferry.Keys(sign=os.path.join(TMP, "trainer.key"), trust=[(os.path.join(TMP, "trainer.pub"), 2)])
    assert k.trusted == 2 and k.ids == [kid, kid]
    e = _raises(ferry.FerryError, ferry.Keys, trust=[os.path.join(TMP, "missing.pub")])
    assert e.code == 145
    k.close()


def test_signed_run_followed_and_forgeries_refused():
    need_keys()
    for name in ("t2", "mallory"):
        ferry.keygen(os.path.join(TMP, name))
    url = "file://" + os.path.join(TMP, "store")
    sign = ferry.Keys(sign=os.path.join(TMP, "t2.key"))
    trust = ferry.Keys(trust=[os.path.join(TMP, "t2.pub")])
    pub = ferry.Publisher(url, "signed", keys=sign)
    sub = ferry.Subscriber(url, "signed", keys=trust)
    w = engine()
    for i in range(3):
        m = masters(i)
        v = pub.publish(m)
        assert sub.sync_into(w) == v and same(w, m), i
    head = open(os.path.join(TMP, "store", "signed", "HEAD"), "rb").read()
    assert b"\n#ferry-sig-1 " in head
    # another key's run, and an unsigned run: refused, tensors untouched
    mal = ferry.Publisher(url, "mallory", keys=ferry.Keys(sign=os.path.join(TMP, "mallory.key")))
    mal.publish(masters(9))
    ferry.Publisher(url, "plain").publish(masters(9))
    before = {k: v.clone() for k, v in w.items()}
    for run_name, code in (("mallory", 142), ("plain", 140)):
        s = ferry.Subscriber(url, run_name, keys=trust)
        e = _raises(ferry.FerryError, s.sync_into, w)
        assert e.code == code, (run_name, e.code)
        assert all(torch.equal(w[k], before[k]) for k in w)
        s.close()
    # a reader without keys reads the signed run
    s = ferry.Subscriber(url, "signed")
    w2 = engine()
    assert s.sync_into(w2) == 3 and same(w2, masters(2))
    s.close()
    sub.close()
    pub.close()


def test_key_roles_and_empty_rings():
    """Issue 23 items 1 and 13: island 0's key, enrolled in the trainer's ring
    for island 0's batches, signs a HEAD and manifest of its own: the
    trainer's Subscriber and Publisher refuse them (SignatureError 142), the
    engine's tensors untouched; a ring with no key raises."""
    need_keys()
    for name in ("t3", "isl0"):
        ferry.keygen(os.path.join(TMP, name))
    url = "file://" + os.path.join(TMP, "roles")
    tk = ferry.Keys(sign=os.path.join(TMP, "t3.key"), trust=[(os.path.join(TMP, "isl0.pub"), 0)])
    assert tk.trusted == 2 and tk.publishers == 1
    pub = ferry.Publisher(url, "rl", keys=tk)
    pub.publish(masters(1))
    pub.close()
    forger = ferry.Keys(sign=os.path.join(TMP, "isl0.key"), trust=[os.path.join(TMP, "t3.pub")])
    fp = ferry.Publisher(url, "rl", keys=forger, new_lineage=True)   # resumes on the trainer's version 1 (another model: not the lineage check)
    fp.publish(masters(66))
    fp.close()
    w = engine()
    before = {k: v.clone() for k, v in w.items()}
    sub = ferry.Subscriber(url, "rl", keys=tk)
    e = _raises(ferry.FerryError, sub.sync_into, w)
    assert e.code == 142 and "not enrolled as a publisher" in str(e), e
    assert all(torch.equal(w[k], before[k]) for k in w)
    sub.close()
    e = _raises(ferry.FerryError, ferry.Publisher, url, "rl", keys=tk)
    assert e.code == 142
    # island 0's batch ring cannot sign a version
    ik = ferry.Keys(sign=os.path.join(TMP, "isl0.key"), island=0)
    assert ik.trusted == 1 and ik.publishers == 0
    p2 = ferry.Publisher("file://" + os.path.join(TMP, "roles2"), "rl", keys=ik)
    e = _raises(ferry.FerryError, p2.publish, masters(2))
    assert e.code == ferry.errors.ERR_ARG
    p2.close()
    # empty rings: a glob that matched nothing, nothing at all
    for kw in ({"trust": []}, {"trust": iter(())}, {}, {"sign": os.path.join(TMP, "t3.key"), "trust": []}):
        e = _raises(ferry.FerryError, ferry.Keys, **kw)
        assert e.code == ferry.errors.ERR_ARG, kw
    e = _raises(ferry.FerryError, ferry.Keys, island=0, trust=[os.path.join(TMP, "t3.pub")])
    assert e.code == ferry.errors.ERR_ARG


if __name__ == "__main__":
    try:
        run("sign", [v for k, v in list(globals().items()) if k.startswith("test_")])
    finally:
        shutil.rmtree(TMP, ignore_errors=True)
