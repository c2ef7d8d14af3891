"""Megatron-LM's interleaved linear_qkv as a reader layout (issue 27 item 2).

Megatron holds the qkv of a GQA model interleaved per query group: for
each of the G = num_query_groups groups, that group's q rows
(heads_per_group * head_dim), its k rows (head_dim), its v rows
(head_dim); TP rank r holds groups [r*G/TP, (r+1)*G/TP).  The checkpoint
is published HF-style (separate q_proj / k_proj / v_proj, weight and
bias).

R = 2 trainer processes (torch.distributed, gloo) publish VERSIONS
versions, each rank its dim-0 shard.  Islands of TP = 1, 2 and 4 ranks
(ferry.layout.Layout.llama(fuse_qkv="megatron")) follow version by
version; after every version each rank's qkv_proj weight and bias equal,
bit for bit, rows [r*n/TP, (r+1)*n/TP) of the reference interleave of the
published q/k/v (built here by hand, not by the layout), and every other
parameter equals Layout.shard's slice.  A second run publishes one fused
[q; k; v] tensor (vLLM's qkv_proj form): the same interleave from it.
Bad arguments (groups not divisible by TP, rows that are not groups x
head_dim, a fused tensor without head_dim...) are refused naming the
parameter."""
import os
import shutil
import sys
import tempfile
import time

from _harness import run
from _helpers import bits16 as _bits, engine_params, join, leave, need_shard, publish_solo, reap, spawn
from _helpers import raises_code as _raises

import torch

import ferry
from ferry.layout import Layout, MEGATRON_QKV

# GQA: 8 query heads in G = 4 groups (2 heads per group), head_dim 8.
CFG = dict(dim=64, heads=8, groups=4, head_dim=8, ffn=128, vocab=256, layers=2)
VERSIONS = 3
TMP = tempfile.mkdtemp(prefix="ferry-megatron-")
OPTS = dict(anchor_every=3, min_tile_words=512)
TPS = (1, 2, 4)


def shapes(fused=False):
    d, f, v = CFG["dim"], CFG["ffn"], CFG["vocab"]
    nq, nk = CFG["heads"] * CFG["head_dim"], CFG["groups"] * CFG["head_dim"]
    out = {"model.embed_tokens.weight": (v, d), "model.norm.weight": (d,), "lm_head.weight": (v, d)}
    for i in range(CFG["layers"]):
        p = "model.layers.%d." % i
        out.update({p + "input_layernorm.weight": (d,), p + "post_attention_layernorm.weight": (d,),
                    p + "self_attn.o_proj.weight": (d, nq),
                    p + "mlp.gate_proj.weight": (f, d), p + "mlp.up_proj.weight": (f, d),
                    p + "mlp.down_proj.weight": (d, f)})
        if fused:
            out.update({p + "self_attn.qkv_proj.weight": (nq + 2 * nk, d),
                        p + "self_attn.qkv_proj.bias": (nq + 2 * nk,)})
        else:
            for m, n in (("q_proj", nq), ("k_proj", nk), ("v_proj", nk)):
                out.update({p + "self_attn.%s.weight" % m: (n, d), p + "self_attn.%s.bias" % m: (n,)})
    return out


def masters(version):
    """The FP32 masters after `version` steps, HF form: each step moves a
    random ~5% of the weights a little, so versions are sparse deltas."""
    g = torch.Generator().manual_seed(77)
    w = {n: 0.05 * torch.randn(s, generator=g) for n, s in sorted(shapes().items())}
    for step in range(2, version + 1):
        g = torch.Generator().manual_seed(500 + step)
        for n in sorted(w):
            t = w[n]
            t += (torch.rand(t.shape, generator=g) < 0.05) * t * 0.02 * torch.randn(t.shape, generator=g)
    return w


