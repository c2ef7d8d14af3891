#!/usr/bin/python3
"""A PyTorch trainer publishes its policy every step; two rollout workers
follow it through an object store, patching their BF16 weights in place.

    /usr/bin/python3 examples/torch_publish_pull.py [--steps 30] [--workers 2]

Trainer: a small policy (MLP over a character window, ~1M parameters, FP32
master weights) is fine-tuned with REINFORCE under AdamW at an RL learning
rate (1e-5).  After every optimizer step it publishes its FP32 state_dict
as is: ferry casts it to BF16 inside the library (cast_bf16), bit-identical
to model.to(torch.bfloat16), and ships only what changed.

Workers: separate processes, each with a BF16 copy of the architecture (the
"engine").  Each waits for a new version, patches the engine's own tensors
in place (verified before any write), and runs a rollout with them.

The store is a file:// directory in a temporary folder; an s3:// URL works
the same.  At the end every worker's weights must equal
model.to(torch.bfloat16) bit for bit (compared as int16 views), and the
bytes shipped are printed against full BF16 checkpoints.
"""
import argparse
import multiprocessing as mp
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

import torch  # noqa: E402

import ferry  # noqa: E402

CTX, VOCAB, EMB, HIDDEN = 8, 256, 64, 1024
RUN = "example/policy"


# ---------------------------------------------------------------------------
# The policy: next-character distribution from a window of CTX characters.
# ---------------------------------------------------------------------------
class Policy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(VOCAB, EMB)
        self.fc1 = torch.nn.Linear(CTX * EMB, HIDDEN)
        self.norm = torch.nn.LayerNorm(HIDDEN)
        self.fc2 = torch.nn.Linear(HIDDEN, VOCAB)

    def forward(self, ctx):                       # ctx: [B, CTX] int64
        h = self.emb(ctx).flatten(1)
        return self.fc2(torch.nn.functional.gelu(self.norm(self.fc1(h))))


def reward(ctx, action):
    """Verifiable reward: 1 when the next character has the parity of the
    window's last character, else 0 (a random policy scores 0.5)."""
    return (action % 2 == ctx[:, -1] % 2).float()


def rollout(policy, n, gen):
    """Samples one action per random context: (logits, action, reward)."""
    ctx = torch.randint(0, VOCAB, (n, CTX), generator=gen)
    logits = policy(ctx).float()
    probs = torch.softmax(logits.detach(), -1)
    action = torch.multinomial(probs, 1, generator=gen).squeeze(1)
    return logits, action, reward(ctx, action)


# ---------------------------------------------------------------------------
# Worker: an inference engine following the published policy.
# ---------------------------------------------------------------------------
def worker(idx, store, last_version, out_path, q, ready):
    torch.set_num_threads(1)
    engine = Policy().to(torch.bfloat16)           # its own weights, BF16
    weights = engine.state_dict()                  # views of the parameters
    sub = ferry.Subscriber(store, RUN, poll_interval_s=0.05)
    ready.put(idx)
    gen = torch.Generator().manual_seed(1000 + idx)
    seen, rollouts = [], 0
    while sub.version < last_version:
        if sub.wait(timeout_s=60) is None:
            raise SystemExit("worker %d: no new version within 60 s" % idx)
        v = sub.sync_into(weights)                 # in place, verified first
        seen.append(v)
        with torch.no_grad():
            _, _, r = rollout(engine, 16, gen)     # use the new weights
        rollouts += 1
    ferry.save(out_path, weights)                  # for the final comparison
    st = sub.stats
    q.put((idx, seen, st["bytes_fetched"], st["objects_fetched"], rollouts))


