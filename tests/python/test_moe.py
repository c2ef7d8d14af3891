"""Expert-parallel islands follow a sharded MoE run (issue 24 item 5).

A tiny MoE model (2 layers, hidden 64, 4 heads, 8 experts of
moe_intermediate 32, top-2 routing, a router, one shared expert) is
trained by AdamW steps that touch a few experts each; R = 2 trainer
processes (torch.distributed, gloo) publish it over VERSIONS versions,
each rank its dim-0 shard, in both checkpoint forms: per-expert tensors
(mlp.experts.N.gate_proj / up_proj / down_proj.weight) and fused 3-D
experts (mlp.experts.w13_weight [E, 2I, H], w2_weight [E, H, I], as
vLLM's FusedMoE holds them).  Islands in this process follow each run
version by version (ShardSubscriber.apply), every rank of an island with
its own subscriber and engine tensors in ferry.layout.Layout.moe's
layout: EP 2, EP 4 (whole experts per rank) and EP 2 x TP 2 (experts
split over 2 groups, TP-split inside each), fused engine experts from
either form and per-expert engine experts from the per-expert form.

After every version each island rank's tensors equal Layout.shard of the
reference BF16 checkpoint bit for bit, and the island's forward,
reassembled in-process (each rank computes its heads, its experts' and
its shared-expert slice's outputs; the partial sums are added in rank
order), gives logits equal to the unsharded BF16 model's bit for bit
(FP64 sums rounded to BF16 at every op, as tests/python/_tp.py explains).
"""
import os
import shutil
import sys
import tempfile

from _harness import run
from _helpers import bits16 as _bits, engine_params, join, leave, need_shard, reap, spawn
from _helpers import raises_code as _raises

import torch

import ferry
from ferry.layout import Layout

from _tp import _mm, _norm, _r, bf16     # BF16 rounding at every op, FP64 sums

CFG = dict(dim=64, heads=4, experts=8, inter=32, shared=64, vocab=128, layers=2, topk=2)
VERSIONS = 3
RUNS = ("experts", "fused")           # the two checkpoint forms, one run each
OPTS = dict(anchor_every=10, min_tile_words=1024)   # small tiles: a rank fetches a part
# (tp_size, ep_size, fuse_experts, checkpoint form)
ISLANDS = [(2, 2, True, "fused"), (4, 4, True, "fused"), (4, 2, True, "fused"),
           (2, 2, True, "experts"), (4, 4, True, "experts"), (4, 2, True, "experts"),
           (4, 2, False, "experts")]
IDS = torch.tensor([3, 100, 17, 127, 64, 0, 55, 81, 99, 12, 5, 71])
TMP = tempfile.mkdtemp(prefix="ferry-pymoe-")


# ----------------------------------------------------------------------
# The model: checkpoint shapes, AdamW "training", both forms
# ----------------------------------------------------------------------

def shapes(form="experts", cfg=CFG):
    d, E, I, S, v = cfg["dim"], cfg["experts"], cfg["inter"], cfg["shared"], cfg["vocab"]
    out = {"model.embed_tokens.weight": (v, d), "model.norm.weight": (d,), "lm_head.weight": (v, d)}
    for i in range(cfg["layers"]):
        p = "model.layers.%d." % i
        out.update({p + "input_layernorm.weight": (d,), p + "post_attention_layernorm.weight": (d,),
                    p + "self_attn.q_proj.weight": (d, d), p + "self_attn.k_proj.weight": (d, d),
                    p + "self_attn.v_proj.weight": (d, d), p + "self_attn.o_proj.weight": (d, d),
                    p + "mlp.gate.weight": (E, d),
                    p + "mlp.shared_expert.gate_proj.weight": (S, d),
                    p + "mlp.shared_expert.up_proj.weight": (S, d),
                    p + "mlp.shared_expert.down_proj.weight": (d, S)})
        if form == "fused":
            out.update({p + "mlp.experts.w13_weight": (E, 2 * I, d), p + "mlp.experts.w2_weight": (E, d, I)})
        else:
            for e in range(E):
                q = p + "mlp.experts.%d." % e
                out.update({q + "gate_proj.weight": (I, d), q + "up_proj.weight": (I, d),
                            q + "down_proj.weight": (d, I)})
    return out