def fused_masters(version):
    """The same weights with q/k/v fused into one [q; k; v] tensor."""
    w = masters(version)
    for i in range(CFG["layers"]):
        p = "model.layers.%d.self_attn." % i
        for leaf in ("weight", "bias"):
            w[p + "qkv_proj." + leaf] = torch.cat([w.pop(p + m + "." + leaf) for m in ("q_proj", "k_proj", "v_proj")])
    return w


def interleave(q, k, v, groups):
    """Megatron's linear_qkv from HF q/k/v, by hand: per group q, k, v."""
    hd, qg = k.shape[0] // groups, q.shape[0] // groups
    return torch.cat([torch.cat([q[g * qg:(g + 1) * qg], k[g * hd:(g + 1) * hd], v[g * hd:(g + 1) * hd]])
                      for g in range(groups)])


def expected_qkv(full, layer, leaf, tp, rank):
    """Rank `rank` of TP's linear_qkv: its rows of the whole interleave."""
    p = "model.layers.%d.self_attn." % layer
    whole = interleave(*(full[p + m + "." + leaf] for m in ("q_proj", "k_proj", "v_proj")), CFG["groups"])
    n = whole.shape[0]
    return whole[rank * n // tp:(rank + 1) * n // tp]


def megatron(tp, rank, fused=False):
    if fused:   # by hand: the fused tensor needs head_dim; everything else as llama()
        lay = Layout(shapes(fused=True), tp, rank)
        for i in range(CFG["layers"]):
            for leaf in ("weight", "bias"):
                n = "model.layers.%d.self_attn.qkv_proj.%s" % (i, leaf)
                lay.add_megatron_qkv(n, n, CFG["groups"], head_dim=CFG["head_dim"])
        rest = {k: s for k, s in shapes(fused=True).items() if ".qkv_proj." not in k}
        lay._llama_rules(rest, True, True, "model.")
        return lay
    return Layout.llama(shapes(), tp, rank, fuse_qkv="megatron", num_query_groups=CFG["groups"])


def _check_island(lays, params, v, full):
    for (tp, r), lay in lays.items():
        P = params[(tp, r)]
        exp = lay.shard(full)
        for i in range(CFG["layers"]):
            for leaf in ("weight", "bias"):
                name = "model.layers.%d.self_attn.qkv_proj.%s" % (i, leaf)
                want = expected_qkv(full, i, leaf, tp, r)
                assert lay.params[name].kind == MEGATRON_QKV
                assert P[name].shape == want.shape, (name, P[name].shape, want.shape)
                assert torch.equal(_bits(P[name]), _bits(want)), (v, tp, r, name)
        bad = [n for n in P if not torch.equal(_bits(P[n]), _bits(exp[n]))]
        assert not bad, (v, tp, r, bad[:3])


# ----------------------------------------------------------------------
# Trainer processes
# ----------------------------------------------------------------------

def trainer(rank, world, port, store):
    d = join(rank, world, port)
    pub = ferry.shard.ShardPublisher(store, "meg", **OPTS)
    for v in range(1, VERSIONS + 1):
        assert pub.publish(ferry.shard.dim0_parts(masters(v), rank, world)) == v
        print("trainer %d/%d: version %d %s" % (rank, world, v, pub.last_info["kind"]))
    leave(d)


# ----------------------------------------------------------------------
# The tests
# ----------------------------------------------------------------------

def test_megatron_islands_follow_two_trainer_ranks():
    need_shard()
    store = "file://" + os.path.join(TMP, "store")
    os.makedirs(store[7:])
    procs = spawn(__file__, "trainer", 2, store)
    try:
        lays = {(tp, r): megatron(tp, r) for tp in TPS for r in range(tp)}
        params = {k: engine_params(lay) for k, lay in lays.items()}
        ptrs = {k: {n: t.data_ptr() for n, t in P.items()} for k, P in params.items()}
        subs = {}
        for v in range(1, VERSIONS + 1):
            for k, lay in lays.items():
                if k not in subs:
                    deadline = time.time() + 120
                    while True:      # the run appears with the trainers' first version
                        try:
                            subs[k] = ferry.shard.ShardSubscriber(store, "meg", lay)
                            break
                        except ferry.FerryError:
                            if time.time() > deadline:
                                raise
                            time.sleep(0.2)
                sub = subs[k]
                assert sub.wait(after_version=v - 1, timeout_s=120) >= v
                assert sub.apply(params[k], exact_version=v) == v
                a = sub.last_apply
                if v == 1:
                    assert a["copied"] == len(lay.regions) and a["indexed"] == 0, a
                else:
                    assert a["indexed"] > 0 and a["copied"] == 0, (v, k, a)
            _check_island(lays, params, v, {n: t.to(torch.bfloat16) for n, t in masters(v).items()})
            print("version %d: islands TP %s bit-identical" % (v, TPS))
        assert {k: {n: t.data_ptr() for n, t in P.items()} for k, P in params.items()} == ptrs  # in place
        # TP ranks together hold the whole interleave, each its own groups.
        lay = lays[(4, 1)]
        q = [r for r in lay.params["model.layers.0.self_attn.qkv_proj.weight"].regions]
        assert [(r.source.split(".")[-2], r.row_begin, r.row_end, r.offset) for r in q] == [
            ("q_proj", 16, 32, 0), ("k_proj", 8, 16, 16 * 64), ("v_proj", 8, 16, 24 * 64)]
    finally:
        failed = reap(procs, 150)
    assert not failed, failed


def test_megatron_from_fused_qkv_checkpoint():
    """A run whose checkpoint holds one fused [q; k; v] tensor: the same
    interleave, from row ranges of that one tensor."""
    need_shard()
    store = "file://" + os.path.join(TMP, "fused")
    publish_solo(store, "f", [1, 2], fused_masters, **OPTS)
    for tp in TPS:
        for r in range(tp):
            lay = megatron(tp, r, fused=True)
            P = engine_params(lay)
            sub = ferry.shard.ShardSubscriber(store, "f", lay)
            for v in (1, 2):
                assert sub.apply(P, exact_version=v) == v
                full = {n: t.to(torch.bfloat16) for n, t in masters(v).items()}
                for i in range(CFG["layers"]):
                    for leaf in ("weight", "bias"):
                        n = "model.layers.%d.self_attn.qkv_proj.%s" % (i, leaf)
                        assert torch.equal(_bits(P[n]), _bits(expected_qkv(full, i, leaf, tp, r))), (tp, r, v, n)
            assert sub.last_apply["indexed"] > 0, sub.last_apply


def test_megatron_bad_arguments():
    s = shapes()
    q, k, v = ("model.layers.0.self_attn.%s.weight" % m for m in ("q_proj", "k_proj", "v_proj"))
    name = "model.layers.0.self_attn.qkv_proj.weight"
    # Groups not divisible by TP (4 groups on 8 or 3 ranks).
    _raises(lambda: Layout(s, 8, 0).add_megatron_qkv(name, [q, k, v], 4), 2, repr(name),
            "num_query_groups 4 is not divisible by tp_size 8")
    _raises(lambda: Layout(s, 3, 0).add_megatron_qkv(name, [q, k, v], 4), 2, "not divisible by tp_size 3")
    _raises(lambda: Layout.llama(s, 8, 0, fuse_qkv="megatron", num_query_groups=4), 2, "num_query_groups 4")
    # k rows (32) are not groups x head_dim: 3 groups, or head_dim 16 given.
    _raises(lambda: Layout(s, 1, 0).add_megatron_qkv(name, [q, k, v], 3), 47, "k", "num_query_groups 3")
    _raises(lambda: Layout(s, 1, 0).add_megatron_qkv(name, [q, k, v], 4, head_dim=16), 47, "head_dim 16")
    # q rows (60) not a multiple of groups x head_dim (32).
    odd = dict(s, **{q: (60, 64)})
    _raises(lambda: Layout(odd, 1, 0).add_megatron_qkv(name, [q, k, v], 4), 47, "q", "60 rows")
    # k and v of different sizes, parts of different widths.
    _raises(lambda: Layout(dict(s, **{v: (16, 64)}), 1, 0).add_megatron_qkv(name, [q, k, v], 4), 47, "v")
    _raises(lambda: Layout(dict(s, **{v: (32, 48)}), 1, 0).add_megatron_qkv(name, [q, k, v], 4), 47,
            "differ past dim 0")
    # A fused tensor needs head_dim; too few rows for k + v.
    f = shapes(fused=True)
    fq = "model.layers.0.self_attn.qkv_proj.weight"
    _raises(lambda: Layout(f, 1, 0).add_megatron_qkv(fq, fq, 4), 2, "needs head_dim")
    _raises(lambda: Layout(f, 1, 0).add_megatron_qkv(fq, fq, 4, head_dim=16), 47, "not more than k + v")
    # Source counts, unknown tensors, non-positive or missing group counts.
    _raises(lambda: Layout(s, 1, 0).add_megatron_qkv(name, [q, k], 4), 2, "[q, k, v] or one fused")
    _raises(lambda: Layout(s, 1, 0).add_megatron_qkv(name, [q, k, "nope"], 4), 2, "'nope'")
    _raises(lambda: Layout(s, 1, 0).add_megatron_qkv(name, [q, k, v], 0), 2, "positive")
    _raises(lambda: Layout(s, 1, 0).add_megatron_qkv(name, [q, k, v], "four"), 2, "not integers")
    _raises(lambda: Layout(s, 1, 0).add(name, MEGATRON_QKV, [q, k, v]), 2, "add_megatron_qkv")
    _raises(lambda: Layout.llama(s, 2, 0, fuse_qkv="megatron"), 2, "num_query_groups")
    _raises(lambda: Layout.llama(s, 2, 0, num_query_groups=4), 2, "num_query_groups")
    _raises(lambda: Layout.llama(s, 2, 0, fuse_qkv="interleaved"), 2, "fuse_qkv")
    lay = Layout(s, 1, 0)
    lay.add_megatron_qkv(name, [q, k, v], 4)
    _raises(lambda: lay.add_megatron_qkv(name, [q, k, v], 4), 2, "described twice")
    # The engine's tensor of the wrong shape: named before any I/O.
    lay = megatron(2, 1)
    eng = engine_params(lay)
    assert eng[name].shape == (64, 64)              # 2 groups x (16 q + 8 k + 8 v) rows
    eng[name] = torch.zeros(32, 64, dtype=torch.bfloat16)
    _raises(lambda: lay.check_engine(eng), 47, repr(name), "[64, 64]")


def test_megatron_shard_matches_reference():
    """Layout.shard (what the island applies) against the hand-made
    interleave, every TP rank; and the ranks concatenate to TP = 1's."""
    full = {n: t.to(torch.bfloat16) for n, t in masters(2).items()}
    for tp in TPS:
        got = [megatron(tp, r).shard(full) for r in range(tp)]
        for i in range(CFG["layers"]):
            for leaf in ("weight", "bias"):
                n = "model.layers.%d.self_attn.qkv_proj.%s" % (i, leaf)
                whole = torch.cat([g[n] for g in got])
                assert torch.equal(_bits(whole), _bits(expected_qkv(full, i, leaf, 1, 0))), (tp, n)


if __name__ == "__main__":
    if len(sys.argv) > 1:
        shutil.rmtree(TMP, ignore_errors=True)   # a role process: the store is the parent's
        role, rank, world, port, store = sys.argv[1:6]
        trainer(int(rank), int(world), int(port), store)
        sys.exit(0)
    try:
        run("megatron_qkv", [v for k, v in list(globals().items()) if k.startswith("test_")])
    finally:
        shutil.rmtree(TMP, ignore_errors=True)
