"""Plain-torch models shaped like the ones ferry feeds (no vLLM or SGLang
needed): a Hugging Face-style Llama as a trainer holds it (q_proj, k_proj,
v_proj, gate_proj, up_proj: the names ferry publishes), and the engine side
as vLLM and SGLang hold it (fused qkv_proj and gate_up_proj, each loaded by
a weight_loader with a shard id, tied lm_head skipped), with their weight
entry points: vLLM's `model.load_weights(iterable of (name, tensor))` and
SGLang's `engine.update_weights_from_tensor(list of (name, tensor))`.

The engine's load_weights follows vLLM's LlamaForCausalLM.load_weights
(stacked_params_mapping, then a weight_loader per parameter), so an
adapter that works here feeds the real one the same names."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Set, Tuple

import torch
from torch import nn


@dataclass
class Config:
    vocab_size: int = 256
    hidden_size: int = 64
    intermediate_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2          # GQA
    tie_word_embeddings: bool = True
    rms_norm_eps: float = 1e-6

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


def _rms(x, w, eps):
    v = x.float().pow(2).mean(-1, keepdim=True)
    return (x.float() * torch.rsqrt(v + eps)).to(x.dtype) * w


def _attend(q, k, v, cfg):
    b, t, _ = q.shape
    d = cfg.head_dim
    q = q.view(b, t, cfg.num_attention_heads, d).transpose(1, 2)
    k = k.view(b, t, cfg.num_key_value_heads, d).transpose(1, 2)
    v = v.view(b, t, cfg.num_key_value_heads, d).transpose(1, 2)
    rep = cfg.num_attention_heads // cfg.num_key_value_heads
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    att = (q @ k.transpose(-1, -2)) / d ** 0.5
    mask = torch.ones(t, t, dtype=torch.bool).triu(1)
    att = att.masked_fill(mask, float("-inf")).softmax(-1)
    return (att @ v).transpose(1, 2).reshape(b, t, -1)


# ----------------------------------------------------------------------
# The trainer's model: Hugging Face names
# ----------------------------------------------------------------------

class HFLayer(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        h, kv = cfg.hidden_size, cfg.num_key_value_heads * cfg.head_dim
        self.cfg = cfg
        self.self_attn = nn.Module()
        self.self_attn.q_proj = nn.Linear(h, h, bias=False)
        self.self_attn.k_proj = nn.Linear(h, kv, bias=False)
        self.self_attn.v_proj = nn.Linear(h, kv, bias=False)
        self.self_attn.o_proj = nn.Linear(h, h, bias=False)
        self.mlp = nn.Module()
        self.mlp.gate_proj = nn.Linear(h, cfg.intermediate_size, bias=False)
        self.mlp.up_proj = nn.Linear(h, cfg.intermediate_size, bias=False)
        self.mlp.down_proj = nn.Linear(cfg.intermediate_size, h, bias=False)
        self.input_layernorm = nn.Module()
        self.input_layernorm.weight = nn.Parameter(torch.ones(h))
        self.post_attention_layernorm = nn.Module()
        self.post_attention_layernorm.weight = nn.Parameter(torch.ones(h))

    def forward(self, x):
        a, m, c = self.self_attn, self.mlp, self.cfg
        y = _rms(x, self.input_layernorm.weight, c.rms_norm_eps)
        x = x + a.o_proj(_attend(a.q_proj(y), a.k_proj(y), a.v_proj(y), c))
        y = _rms(x, self.post_attention_layernorm.weight, c.rms_norm_eps)
        return x + m.down_proj(nn.functional.silu(m.gate_proj(y)) * m.up_proj(y))


class HFLlama(nn.Module):
    """state_dict names as transformers' LlamaForCausalLM."""

    def __init__(self, cfg: Config):
        super().__init__()
        self.cfg = cfg
        self.model = nn.Module()
        self.model.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.model.layers = nn.ModuleList(HFLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.model.norm = nn.Module()
        self.model.norm.weight = nn.Parameter(torch.ones(cfg.hidden_size))
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, ids):
        x = self.model.embed_tokens(ids)
        for layer in self.model.layers:
            x = layer(x)
        return self.lm_head(_rms(x, self.model.norm.weight, self.cfg.rms_norm_eps))


