"""Issue 27 bench: GPU-less engine sync, full host mirrors vs EngineFeeder
(changed tensors only), and bytes per version with a tied embedding
published once vs with both names.  A synthetic BF16 model of MB megabytes
(FP32 masters; each version adds small noise to a few % of the masters and
casts), published to a file:// store under /tmp.  Each engine mode runs in
its own process so that its peak RSS (ru_maxrss) is its own.

    FERRY_LIB=build-X/libferry.so /usr/bin/python3 bench/engine_sync.py [MB] [VERSIONS]
"""
import os, resource, shutil, subprocess, sys, tempfile, time
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(ROOT, "python"), os.path.join(ROOT, "examples", "engines")]
import torch
import ferry
from ferry_engine import EngineFeeder

TIED = {"lm_head.weight": "model.embed_tokens.weight"}

def masters(mb):
    g = torch.Generator().manual_seed(1)
    hid, vocab = 2048, 32000
    sd = {"model.embed_tokens.weight": torch.randn(vocab, hid, generator=g) * 0.02}
    left, i = mb * 2**20 // 2 - vocab * hid, 0
    while left > 0:
        n = min(left, hid * 8192)
        sd["model.layers.%d.mlp.weight" % i] = torch.randn(n // hid, hid, generator=g) * 0.02
        left -= n; i += 1
    return sd

def bf16(m):
    sd = {k: v.to(torch.bfloat16) for k, v in m.items()}
    sd["lm_head.weight"] = sd["model.embed_tokens.weight"]   # tied: one storage
    return sd

def publish(root, mb, versions):
    g = torch.Generator().manual_seed(2)
    m = masters(mb)
    pubs = {"once": ferry.Publisher(os.path.join(root, "once"), "run", tied=TIED, anchor_every=100),
            "both": ferry.Publisher(os.path.join(root, "both"), "run", anchor_every=100)}
    rows = []
    for v in range(versions):
        if v:
            for t in m.values():   # a few % of words get noise big enough to flip BF16
                mask = torch.rand(t.shape, generator=g) < 0.03
                t.add_(mask * torch.randn(t.shape, generator=g) * 1e-3)
        sd = bf16(m)
        row = []
        for name in ("once", "both"):
            pubs[name].publish(sd)
            li = pubs[name].last_info
            row.append((li["full_bytes"], li["delta_bytes"]))
        rows.append(row)
    return rows

def engine(mode, store):
    w = None
    def load(named):
        for n, t in named:
            w[n].copy_(t)
    times = []
    if mode == "feeder":
        f = None
        for v in range(1, 10**6):
            t0 = time.perf_counter()
            if f is None:
                f = EngineFeeder(store, "run", lambda named: None)
                f.sync()
                w = {n: t.clone() for n, t in f.host.items()}
                f.load = load
            else:
                if f.sub.wait(timeout_s=0.5) is None: break
                f.sync()
            times.append((time.perf_counter() - t0, len(f.last_pushed), len(f.host)))
    else:
        sub = ferry.Subscriber(store, "run")
        while True:
            t0 = time.perf_counter()
            if w is not None and sub.wait(timeout_s=0.5) is None: break
            sub.sync()
            host = sub.tensors("pt")           # full host mirror of the version
            if w is None:
                w = {n: t.clone() for n, t in host.items()}
            load(list(host.items()))           # every tensor into the engine
            del host
            times.append((time.perf_counter() - t0, len(w), len(w)))
    print("RESULT", mode, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
          ";".join("%.3f,%d,%d" % x for x in times), flush=True)

def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--engine":
        return engine(sys.argv[2], sys.argv[3])
    mb = int(sys.argv[1]) if len(sys.argv) > 1 else 512
    versions = int(sys.argv[2]) if len(sys.argv) > 2 else 4
    root = tempfile.mkdtemp(prefix="ferry-bench27-")
    try:
        t0 = time.perf_counter()
        rows = publish(root, mb, versions)
        print("model %d MB BF16, %d versions, published in %.1f s" % (mb, versions, time.perf_counter() - t0))
        print("| version | tied once: anchor / delta bytes | both names: anchor / delta bytes |")
        print("|---|---|---|")
        for v, (o, b) in enumerate(rows):
            print("| %d | %d / %d | %d / %d |" % (v + 1, o[0], o[1], b[0], b[1]))
        res = {}
        for mode in ("mirror", "feeder"):
            out = subprocess.run([sys.executable, __file__, "--engine", mode,
                                  os.path.join(root, "both")], capture_output=True, text=True)
            line = [l for l in out.stdout.splitlines() if l.startswith("RESULT")]
            if not line:
                sys.exit(out.stdout + out.stderr)
            _, _, rss, ts = line[0].split(" ", 3)
            res[mode] = (int(rss), [x.split(",") for x in ts.split(";")])
        print("\n| engine | peak RSS MB | sync s per version (tensors pushed / total) |")
        print("|---|---|---|")
        for mode, (rss, ts) in res.items():
            print("| %s | %d | %s |" % (mode, rss, ", ".join("%s (%s/%s)" % tuple(x) for x in ts)))
    finally:
        shutil.rmtree(root, ignore_errors=True)

if __name__ == "__main__":
    main()
