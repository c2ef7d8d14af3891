"""A tiny Llama-style model for the tensor-parallel tests: its checkpoint
(names and shapes of a Llama checkpoint), a deterministic "training" run of
FP32 masters, and one forward that runs either unsharded (the reference)
or tensor-parallel over a torch.distributed group, on the engine layout of
ferry.layout.Layout.llama.

Exactness.  Every product and sum is computed in FP64 from the BF16
weights and activations, and every op's result is rounded to BF16, as a
BF16 engine stores them.  The TP run splits some sums (row-parallel
layers) into per-rank partials added in rank order; FP64 keeps those
sums within ~1e-16 relative of the unsplit ones, far below BF16's 2^-8
steps, so after the rounding both runs agree bit for bit (the test
asserts it, and separately that every engine weight equals the
reference's slice bit for bit)."""
import torch

CFG = dict(dim=96, heads=6, ffn=192, vocab=384, layers=2)   # divisible by 2 and 3
EPS = 1e-5


def shapes(cfg=CFG):
    d, f, v = cfg["dim"], cfg["ffn"], cfg["vocab"]
    out = {"model.embed_tokens.weight": (v, d), "model.norm.weight": (d,), "lm_head.weight": (v, d)}
    for i in range(cfg["layers"]):
        p = "model.layers.%d." % i
        out.update({p + "input_layernorm.weight": (d,), p + "post_attention_layernorm.weight": (d,),
                    p + "self_attn.q_proj.weight": (d, d), p + "self_attn.k_proj.weight": (d, d),
                    p + "self_attn.v_proj.weight": (d, d), p + "self_attn.o_proj.weight": (d, d),
                    p + "mlp.gate_proj.weight": (f, d), p + "mlp.up_proj.weight": (f, d),
                    p + "mlp.down_proj.weight": (d, f)})
    return out


def masters(version, cfg=CFG, tied=False):
    """The FP32 masters after `version` training steps (1 = the initial
    weights): the same on every process that asks.  Each step moves a
    random ~5% of the weights by a small relative amount, as RL steps do,
    so most BF16 words stay and the versions are sparse deltas."""
    g = torch.Generator().manual_seed(1234)
    w = {}
    for name, shp in sorted(shapes(cfg).items()):
        if name.endswith("norm.weight"):
            w[name] = 1.0 + 0.1 * torch.randn(shp, generator=g)
        else:
            w[name] = 0.05 * torch.randn(shp, generator=g)
    for step in range(2, version + 1):
        g = torch.Generator().manual_seed(1000 + step)
        for name in sorted(w):
            t = w[name]
            mask = torch.rand(t.shape, generator=g) < 0.05
            t += mask * t * 0.02 * torch.randn(t.shape, generator=g)
    if tied:
        w["lm_head.weight"] = w["model.embed_tokens.weight"]
    return w


def bf16(full):
    return {k: v.to(torch.bfloat16) for k, v in full.items()}


def _r(x):
    """Rounded to BF16, carried in FP64."""
    return x.to(torch.bfloat16).to(torch.float64)


def _mm(x, w):
    return x @ w.to(torch.float64).t()


def _norm(x, w):
    return _r(x / torch.sqrt((x * x).mean(-1, keepdim=True) + EPS) * w.to(torch.float64))


class Solo:
    """The unsharded run: tp 1, collectives are the identity."""
    world, rank = 1, 0

    def gather(self, x):
        return [x]


class Dist:
    """TP over a torch.distributed group."""

    def __init__(self, group=None):
        import torch.distributed as d
        self.d, self.group = d, group
        self.world, self.rank = d.get_world_size(group), d.get_rank(group)

    def gather(self, x):
        out = [torch.empty_like(x) for _ in range(self.world)]
        self.d.all_gather(out, x.contiguous(), group=self.group)
        return out


def _sum(comm, x):
    """All-reduce by gather + a sum in rank order (a fixed order)."""
    parts = comm.gather(x)
    acc = parts[0].clone()
    for p in parts[1:]:
        acc += p
    return acc


def forward(P, ids, comm, cfg=CFG):
    """Logits (T x vocab, BF16 values in FP64) of token ids, from this
    rank's engine parameters P (Layout.llama names: fused qkv_proj and
    gate_up_proj, row-parallel o/down, vocabulary-parallel embedding and
    head)."""
    tp = comm.world
    d, nh = cfg["dim"], cfg["heads"]
    hd, lh = d // nh, nh // tp
    E = P["model.embed_tokens.weight"]
    v0 = comm.rank * E.shape[0]
    local = ids - v0
    mine = (local >= 0) & (local < E.shape[0])
    x = torch.zeros(len(ids), d, dtype=torch.float64)
    x[mine] = E[local[mine]].to(torch.float64)
    x = _sum(comm, x)                                  # one non-zero term: exact
    T = len(ids)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    for i in range(cfg["layers"]):
        p = "model.layers.%d." % i
        h = _norm(x, P[p + "input_layernorm.weight"])
        qkv = _r(_mm(h, P[p + "self_attn.qkv_proj.weight"]))
        q, k, v = qkv.split(lh * hd, dim=-1)
        heads = []
        for j in range(lh):
            s = slice(j * hd, (j + 1) * hd)
            sc = _r(_mm(q[:, s], k[:, s]) / hd ** 0.5).masked_fill(~causal, float("-inf"))
            heads.append(_r(_r(torch.softmax(sc, -1)) @ v[:, s]))
        o = _sum(comm, _mm(torch.cat(heads, -1), P[p + "self_attn.o_proj.weight"]))
        x = _r(x + _r(o))
        h = _norm(x, P[p + "post_attention_layernorm.weight"])
        gate, up = _r(_mm(h, P[p + "mlp.gate_up_proj.weight"])).chunk(2, dim=-1)
        act = _r(_r(torch.nn.functional.silu(gate)) * up)
        x = _r(x + _r(_sum(comm, _mm(act, P[p + "mlp.down_proj.weight"]))))
    h = _norm(x, P["model.norm.weight"])
    return torch.cat(comm.gather(_r(_mm(h, P["lm_head.weight"]))), -1)


IDS = torch.tensor([3, 200, 17, 383, 128, 0, 255, 64, 129, 300, 5, 191])