def masters(version, form="experts", cfg=CFG):
    """FP32 masters after `version` steps (1 = the initial weights), the
    same in every process: each AdamW step has gradients for the routers,
    one shared expert and 2 random experts per layer only, so the other
    experts keep their BF16 words (expert-sparse deltas)."""
    g = torch.Generator().manual_seed(4321)
    params = {}
    for name, shp in sorted(shapes("experts", cfg).items()):
        t = 1.0 + 0.1 * torch.randn(shp, generator=g) if name.endswith("norm.weight") \
            else 0.05 * torch.randn(shp, generator=g)
        params[name] = torch.nn.Parameter(t)
    opt = torch.optim.AdamW([params[n] for n in sorted(params)], lr=2e-3, weight_decay=0.0)
    for step in range(2, version + 1):
        g = torch.Generator().manual_seed(100 + step)
        opt.zero_grad(set_to_none=True)
        touched = ["model.layers.0.mlp.shared_expert.down_proj.weight"]
        for i in range(cfg["layers"]):
            p = "model.layers.%d.mlp." % i
            touched.append(p + "gate.weight")
            for e in sorted(torch.randperm(cfg["experts"], generator=g)[:2].tolist()):
                touched += [p + "experts.%d.%s.weight" % (e, m) for m in ("gate_proj", "up_proj", "down_proj")]
        for n in touched:
            params[n].grad = torch.randn(params[n].shape, generator=g)
        opt.step()
    w = {n: p.detach().clone() for n, p in params.items()}
    return fused(w, cfg) if form == "fused" else w


def fused(w, cfg=CFG):
    """The per-expert checkpoint w in FusedMoE's form: w13 [E, 2I, H] =
    each expert's gate rows then its up rows, w2 [E, H, I]."""
    out = {n: t for n, t in w.items() if ".experts." not in n}
    for i in range(cfg["layers"]):
        p = "model.layers.%d.mlp.experts." % i
        E = range(cfg["experts"])
        out[p + "w13_weight"] = torch.stack([torch.cat([w[p + "%d.gate_proj.weight" % e],
                                                        w[p + "%d.up_proj.weight" % e]]) for e in E])
        out[p + "w2_weight"] = torch.stack([w[p + "%d.down_proj.weight" % e] for e in E])
    return out


# ----------------------------------------------------------------------
# The forward: one island's ranks, reassembled in this process
# ----------------------------------------------------------------------

def _sum(parts):
    """The all-reduce: partials added in rank order."""
    acc = parts[0].clone()
    for p in parts[1:]:
        acc = acc + p
    return acc


def _local_experts(lay, P, base):
    """[(expert, w13 [2k, H], w2 [H, k])] of the experts this rank holds,
    from fused engine experts or per-expert ones."""
    if base + "w13_weight" in P:
        w13, w2 = P[base + "w13_weight"], P[base + "w2_weight"]
        e0 = lay.ep_rank * w13.shape[0]
        return [(e0 + j, w13[j], w2[j]) for j in range(w13.shape[0])]
    out = []
    for name in P:
        if name.startswith(base) and name.endswith(".gate_up_proj.weight"):
            e = int(name[len(base):].split(".")[0])
            out.append((e, P[name], P[base + "%d.down_proj.weight" % e]))
    return sorted(out, key=lambda t: t[0])


def forward(ranks, ids, cfg=CFG):
    """Logits (T x vocab, BF16 values in FP64) of an island: ranks =
    [(layout, engine params)] in rank order."""
    tp = len(ranks)
    d, nh, k = cfg["dim"], cfg["heads"], cfg["topk"]
    hd, lh = d // nh, nh // tp
    T = len(ids)
    parts = []
    for lay, P in ranks:
        E = P["model.embed_tokens.weight"]
        local = ids - lay.rank * E.shape[0]
        mine = (local >= 0) & (local < E.shape[0])
        x = torch.zeros(T, d, dtype=torch.float64)
        x[mine] = E[local[mine]].to(torch.float64)
        parts.append(x)
    x = _sum(parts)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    for i in range(cfg["layers"]):
        p = "model.layers.%d." % i
        parts = []
        for lay, P in ranks:
            h = _norm(x, P[p + "input_layernorm.weight"])
            q, kk, v = _r(_mm(h, P[p + "self_attn.qkv_proj.weight"])).split(lh * hd, dim=-1)
            heads = []
            for j in range(lh):
                s = slice(j * hd, (j + 1) * hd)
                sc = _r(_mm(q[:, s], kk[:, s]) / hd ** 0.5).masked_fill(~causal, float("-inf"))
                heads.append(_r(_r(torch.softmax(sc, -1)) @ v[:, s]))
            parts.append(_mm(torch.cat(heads, -1), P[p + "self_attn.o_proj.weight"]))
        x = _r(x + _r(_sum(parts)))
        parts = []
        for lay, P in ranks:
            h = _norm(x, P[p + "post_attention_layernorm.weight"])
            probs = _r(torch.softmax(_r(_mm(h, P[p + "mlp.gate.weight"])), -1))   # the router
            top, which = probs.topk(k, dim=-1)
            top = _r(top / top.sum(-1, keepdim=True))
            y = torch.zeros(T, d, dtype=torch.float64)
            for e, w13, w2 in _local_experts(lay, P, p + "mlp.experts."):
                weight = (top * (which == e)).sum(-1, keepdim=True)     # 0 where not routed to e
                gate, up = _r(_mm(h, w13)).chunk(2, dim=-1)
                y = y + weight * _mm(_r(_r(torch.nn.functional.silu(gate)) * up), w2)
            gate, up = _r(_mm(h, P[p + "mlp.shared_expert.gate_up_proj.weight"])).chunk(2, dim=-1)
            act = _r(_r(torch.nn.functional.silu(gate)) * up)
            parts.append(y + _mm(act, P[p + "mlp.shared_expert.down_proj.weight"]))
        x = _r(x + _r(_sum(parts)))
    return torch.cat([_r(_mm(_norm(x, P["model.norm.weight"]), P["lm_head.weight"])) for _, P in ranks], -1)


