"""Issue 27 bench: a GPU-less engine following a run version by version,
and bytes per version with a tied embedding published once or twice.

The trainer (this process) holds FP32 masters of a synthetic model of MB
megabytes in BF16 (an embedding of 32000 x 2048 tied to lm_head, then
2048-wide layers); each version adds noise of 1e-3 to 3% of the masters
(about 3% of the BF16 words change) and publishes the BF16 cast to two
file:// runs under /tmp: "once" (Publisher(tied="auto"): lm_head is one
storage with the embedding, published once) and "both" (both names).

Engines follow "both" (what an engine that knows nothing of ties sees),
each in its own process, its weights CPU tensors standing in for device
memory.  The trainer publishes version v, then tells each engine in turn
to sync and waits for its answer, then publishes v+1: every sync is one
version's step, as in a running loop.  Engine modes:
  mirror    what Subscriber.sync_into does for tensors on a GPU today: a
            host mirror of every tensor, patched in place by the library,
            then every tensor copied into the engine each version;
  feeder    EngineFeeder(load=): a host copy patched in place, the tensors
            changes() lists copied whole into the engine;
  hash      the same, with the changed tensors found by hashing every
            tensor (EngineFeeder before change lists);
  apply     Subscriber.sync_apply(engine tensors): the library's own copy
            (private mode) and index_copy_ of the changed elements only.
Per engine: wall time of each sync (the library's sync and the copies into
the engine), and peak RSS (VmHWM of its own process: ru_maxrss would count
the trainer's memory, which a child inherits at fork/exec on Linux).

    FERRY_LIB=$PWD/build-X/libferry.so /usr/bin/python3 bench/engine_sync.py [MB] [VERSIONS] [MODES]
"""
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(ROOT, "python"), os.path.join(ROOT, "examples", "engines")]


def status(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) // 1024   # MB
    return -1


# ---------------------------------------------------------------- trainer