# ---------------------------------------------------------------------------
# Trainer.
# ---------------------------------------------------------------------------
def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--anchor-every", type=int, default=10)
    ap.add_argument("--store", help="store URL (default: a temporary file:// directory)")
    a = ap.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    tmp = tempfile.mkdtemp(prefix="ferry-example-")
    store = a.store or "file://" + os.path.join(tmp, "store")
    policy = Policy()
    nparams = sum(p.numel() for p in policy.parameters())
    opt = torch.optim.AdamW(policy.parameters(), lr=a.lr, weight_decay=0.01)
    pub = ferry.Publisher(store, RUN, anchor_every=a.anchor_every)   # cast_bf16=True
    print("policy: %d parameters (FP32 masters); AdamW lr %g; store %s; %d workers"
          % (nparams, a.lr, store, a.workers))

    v = pub.publish(policy.state_dict())           # version 1: the initial policy
    last = v + a.steps
    ctx = mp.get_context("spawn")
    q, ready = ctx.Queue(), ctx.Queue()
    outs = [os.path.join(tmp, "worker-%d.safetensors" % i) for i in range(a.workers)]
    procs = [ctx.Process(target=worker, args=(i, store, last, outs[i], q, ready))
             for i in range(a.workers)]
    for p in procs:
        p.start()
    for p in procs:                                # workers up (torch imported)
        ready.get(timeout=120)
    t0 = time.time()

    full = sum(t.numel() * 2 for t in policy.state_dict().values())   # one BF16 checkpoint
    shipped = pub.last_info["full_bytes"] + pub.last_info["delta_bytes"]
    print("%5s %7s %9s %12s %12s %8s" % ("ver", "kind", "changed%", "delta bytes", "full bytes", "reward"))
    print("%5d %7s %9s %12d %12d %8s" % (v, pub.last_info["kind"], "-",
                                         pub.last_info["delta_bytes"], pub.last_info["full_bytes"], "-"))
    gen = torch.Generator().manual_seed(1)
    prev = {k: t.to(torch.bfloat16) for k, t in policy.state_dict().items()}
    for step in range(a.steps):
        logits, act, r = rollout(policy, a.batch, gen)
        logp = torch.log_softmax(logits, -1).gather(1, act[:, None]).squeeze(1)
        loss = -((r - r.mean()) * logp).mean()    # REINFORCE, batch-mean baseline
        opt.zero_grad()
        loss.backward()
        opt.step()
        v = pub.publish(policy.state_dict())      # FP32 masters, cast inside ferry
        now = {k: t.to(torch.bfloat16) for k, t in policy.state_dict().items()}
        changed = sum(int((now[k].view(torch.int16) != prev[k].view(torch.int16)).sum()) for k in now)
        prev = now
        info = pub.last_info
        shipped += info["delta_bytes"] + info["full_bytes"]
        print("%5d %7s %8.3f%% %12d %12d %8.3f" % (v, info["kind"], 100.0 * changed / nparams,
                                                   info["delta_bytes"], info["full_bytes"],
                                                   float(r.mean())))
    train_s = time.time() - t0

    results = sorted(q.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]

    # Every worker's weights must be model.to(torch.bfloat16), bit for bit.
    want = policy.to(torch.bfloat16).state_dict()
    ok = True
    for (idx, seen, fetched, objects, rollouts), path in zip(results, outs):
        got = ferry.load(path, framework="pt")
        same = got.keys() == want.keys() and all(
            torch.equal(got[k].view(torch.int16), want[k].view(torch.int16)) for k in want)
        ok &= same
        print("worker %d: versions %s, %d rollouts, fetched %d bytes in %d objects; "
              "weights == model.to(bfloat16) bit for bit: %s"
              % (idx, _ranges(seen), rollouts, fetched, objects, "yes" if same else "NO"))
    nver = a.steps + 1
    fetched = [r[2] for r in results]
    print("%d versions of %d BF16 bytes: the store holds %d bytes (%.1fx less than %d full "
          "checkpoints, anchors every %d included); each worker fetched %s bytes (%.1fx less)"
          % (nver, full, shipped, nver * full / max(shipped, 1), nver, a.anchor_every,
             "/".join(map(str, fetched)), nver * full / max(max(fetched or [1]), 1)))
    print("trainer: %.1f s for %d steps" % (train_s, a.steps))
    shutil.rmtree(tmp, ignore_errors=True)
    if not ok:
        sys.exit(1)


def _ranges(vs):
    if len(vs) > 6:
        return "%s ... %s (%d syncs)" % (",".join(map(str, vs[:3])), vs[-1], len(vs))
    return ",".join(map(str, vs))


if __name__ == "__main__":
    main()