def reference(v):
    """The unsharded BF16 model of version v: its per-expert checkpoint and logits."""
    full = bf16(masters(v))
    lay = Layout.moe(shapes(), 1, 0)
    return full, forward([(lay, lay.shard(full))], IDS)


# ----------------------------------------------------------------------
# Trainer processes
# ----------------------------------------------------------------------

def trainer(rank, world, port, store):
    d = join(rank, world, port)
    pubs = {form: ferry.shard.ShardPublisher(store, form, **OPTS) for form in RUNS}
    for v in range(1, VERSIONS + 1):
        for form in RUNS:
            assert pubs[form].publish(ferry.shard.dim0_parts(masters(v, form), rank, world)) == v
            info = pubs[form].last_info
            print("trainer %d: %s version %d %s delta %d anchor %d bytes" % (
                rank, form, v, info["kind"], info["delta_bytes"], info["anchor_bytes"]))
    leave(d)


# ----------------------------------------------------------------------
# The tests
# ----------------------------------------------------------------------

def test_ep_islands_follow_sharded_moe_trainers():
    need_shard()
    store = "file://" + os.path.join(TMP, "store")
    os.makedirs(store[7:])
    procs = spawn(__file__, "trainer", 2, store)
    try:
        islands = []
        for tp, ep, fuse, form in ISLANDS:
            ranks = []
            for r in range(tp):
                lay = Layout.moe(shapes(form), tp, r, ep_size=ep, fuse_experts=fuse)
                params = engine_params(lay)
                ranks.append((lay, params, ferry.shard.ShardSubscriber(store, form, lay)))
            islands.append(((tp, ep, fuse, form), ranks))
        before = {}
        for v in range(1, VERSIONS + 1):
            full, want = reference(v)
            for key, ranks in islands:
                exp_full = fused(full) if key[3] == "fused" else full
                for lay, params, sub in ranks:
                    assert sub.wait(after_version=v - 1, timeout_s=120) >= v, (key, v)
                    assert sub.apply(params, exact_version=v) == v, (key, v)
                    exp = lay.shard(exp_full)
                    bad = [n for n in params if not torch.equal(_bits(params[n]), _bits(exp[n]))]
                    assert not bad, (key, lay.rank, v, bad[:3])
                    a, info = sub.last_apply, sub.last_info
                    if v == 1:
                        assert a["copied"] == len(lay.regions) and a["indexed"] == 0, (key, a)
                    else:       # a delta: the changed elements only, and not every region has any
                        assert a["copied"] == 0 and 0 < a["indexed"] < len(lay.regions), (key, v, a)
                    assert 0 < info["object_bytes"] < info["version_bytes"], (key, info)
                got = forward([(lay, params) for lay, params, _ in ranks], IDS)
                assert torch.equal(_bits(got), _bits(want)), (key, v, float((got - want).abs().max()))
                assert key not in before or not torch.equal(_bits(got), _bits(before[key])), (key, v)
                before[key] = got
                print("island tp %d ep %d %s %s: version %d ok, rank 0 fetched %d of %d bytes" % (
                    key[0], key[1], "fused" if key[2] else "per-expert", key[3], v,
                    ranks[0][2].last_info["object_bytes"], ranks[0][2].last_info["version_bytes"]))
    finally:
        failed = reap(procs, 120)
    assert not failed, failed