# ----------------------------------------------------------------------
# The engine's model: vLLM / SGLang names and loaders
# ----------------------------------------------------------------------

# (engine parameter, checkpoint name, shard id), as vLLM's LlamaForCausalLM
STACKED_PARAMS_MAPPING: List[Tuple[str, str, object]] = [
    (".qkv_proj", ".q_proj", "q"),
    (".qkv_proj", ".k_proj", "k"),
    (".qkv_proj", ".v_proj", "v"),
    (".gate_up_proj", ".gate_proj", 0),
    (".gate_up_proj", ".up_proj", 1),
]


def default_weight_loader(param: nn.Parameter, loaded: torch.Tensor) -> None:
    if param.shape != loaded.shape:
        raise ValueError("shape %s into %s" % (tuple(loaded.shape), tuple(param.shape)))
    param.data.copy_(loaded)


class QKVLinear(nn.Module):
    """QKVParallelLinear at TP = 1: one weight [q | k | v] along dim 0."""

    def __init__(self, cfg: Config):
        super().__init__()
        d = cfg.head_dim
        self.sizes = {"q": cfg.num_attention_heads * d, "k": cfg.num_key_value_heads * d,
                      "v": cfg.num_key_value_heads * d}
        self.weight = nn.Parameter(torch.empty(sum(self.sizes.values()), cfg.hidden_size),
                                   requires_grad=False)
        self.weight.weight_loader = self.weight_loader

    def weight_loader(self, param, loaded, shard_id):
        off = {"q": 0, "k": self.sizes["q"], "v": self.sizes["q"] + self.sizes["k"]}[shard_id]
        dst = param.data.narrow(0, off, self.sizes[shard_id])
        default_weight_loader(dst, loaded)

    def forward(self, x):
        return nn.functional.linear(x, self.weight).split(list(self.sizes.values()), -1)


class MergedLinear(nn.Module):
    """MergedColumnParallelLinear at TP = 1: [gate | up] along dim 0."""

    def __init__(self, cfg: Config):
        super().__init__()
        self.n = cfg.intermediate_size
        self.weight = nn.Parameter(torch.empty(2 * self.n, cfg.hidden_size), requires_grad=False)
        self.weight.weight_loader = self.weight_loader

    def weight_loader(self, param, loaded, shard_id):
        default_weight_loader(param.data.narrow(0, shard_id * self.n, self.n), loaded)

    def forward(self, x):
        gate, up = nn.functional.linear(x, self.weight).split(self.n, -1)
        return nn.functional.silu(gate) * up


def _plain(shape):
    return nn.Parameter(torch.empty(*shape), requires_grad=False)


