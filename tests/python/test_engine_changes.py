"""Change lists on the unsharded path (issue 27 item 2): Subscriber.changes()
lists, per tensor, exactly the elements whose bits the sync changed (the
differences are computed here from the published tensors, independently of
the library), None for a tensor to copy whole; Subscriber.sync_apply writes
only those elements into tensors the library cannot patch (an engine's,
on any device) with no host mirror; EngineFeeder(model=) feeds a
vLLM-style engine's fused parameters element by element and
EngineFeeder(load=) pushes exactly the changed tensors.  Publisher(tied=
"auto") publishes tensors sharing one storage once."""
import os
import tempfile

from _harness import bits, run
from _helpers import TIED, bf16_of, engine_examples, train_step
from _helpers import need_sync_torch as _need

import ferry

TMP = tempfile.mkdtemp(prefix="ferry-pychanges-")
engine_examples()


def _diff(a, b):
    """Flat positions where two BF16 tensors' bits differ (numpy int64)."""
    import numpy as np
    return np.flatnonzero(bits(a).view(np.int16) != bits(b).view(np.int16)).astype(np.int64)


def _model(seed):
    import torch
    g = torch.Generator().manual_seed(seed)
    return {"a.w": (torch.randn(256, 96, generator=g) * 0.02).to(torch.bfloat16),
            "b.frozen": (torch.randn(64, 32, generator=g) * 0.02).to(torch.bfloat16),
            "c.norm": torch.ones(96, dtype=torch.bfloat16)}


