"""Setup shared by several Python test modules, written once: what to skip
without, exceptions a case expects, and the set-ups of the sharded tests
(trainer / island processes over torch.distributed, engine tensors of a
layout, a one-rank publisher) and of the engine tests (examples/engines on
the import path, one training step of a trainer model).

A module of plain functions, not pytest fixtures: tests/run.sh runs each
test file directly (_harness.run), where conftest.py is not loaded.  torch
is imported inside the functions, so that a module can still skip cleanly
in a Python without it."""
import os
import socket
import subprocess
import sys
import time

from _harness import ROOT, Skip, bits

import ferry

# The tied pair of a Hugging Face Llama with tie_word_embeddings.
TIED = {"lm_head.weight": "model.embed_tokens.weight"}


# ----------------------------------------------------------------------
# What a case needs
# ----------------------------------------------------------------------

def need_shard():
    if not hasattr(ferry, "shard"):
        raise Skip("this libferry has no ferry_shard.h")


def need_sync():
    if not hasattr(ferry, "Publisher"):
        raise Skip("this libferry has no sync layer")


def need_sync_torch():
    """The sync layer and torch (the engine tests)."""
    need_sync()
    try:
        import torch  # noqa: F401
    except ImportError:
        raise Skip("no torch in this Python (use /usr/bin/python3)")


def engine_examples():
    """examples/engines (models.py, ferry_engine.py) on the import path."""
    path = os.path.join(ROOT, "examples", "engines")
    if path not in sys.path:
        sys.path.insert(0, path)


# ----------------------------------------------------------------------
# Expected exceptions
# ----------------------------------------------------------------------

def raises(exc, f, *a, **k):
    """The exception of class exc that f(*a, **k) raises (AssertionError
    when it raises none)."""
    try:
        f(*a, **k)
    except exc as e:
        return e
    raise AssertionError("%s not raised by %s" % (exc.__name__, getattr(f, "__name__", f)))


def raises_ferry(f, *a, **k):
    """The ferry.FerryError f(*a, **k) raises."""
    return raises(ferry.FerryError, f, *a, **k)


def raises_code(f, code, *words):
    """The FerryError f() raises, asserted to carry status `code` and every
    one of `words` in its message."""
    try:
        f()
    except ferry.FerryError as e:
        assert e.code == code and all(w in e.message for w in words), e
        return e
    raise AssertionError("no FerryError")


# ----------------------------------------------------------------------
# Sharded runs: BF16 bits, engine tensors, processes
# ----------------------------------------------------------------------

def bits16(t):
    """A tensor's BF16 bits as int16, for torch.equal."""
    import torch
    return t.to(torch.bfloat16).view(torch.int16)


def engine_params(lay, fill=0.0):
    """Engine tensors of a ferry.layout.Layout: one BF16 tensor per engine
    parameter, of its shape, every element `fill`."""
    import torch
    return {n: torch.full(p.shape, fill, dtype=torch.bfloat16) for n, p in lay.params.items()}


def publish_solo(store, run, versions, weights, **opts):
    """A one-rank ShardPublisher without torch.distributed (the four steps
    by hand), publishing weights(v) as version v for each v of versions."""
    pub = ferry.shard.ShardPublisher(store, run, rank=0, world=1, **opts)
    for v in versions:
        tok = pub.begin()
        rec = pub.put(tok, ferry.shard.dim0_parts(weights(v), 0, 1))
        info = pub.commit(tok, [rec])
        pub.finish(True)
        assert info["version"] == v, info
    pub.close()


def free_port():
    """A TCP port of 127.0.0.1 free just now (bound, then closed): for a
    gloo rendezvous, or an address nothing listens on."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def join(rank, world, port):
    """This process as rank `rank` of a gloo group of `world` on 127.0.0.1."""
    import datetime
    import torch.distributed as d
    d.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port, rank=rank, world_size=world,
                         timeout=datetime.timedelta(seconds=120))
    return d


def leave(d):
    """An orderly end: nobody exits while another still talks to the group
    (rank 0 hosts the rendezvous store)."""
    d.barrier()
    d.destroy_process_group()


def spawn(script, role, world, store):
    """`world` processes `python script role rank world port store`, one
    group on a fresh port: [(label, Popen)]."""
    port = free_port()
    return [("%s %d/%d" % (role, r, world), subprocess.Popen(
        [sys.executable, os.path.abspath(script), role, str(r), str(world), str(port), store],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)) for r in range(world)]


def reap(procs, timeout_s):
    """Waits for spawn()'s processes (all of them within timeout_s, the
    late ones killed), prints each one's output, and returns the labels of
    those that failed."""
    deadline = time.time() + timeout_s
    failed = []
    for label, p in procs:
        try:
            out, _ = p.communicate(timeout=max(1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            p.kill()
            out, _ = p.communicate()
            out += "\n(killed: timeout)"
        print("--- %s (exit %s)\n%s" % (label, p.returncode, out.strip()))
        if p.returncode != 0:
            failed.append(label)
    return failed


# ----------------------------------------------------------------------
# Engine tests: a trainer model
# ----------------------------------------------------------------------

def train_step(model, opt, ids, vocab_size):
    """One next-token cross-entropy step of `model` on ids with `opt`."""
    import torch
    logits = model(ids[:, :-1])
    torch.nn.functional.cross_entropy(logits.reshape(-1, vocab_size), ids[:, 1:].reshape(-1)).backward()
    opt.step()
    opt.zero_grad()


def bf16_of(sd):
    """A state dict's tensors, detached, in BF16."""
    import torch
    return {k: t.detach().to(torch.bfloat16) for k, t in sd.items()}


# ----------------------------------------------------------------------
# Sync tests: a small trainer, engine tensors, bitwise equality
# ----------------------------------------------------------------------

class SmallTrainer:
    """A small FP32 model moved by AdamW at an RL learning rate."""

    def __init__(self, seed=0):
        import torch
        torch.manual_seed(seed)
        self.net = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(),
                                       torch.nn.LayerNorm(256), torch.nn.Linear(256, 32))
        self.opt = torch.optim.AdamW(self.net.parameters(), lr=1e-4)
        self.x = torch.randn(128, 64)

    def step(self):
        loss = self.net(self.x).pow(2).mean()
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()

    def bf16(self):
        import torch
        return {k: v.to(torch.bfloat16) for k, v in self.net.state_dict().items()}


def bf16_zeros(sd):
    """An engine's own BF16 tensors for state dict sd: the same names and
    shapes, every element zero."""
    import torch
    return {k: torch.zeros(v.shape, dtype=torch.bfloat16) for k, v in sd.items()}


def same_bits(a, b):
    """Two dicts of tensors with the same names and the same bits."""
    import numpy as np
    return a.keys() == b.keys() and all(np.array_equal(bits(a[k]), bits(b[k])) for k in a)