class EngineLayer(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        h = cfg.hidden_size
        self.cfg = cfg
        self.self_attn = nn.Module()
        self.self_attn.qkv_proj = QKVLinear(cfg)
        self.self_attn.o_proj = nn.Module()
        self.self_attn.o_proj.weight = _plain((h, h))
        self.mlp = nn.Module()
        self.mlp.gate_up_proj = MergedLinear(cfg)
        self.mlp.down_proj = nn.Module()
        self.mlp.down_proj.weight = _plain((h, cfg.intermediate_size))
        self.input_layernorm = nn.Module()
        self.input_layernorm.weight = _plain((h,))
        self.post_attention_layernorm = nn.Module()
        self.post_attention_layernorm.weight = _plain((h,))

    def forward(self, x):
        a, m, c = self.self_attn, self.mlp, self.cfg
        y = _rms(x, self.input_layernorm.weight, c.rms_norm_eps)
        q, k, v = a.qkv_proj(y)
        x = x + nn.functional.linear(_attend(q, k, v, c), a.o_proj.weight)
        y = _rms(x, self.post_attention_layernorm.weight, c.rms_norm_eps)
        return x + nn.functional.linear(m.gate_up_proj(y), m.down_proj.weight)


class VLLMStyleLlama(nn.Module):
    """The engine model: parameters as vLLM names them at TP = 1, and
    vLLM's load_weights(weights) (an iterable of checkpoint-named
    tensors; returns the parameter names loaded)."""

    def __init__(self, cfg: Config, dtype=torch.bfloat16, device="cpu"):
        super().__init__()
        self.cfg = cfg
        self.model = nn.Module()
        self.model.embed_tokens = nn.Module()
        self.model.embed_tokens.weight = _plain((cfg.vocab_size, cfg.hidden_size))
        self.model.layers = nn.ModuleList(EngineLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.model.norm = nn.Module()
        self.model.norm.weight = _plain((cfg.hidden_size,))
        self.lm_head = nn.Module()
        self.lm_head.weight = (self.model.embed_tokens.weight if cfg.tie_word_embeddings
                               else _plain((cfg.vocab_size, cfg.hidden_size)))
        self.to(dtype=dtype, device=device)
        for p in self.parameters():
            p.data.zero_()

    def load_weights(self, weights: Iterable[Tuple[str, torch.Tensor]]) -> Set[str]:
        params = dict(self.named_parameters())
        loaded: Set[str] = set()
        for name, w in weights:
            if "rotary_emb.inv_freq" in name:
                continue
            if self.cfg.tie_word_embeddings and "lm_head.weight" in name:
                continue
            for param_name, weight_name, shard_id in STACKED_PARAMS_MAPPING:
                if weight_name not in name:
                    continue
                name = name.replace(weight_name, param_name)
                param = params[name]
                param.weight_loader(param, w, shard_id)
                break
            else:
                param = params[name]
                getattr(param, "weight_loader", default_weight_loader)(param, w)
            loaded.add(name)
        return loaded

    @torch.no_grad()
    def forward(self, ids):
        x = nn.functional.embedding(ids, self.model.embed_tokens.weight)
        for layer in self.model.layers:
            x = layer(x)
        x = _rms(x, self.model.norm.weight, self.cfg.rms_norm_eps)
        return nn.functional.linear(x, self.lm_head.weight)


class SGLangStyleEngine:
    """SGLang's entry point for weights given as tensors:
    Engine.update_weights_from_tensor(named_tensors, load_format=None,
    flush_cache=True), which hands them to the model's load_weights (the
    same stacked mapping as vLLM) and then flushes the KV cache."""

    def __init__(self, cfg: Config, dtype=torch.bfloat16, device="cpu"):
        self.model = VLLMStyleLlama(cfg, dtype, device)
        self.cache_flushes = 0

    def update_weights_from_tensor(self, named_tensors: List[Tuple[str, torch.Tensor]],
                                   load_format: Optional[str] = None,
                                   flush_cache: bool = True) -> Tuple[bool, str]:
        if load_format not in (None, "direct"):
            return False, "load_format %r not supported here" % load_format
        self.model.load_weights(named_tensors)
        if flush_cache:
            self.cache_flushes += 1
        return True, "Success"


def fused_reference(hf_bf16: Dict[str, torch.Tensor], cfg: Config) -> Dict[str, torch.Tensor]:
    """The engine's parameters a checkpoint (HF names, BF16) must give:
    q/k/v and gate/up concatenated along dim 0, lm_head dropped when
    tied.  For tests: compare with engine.state_dict() bit for bit."""
    out = {}
    for name, t in hf_bf16.items():
        if cfg.tie_word_embeddings and name == "lm_head.weight":
            continue
        if ".k_proj." in name or ".v_proj." in name or ".up_proj." in name:
            continue
        if ".q_proj." in name:
            k, v = (hf_bf16[name.replace(".q_proj.", x)] for x in (".k_proj.", ".v_proj."))
            out[name.replace(".q_proj.", ".qkv_proj.")] = torch.cat([t, k, v])
        elif ".gate_proj." in name:
            out[name.replace(".gate_proj.", ".gate_up_proj.")] = torch.cat(
                [t, hf_bf16[name.replace(".gate_proj.", ".up_proj.")]])
        else:
            out[name] = t
    return out