def test_moe_layout_regions():
    """What rank 3 of EP 2 x TP 2 holds (expert group 1, TP rank 1 inside
    its experts), in both forms, against slices cut by hand."""
    fl = Layout.moe(shapes("fused"), 4, 3, ep_size=2)
    assert (fl.ep_rank, fl.moe_tp, fl.moe_tp_rank) == (1, 2, 1)
    w13 = fl.params["model.layers.0.mlp.experts.w13_weight"]
    assert w13.kind == "experts_w13" and w13.shape == (4, 32, 64)
    # Gate rows 16..32 and up rows 48..64 of experts 4..8: two interleaved regions.
    assert [(r.row_begin, r.row_end, r.col_begin, r.col_end, r.offset, r.pitch) for r in w13.regions] == \
        [(4, 8, 16 * 64, 32 * 64, 0, 32 * 64), (4, 8, 48 * 64, 64 * 64, 16 * 64, 32 * 64)]
    w2 = fl.params["model.layers.1.mlp.experts.w2_weight"]
    assert w2.shape == (4, 64, 16) and len(w2.regions) == 64
    assert fl.params["model.layers.0.mlp.gate.weight"].kind == "replicated"
    sh = fl.params["model.layers.0.mlp.shared_expert.gate_up_proj.weight"]
    assert sh.kind == "fused" and sh.shape == (32, 64)       # 64 + 64 rows over tp 4
    assert fl.params["model.layers.0.mlp.shared_expert.down_proj.weight"].shape == (64, 16)
    full = bf16(masters(1))
    ff = fl.shard(fused(full))
    el = Layout.moe(shapes(), 4, 3, ep_size=2)
    assert {n: p.shape for n, p in el.params.items()} == {n: p.shape for n, p in fl.params.items()}
    ef = el.shard(full)
    for e in range(4, 8):
        q = "model.layers.0.mlp.experts.%d." % e
        want13 = torch.cat([full[q + "gate_proj.weight"][16:32], full[q + "up_proj.weight"][16:32]])
        want2 = full[q + "down_proj.weight"][:, 16:32]
        for got in (ff, ef):
            assert torch.equal(_bits(got["model.layers.0.mlp.experts.w13_weight"][e - 4]), _bits(want13)), e
            assert torch.equal(_bits(got["model.layers.0.mlp.experts.w2_weight"][e - 4]), _bits(want2)), e
    # EP only (vLLM): whole experts, one contiguous region per tensor.
    v = Layout.moe(shapes("fused"), 4, 1)
    assert [(r.row_begin, r.row_end, r.cols, r.pitch) for r in v.params["model.layers.0.mlp.experts.w2_weight"]
            .regions] == [(2, 4, 64 * 32, 64 * 32)]
    # Per-expert engine parameters: only this rank's experts.
    pe = Layout.moe(shapes(), 4, 0, ep_size=4, fuse_experts=False)
    names = [n for n in pe.params if ".experts." in n and n.startswith("model.layers.0.")]
    assert names == ["model.layers.0.mlp.experts.%d.%s" % (e, m) for e in (0, 1)
                     for m in ("gate_up_proj.weight", "down_proj.weight")], names
    # Splits that do not divide, missing experts: refused naming the parameter.
    _raises(lambda: Layout.moe(shapes("fused", dict(CFG, experts=6)), 4, 0), 2, "w13_weight",
            "expert count", "ep_size 4")
    _raises(lambda: Layout.moe(shapes(), 4, 0, ep_size=3), 2, "ep_size 3 does not divide")
    _raises(lambda: Layout.moe(shapes("fused", dict(CFG, inter=30)), 4, 0, ep_size=1), 2, "w13_weight",
            "not divisible by moe_tp")
    broken = {n: s for n, s in shapes().items() if n != "model.layers.1.mlp.experts.5.up_proj.weight"}
    _raises(lambda: Layout.moe(broken, 2, 0), 2, "experts.5.up_proj")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        shutil.rmtree(TMP, ignore_errors=True)   # a trainer process: the store is the parent's
        trainer(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
        sys.exit(0)
    try:
        run("moe", [v for k, v in list(globals().items()) if k.startswith("test_")])
    finally:
        shutil.rmtree(TMP, ignore_errors=True)
