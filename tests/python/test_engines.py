"""Engine hooks (issue 27 item 2): examples/engines feeds a vLLM-style
model (load_weights over an iterable, fused qkv_proj / gate_up_proj, tied
lm_head skipped) and an SGLang-style engine (update_weights_from_tensor)
from a run a trainer publishes in Hugging Face names (GQA, tied
embeddings, FP32 masters + AdamW).  After every version each engine's
parameters equal the fused BF16 of the trainer's model bit for bit, its
forward gives the trainer model's BF16 logits, and only the tensors whose bits
changed were pushed (a frozen layer's never after the first version)."""
import os
import tempfile

from _harness import bits, run
from _helpers import bf16_of, engine_examples, train_step
from _helpers import need_sync_torch as _need

import ferry

TMP = tempfile.mkdtemp(prefix="ferry-pyengines-")
engine_examples()


def _same(a, b):
    return a.shape == b.shape and a.dtype == b.dtype and (bits(a) == bits(b)).all()


def test_vllm_and_sglang_style_engines_follow():
    _need()
    import torch
    from models import (Config, HFLlama, SGLangStyleEngine, VLLMStyleLlama, fused_reference)
    from ferry_engine import EngineFeeder, sglang_loader, vllm_loader

    torch.manual_seed(0)
    cfg = Config()
    trainer = HFLlama(cfg)
    frozen = "model.layers.1.mlp.gate_proj.weight"
    trainer.model.layers[1].mlp.gate_proj.weight.requires_grad_(False)
    opt = torch.optim.AdamW([p for p in trainer.parameters() if p.requires_grad], lr=2e-4)
    ids = torch.randint(0, cfg.vocab_size, (8, 12))
    store = os.path.join(TMP, "store")
    pub = ferry.Publisher(store, "run")

    vllm = VLLMStyleLlama(cfg)
    sgl = SGLangStyleEngine(cfg)
    names = set(trainer.state_dict())
    assert "lm_head.weight" in names and "model.layers.0.self_attn.q_proj.weight" in names
    feeders = [("vllm", vllm, EngineFeeder(store, "run", vllm_loader(vllm), create=True)),
               ("sglang", sgl.model, EngineFeeder(store, "run", sglang_loader(sgl), create=True))]
    for step in range(5):
        if step:
            train_step(trainer, opt, ids, cfg.vocab_size)
        v = pub.publish(trainer.state_dict())
        hf = bf16_of(trainer.state_dict())
        want = fused_reference(hf, cfg)
        ref = HFLlama(cfg).to(torch.bfloat16)
        ref.load_state_dict(hf)
        with torch.no_grad():
            ref_logits = ref(ids)
        for label, model, feeder in feeders:
            assert feeder.step(timeout_s=30) == v, (label, v)
            got = model.state_dict()
            assert set(got) == set(want) | ({"lm_head.weight"} if cfg.tie_word_embeddings else set())
            for name, t in want.items():
                assert _same(got[name], t), (label, v, name)
            assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
            # the forward runs on what was fed (fused matmuls: equal up to rounding)
            assert torch.allclose(model(ids).float(), ref_logits.float(), rtol=0.02, atol=0.02)
            pushed = set(feeder.last_pushed)
            if v == 1:
                assert pushed == names, (label, pushed ^ names)
            else:
                assert frozen not in pushed and pushed, (label, v, sorted(pushed))
                # exactly the tensors whose bits moved
                moved = {n for n in names if not _same(hf[n], prev[n])}
                assert pushed == moved, (label, v, pushed ^ moved)
        prev = hf
    assert sgl.cache_flushes == 5
    for _, _, f in feeders:
        assert f.step(timeout_s=0.2) is None      # nothing new
        f.close()
    pub.close()


def test_feeder_keeps_version_on_refusal():
    """A version the engine cannot take (a tensor of another shape) is
    refused before anything is pushed: the engine keeps its version and
    weights, step() waits for a newer version instead of retrying it."""
    _need()
    import torch
    from models import Config, HFLlama, VLLMStyleLlama
    from ferry_engine import EngineFeeder, vllm_loader

    torch.manual_seed(1)
    cfg = Config(num_hidden_layers=1)
    trainer = HFLlama(cfg)
    store = os.path.join(TMP, "refuse")
    pub = ferry.Publisher(store, "run")
    pub.publish(trainer.state_dict())
    eng = VLLMStyleLlama(cfg)
    feeder = EngineFeeder(store, "run", vllm_loader(eng))
    assert feeder.step(timeout_s=10) == 1
    before = {k: v.clone() for k, v in eng.state_dict().items()}
    sd = dict(trainer.state_dict())
    sd["model.norm.weight"] = torch.ones(cfg.hidden_size + 1)
    pub.publish(sd)
    try:
        feeder.step(timeout_s=10)
    except ferry.SyncError as e:
        assert e.code == ferry.errors.ERR_SYNC_SHAPE and "model.norm.weight" in e.message, e
    else:
        raise AssertionError("a version of another shape fed")
    assert feeder.version == 1 and feeder.sub.version == 1 and feeder.sub.refused == 2
    for k, v in eng.state_dict().items():
        assert torch.equal(v, before[k]), k
    assert feeder.step(timeout_s=0.3) is None
    feeder.close()
    pub.close()


if __name__ == "__main__":
    import shutil
    try:
        run("engines", [test_vllm_and_sglang_style_engines_follow,
                        test_feeder_keeps_version_on_refusal])
    finally:
        shutil.rmtree(TMP, ignore_errors=True)