def masters(mb, torch):
    g = torch.Generator().manual_seed(1)
    hid, vocab = 2048, 32000
    sd = {"model.embed_tokens.weight": torch.randn(vocab, hid, generator=g) * 0.02}
    left, i = mb * 2**20 // 2 - 2 * vocab * hid, 0   # MB with lm_head
    while left > 0:
        n = min(left, hid * 8192)
        sd["model.layers.%d.mlp.weight" % i] = torch.randn(n // hid, hid, generator=g) * 0.02
        left -= n
        i += 1
    return sd


def bf16(m, torch):
    sd = {k: v.to(torch.bfloat16) for k, v in m.items()}
    sd["lm_head.weight"] = sd["model.embed_tokens.weight"]   # tied: one storage
    return sd


def step(m, g, torch):
    for t in m.values():
        for part in t.view(-1).split(1 << 24):     # in pieces: no model-sized temporaries
            mask = torch.rand(part.shape, generator=g) < 0.03
            part.add_(mask * torch.randn(part.shape, generator=g) * 1e-3)


# ---------------------------------------------------------------- engines

def engine(mode, store):
    import torch
    import ferry
    from ferry_engine import EngineFeeder
    w = None                      # the engine's weights ("device" memory)
    fed = {}                      # the same, for the feeders (made by their first load)

    def load(named):
        for n, t in named:
            if n not in fed:
                fed[n] = torch.zeros_like(t)
            fed[n].copy_(t)

    def alloc(describe):
        dt = {"BF16": torch.bfloat16, "F32": torch.float32}
        return {n: torch.zeros(s, dtype=dt[d]) for n, d, s, _ in describe}

    sub = feeder = None
    if mode in ("feeder", "hash"):
        feeder = EngineFeeder(store, "run", load)
    else:
        sub = ferry.Subscriber(store, "run")
    host, hashes = None, {}
    for line in sys.stdin:
        if line.strip() != "sync":
            break
        t0 = time.perf_counter()
        if mode == "mirror":
            if host is None:
                probe = ferry.Subscriber(store, "run")   # names and shapes only
                probe.sync()
                desc = probe.describe()
                probe.close()
                host, w = alloc(desc), alloc(desc)
            v = sub.sync_into(host)                     # the mirrors, patched in place
            for n, t in host.items():                   # every tensor to the "device"
                w[n].copy_(t)
            pushed, sent = len(host), sum(t.numel() * 2 for t in host.values())
        elif mode == "apply":
            if w is None:
                sub.sync()
                w = alloc(sub.describe())
            v = sub.sync_apply(w)
            pushed = sub.last_apply["whole"] + sub.last_apply["indexed"]
            sent = sub.last_apply["bytes"]
        else:
            w = fed
            if mode == "hash" and feeder.host is not None:
                v = feeder.sub.sync_into(feeder.host)
                names = []
                for n, t in feeder.host.items():
                    h = ferry.model_hash({n: t})
                    if hashes.get(n) != h:
                        hashes[n] = h
                        names.append(n)
                if v != feeder.version:
                    load([(n, feeder.host[n]) for n in names])
                feeder.version, pushed = v, len(names)
                sent = sum(feeder.host[n].numel() * 2 for n in names)
            else:
                v = feeder.sync()
                pushed = len(feeder.last_pushed)
                sent = sum(feeder.host[n].numel() * 2 for n in feeder.last_pushed)
                if mode == "hash":
                    hashes = {n: ferry.model_hash({n: t}) for n, t in feeder.host.items()}
        dt = time.perf_counter() - t0
        print("SYNC %d %.3f %d %d %d %d" % (v, dt, pushed, len(w), status("VmRSS"), sent), flush=True)
    print("PEAK %d" % status("VmHWM"), flush=True)


# ---------------------------------------------------------------- driver

def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--engine":
        return engine(sys.argv[2], sys.argv[3])
    import torch
    import ferry
    mb = int(sys.argv[1]) if len(sys.argv) > 1 else 1024
    versions = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    modes = sys.argv[3].split(",") if len(sys.argv) > 3 else ["mirror", "feeder", "apply"]
    root = tempfile.mkdtemp(prefix="ferry-bench27-")
    procs = {}
    try:
        m = masters(mb, torch)
        g = torch.Generator().manual_seed(2)
        pubs = {"once": ferry.Publisher(os.path.join(root, "once"), "run", tied="auto",
                                        anchor_every=100, threads=2),
                "both": ferry.Publisher(os.path.join(root, "both"), "run", anchor_every=100,
                                        threads=2)}
        env = dict(os.environ, OMP_NUM_THREADS="1")
        for mode in modes:
            procs[mode] = subprocess.Popen([sys.executable, __file__, "--engine", mode,
                                            os.path.join(root, "both")], stdin=subprocess.PIPE,
                                           stdout=subprocess.PIPE, text=True, env=env)
        rows, res = [], {mode: [] for mode in modes}
        for v in range(1, versions + 1):
            if v > 1:
                step(m, g, torch)
            sd = bf16(m, torch)
            row = []
            for name in ("once", "both"):
                t0 = time.perf_counter()
                pubs[name].publish(sd)
                li = pubs[name].last_info
                row.append((li["full_bytes"], li["delta_bytes"], time.perf_counter() - t0))
            del sd
            rows.append(row)
            for mode, p in procs.items():          # one engine at a time: 2 cores
                p.stdin.write("sync\n")
                p.stdin.flush()
                out = p.stdout.readline().split()
                if not out or out[0] != "SYNC" or int(out[1]) != v:
                    sys.exit("engine %s: %r" % (mode, out))
                res[mode].append(out[2:])
        peak = {}
        for mode, p in procs.items():
            p.stdin.close()
            out = p.stdout.read().split()
            peak[mode] = out[out.index("PEAK") + 1]
            p.wait()
        print("model %d MB BF16 (embedding tied to lm_head), %d versions" % (mb, versions))
        print("\n| version | tied once: anchor / delta bytes | both names: anchor / delta bytes |")
        print("|---|---|---|")
        for v, (o, b) in enumerate(rows):
            print("| %d | %d / %d | %d / %d |" % (v + 1, o[0], o[1], b[0], b[1]))
        print("\n| engine | peak RSS MB | RSS after last sync MB | sync s: version 1 | 2 | 3.. "
              "(mean) | MB into the engine per delta, 3.. (mean) | tensors written per delta |")
        print("|---|---|---|---|---|---|---|---|")
        for mode, r in res.items():
            later = [float(x[0]) for x in r[2:]]
            sent = [int(x[4]) for x in r[2:]]
            print("| %s | %s | %s | %.2f | %s | %s | %s | %s |" % (
                mode, peak[mode], r[-1][3], float(r[0][0]),
                "%.2f" % float(r[1][0]) if len(r) > 1 else "-",
                "%.3f" % (sum(later) / len(later)) if later else "-",
                "%.0f" % (sum(sent) / len(sent) / 2**20) if sent else "-",
                ", ".join("%s/%s" % (x[1], x[2]) for x in r[1:])))
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