def _step(sd, g, dense=False):
    """A few % of a.w's words move; c.norm every word when dense."""
    import torch
    x = sd["a.w"].view(-1)
    idx = torch.randint(0, x.numel(), (x.numel() // 40,), generator=g)
    x[idx] = (x[idx].float() * 1.01 + 1e-4).to(torch.bfloat16)
    if dense:
        sd["c.norm"] += 0.125


def test_changes_are_the_words_that_differ():
    _need()
    import numpy as np
    import torch
    store = os.path.join(TMP, "lists")
    pub = ferry.Publisher(store, "run", anchor_every=100)
    g = torch.Generator().manual_seed(3)
    sd = _model(1)
    pub.publish(sd)
    mine = {k: torch.zeros_like(v) for k, v in sd.items()}
    sub = ferry.Subscriber(store, "run")
    priv = ferry.Subscriber(store, "run")
    assert sub.changes() == {}                     # nothing held yet
    sub.sync_into(mine)
    assert sub.changes() == {n: None for n in sd}  # the first sync: whole
    prev = {k: v.clone() for k, v in sd.items()}
    for v in range(2, 6):
        _step(sd, g, dense=(v == 3))
        pub.publish(sd)
        assert sub.sync_into(mine) == v
        ch = sub.changes(values=True)
        assert set(ch) == {"a.w"} | ({"c.norm"} if v == 3 else set()), (v, set(ch))
        pos, vals = ch["a.w"]
        want = _diff(prev["a.w"], sd["a.w"])
        assert len(want) and pos.dtype == np.int64 and np.array_equal(pos, want), v
        assert np.array_equal(bits(vals), bits(sd["a.w"].view(-1)[torch.from_numpy(want)])), v
        if v == 3:
            assert ch["c.norm"] is None            # every word: copied whole
        prev = {k: t.clone() for k, t in sd.items()}
        assert sub.sync_into(mine) == v and sub.changes() == {}   # nothing new: nothing listed
    # a route of several versions: the union of the words the steps wrote
    base = {k: t.clone() for k, t in sd.items()}
    union, hist = set(), {}
    for v in range(6, 9):
        before = sd["a.w"].clone()
        _step(sd, g)
        union |= set(_diff(before, sd["a.w"]).tolist())
        pub.publish(sd)
        hist[v] = sd["a.w"].clone()
    assert sub.sync_into(mine) == 8
    pos = sub.changes()["a.w"]
    assert set(pos.tolist()) == union and set(_diff(base["a.w"], sd["a.w"]).tolist()) <= union
    assert list(pos) == sorted(pos)
    # private mode: lists once the library's copy is its own (after the anchor's version)
    assert priv.sync(exact_version=6) == 6 and priv.sync(exact_version=7) == 7
    assert priv.sync() == 8
    assert np.array_equal(priv.changes()["a.w"], _diff(hist[7], hist[8]))
    for s in (sub, priv):
        s.close()
    pub.close()


def _fused_expect(hf, cfg):
    from models import fused_reference
    return fused_reference(hf, cfg)


def test_sync_apply_writes_only_what_changed():
    _need()
    import numpy as np
    import torch
    store = os.path.join(TMP, "apply")
    pub = ferry.Publisher(store, "run", anchor_every=100)
    g = torch.Generator().manual_seed(4)
    sd = _model(2)
    sd["tie"] = sd["a.w"]                          # one storage, two names
    pub_sd = dict(sd)
    pub.close()
    pub = ferry.Publisher(store, "run", anchor_every=100, tied="auto")
    pub.publish(pub_sd)
    assert pub.last_info["tied"] == {"tie": "a.w"}
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    eng = {k: torch.zeros(v.shape, dtype=torch.bfloat16, device=dev) for k, v in sd.items()
           if k != "tie"}
    eng["tie"] = eng["a.w"]                        # the engine ties them too
    sub = ferry.Subscriber(store, "run", tied={"tie": "a.w"})
    assert sub.sync_apply(eng) == 1 and sub.last_apply["indexed"] == 0
    total = sum(t.numel() for k, t in sd.items() if k != "tie")
    for v in range(2, 6):
        prev = sd["a.w"].clone()
        _step(sd, g)
        pub.publish(dict(sd))
        assert sub.sync_apply(eng) == v
        for k in ("a.w", "b.frozen", "c.norm"):
            assert np.array_equal(bits(eng[k].cpu()), bits(sd[k])), (v, k)
        assert eng["tie"].data_ptr() == eng["a.w"].data_ptr()
        la = sub.last_apply
        if v >= 3:   # private mode: the version after the anchor comes whole
            n = len(_diff(prev, sd["a.w"]))
            assert la["indexed"] == 1 and la["whole"] == 0 and la["elements"] == n < total, (v, la)
            assert la["names"] in (["a.w"], ["tie"]), la
    # tensors the model lacks, or that it has and they lack: refused, nothing written
    before = eng["b.frozen"].clone()
    _step(sd, g)
    pub.publish(dict(sd))
    bad = dict(eng)
    bad["extra"] = torch.zeros(3, dtype=torch.bfloat16)
    try:
        sub.sync_apply(bad)
    except ferry.FerryError as e:
        assert e.code == ferry.errors.ERR_ARG and "extra" in e.message, e
    else:
        raise AssertionError("an unknown tensor accepted")
    wrong = dict(eng)
    wrong["c.norm"] = torch.zeros(95, dtype=torch.bfloat16)
    try:
        sub.sync_apply(wrong)
    except ferry.FerryError as e:
        assert e.code == ferry.errors.ERR_SHAPE_MISMATCH and "c.norm" in e.message \
            and "[96]" in e.message and "[95]" in e.message, e
    else:
        raise AssertionError("a tensor of another shape accepted")
    assert torch.equal(eng["b.frozen"], before)
    # the tensors missed a version: the next apply copies everything
    assert sub.sync_apply(eng) == 6 and sub.last_apply["whole"] == 3
    assert np.array_equal(bits(eng["a.w"].cpu()), bits(sd["a.w"]))
    sub.close()
    pub.close()


def test_engine_feeder_direct_and_tied_auto():
    """A trainer with tied embeddings publishes with tied="auto" (lm_head
    once) and a vLLM-style engine follows through EngineFeeder(model=):
    after every version its fused parameters equal the trainer's BF16
    bit for bit, and from the third version only changed elements are
    written.  The same run published with both names costs more per delta."""
    _need()
    import numpy as np
    import torch
    from models import Config, HFLlama, VLLMStyleLlama
    from ferry_engine import EngineFeeder, vllm_loader

    torch.manual_seed(0)
    cfg = Config(vocab_size=1024)
    trainer = HFLlama(cfg)
    opt = torch.optim.AdamW(trainer.parameters(), lr=1e-5)   # an RL rate: a few % of words move
    ids = torch.randint(0, cfg.vocab_size, (4, 10))
    once = ferry.Publisher(os.path.join(TMP, "once"), "run", tied="auto", anchor_every=100)
    both = ferry.Publisher(os.path.join(TMP, "both"), "run", anchor_every=100)
    eng = VLLMStyleLlama(cfg)
    feeder = EngineFeeder(os.path.join(TMP, "once"), "run", model=eng, create=True)
    eng2 = VLLMStyleLlama(cfg)
    feeder2 = EngineFeeder(os.path.join(TMP, "once"), "run", vllm_loader(eng2), create=True)
    total = sum(p.numel() for p in eng.parameters())
    sizes = []
    for step in range(5):
        if step:
            train_step(trainer, opt, ids, cfg.vocab_size)
        sd = trainer.state_dict()
        assert sd["lm_head.weight"].data_ptr() == sd["model.embed_tokens.weight"].data_ptr()
        v = once.publish(sd)
        assert once.last_info["tied"] == TIED
        both.publish(sd)
        sizes.append((once.last_info["delta_bytes"] or once.last_info["full_bytes"],
                      both.last_info["delta_bytes"] or both.last_info["full_bytes"]))
        hf = bf16_of(sd)
        want = _fused_expect(hf, cfg)
        for f, e in ((feeder, eng), (feeder2, eng2)):
            assert f.step(timeout_s=30) == v
            got = e.state_dict()
            for name, t in want.items():
                assert np.array_equal(bits(got[name]), bits(t)), (v, name)
        la = feeder.sub.last_apply
        if v >= 3:
            assert la["indexed"] > 0 and la["elements"] < total // 2, la
        if v >= 2:   # load=: exactly the checkpoint tensors whose bits moved
            moved = {n for n in hf if n in prev and not np.array_equal(bits(hf[n]), bits(prev[n]))}
            assert set(feeder2.last_pushed) == moved - {"lm_head.weight"}, \
                set(feeder2.last_pushed) ^ moved
        prev = hf
    assert all(o < b for o, b in sizes), sizes
    for f in (feeder, feeder2):
        assert f.step(timeout_s=0.2) is None
        f.close()
    once.close()
    both.close()


if __name__ == "__main__":
    import shutil
    try:
        run("engine_changes", [test_changes_are_the_words_that_differ,
                               test_sync_apply_writes_only_what_changed,
                               test_engine_feeder_direct_and_tied_auto])
    finally:
        shutil.rmtree(TMP, ignore_errors=True)
