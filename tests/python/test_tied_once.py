"""Tied weights published once (issue 27 item 3), declared by the caller:
Publisher(tied={alias: name}) publishes the alias's values once, under the
name (metadata "ferry.tied" records the map); Subscriber(tied=same map)
patches the name and gives the alias its values, whether the engine holds
them in one storage (nothing to copy, and no host mirrors: the tied group
is gone from what the library patches) or in two.  Every version is
bit-identical on both engines; anchors and deltas are smaller than the
same run published with both names; aliases that differ are refused; a
Subscriber without the map is told which name the version lacks."""
import os
import tempfile

from _harness import bits, run
from _helpers import TIED, bf16_of, engine_examples, train_step
from _helpers import need_sync_torch as _need

import ferry

TMP = tempfile.mkdtemp(prefix="ferry-pytied1-")
engine_examples()


def test_tied_published_once():
    _need()
    import torch
    from models import Config, HFLlama

    torch.manual_seed(0)
    cfg = Config(vocab_size=4096)
    trainer = HFLlama(cfg)
    opt = torch.optim.AdamW(trainer.parameters(), lr=3e-5)
    ids = torch.randint(0, cfg.vocab_size, (8, 12))
    once = ferry.Publisher(os.path.join(TMP, "once"), "run", tied=TIED, anchor_every=100)
    twice = ferry.Publisher(os.path.join(TMP, "twice"), "run", anchor_every=100)
    sub_shared = ferry.Subscriber(os.path.join(TMP, "once"), "run", tied=TIED)
    sub_split = ferry.Subscriber(os.path.join(TMP, "once"), "run", tied=TIED)
    hf0 = bf16_of(trainer.state_dict())
    shared = {k: torch.zeros_like(v) for k, v in hf0.items() if k != "lm_head.weight"}
    shared["lm_head.weight"] = shared["model.embed_tokens.weight"]       # one storage
    split = {k: torch.zeros_like(v) for k, v in hf0.items()}            # two
    ptr = shared["model.embed_tokens.weight"].data_ptr()
    sizes = {"once": [], "twice": []}
    for step in range(4):
        if step:
            train_step(trainer, opt, ids, cfg.vocab_size)
        sd = trainer.state_dict()
        v = once.publish(sd)
        assert twice.publish(sd) == v
        for name, p in (("once", once), ("twice", twice)):
            sizes[name].append(p.last_info["full_bytes"] + p.last_info["delta_bytes"])
        hf = bf16_of(sd)
        assert sub_shared.sync_into(shared) == v and sub_split.sync_into(split) == v
        assert sub_shared._mirror is None      # patched in place, no host mirror
        for eng in (shared, split):
            for k, t in hf.items():
                assert (bits(eng[k]) == bits(t)).all(), (step, k)
        assert shared["lm_head.weight"].data_ptr() == ptr
    # what the run holds: one name, and the map
    pulled = ferry.Subscriber(os.path.join(TMP, "once"), "run")
    pulled.sync()
    got = pulled.tensors("pt")
    assert "lm_head.weight" not in got and "model.embed_tokens.weight" in got
    # an engine that does not know the map is told what the version lacks
    try:
        pulled2 = ferry.Subscriber(os.path.join(TMP, "once"), "run")
        pulled2.sync_into({k: torch.zeros_like(v) for k, v in hf0.items()})
    except ferry.SyncError as e:
        assert "missing from the version: 'lm_head.weight'" in e.message, e
    else:
        raise AssertionError("a tied-once version fed both names")
    emb = cfg.vocab_size * cfg.hidden_size * 2
    print("    bytes per version, tied once / both names: %s / %s (anchor %d vs %d; the "
          "tensor is %d B in BF16)" % (sizes["once"][1:], sizes["twice"][1:], sizes["once"][0],
                                       sizes["twice"][0], emb))
    assert sizes["twice"][0] - sizes["once"][0] >= emb // 2    # the anchor: one copy less
    for a, b in zip(sizes["once"][1:], sizes["twice"][1:]):
        assert a < b, sizes
    for x in (once, twice, sub_shared, sub_split, pulled):
        x.close()


def test_tied_refusals():
    _need()
    import torch
    w = {"emb": torch.randn(8, 4), "head": torch.randn(8, 4)}
    pub = ferry.Publisher(os.path.join(TMP, "bad"), "run", tied={"head": "emb"})
    try:
        pub.publish(w)
    except ferry.FerryError as e:
        assert e.code == ferry.errors.ERR_ARG and "differ" in e.message, e
    else:
        raise AssertionError("untied values published once")
    try:
        pub.publish({"emb": w["emb"]})
    except ferry.FerryError as e:
        assert "lacks 'head'" in e.message, e
    else:
        raise AssertionError("a missing alias accepted")
    assert pub.version == 0
    for bad in ({"a": "a"}, {"a": "b", "b": "c"}):
        try:
            ferry.Publisher(os.path.join(TMP, "bad"), "run", tied=bad)
        except ferry.FerryError as e:
            assert e.code == ferry.errors.ERR_ARG, e
        else:
            raise AssertionError("tied=%r accepted" % bad)
    pub.close()


if __name__ == "__main__":
    import shutil
    try:
        run("tied_once", [test_tied_published_once, test_tied_refusals])
    finally:
        shutil.rmtree(TMP, ignore_errors=True)
