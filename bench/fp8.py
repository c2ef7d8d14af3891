#!/usr/bin/env python3
"""FP8 versions of a BF16 run (issue 25, "Measured"): for every consecutive
pair step-NNN -> step-MMM of each sequence,

  bf16        bytes of `ferry diff` of the two BF16 checkpoints
  fp8         bytes of `ferry diff` of their FP8 checkpoints (`ferry
              quantize`, fp8-block128: what `ferry publish --quantize`
              uploads for that version)
  sticky      the same under fp8-block128-sticky (each step quantized with
              --prev the previous step's sticky output, as the publisher does)
  full        bytes of NEW's FP8 checkpoint (the file): fp8 / full is the
              figure Fireworks reports (1.98% on average)
  peer        a peer-style FP8 delta: for each tensor of the FP8 model, the
              changed positions as int32 and the new words (FP8 codes, F32
              scales, BF16 words of the tensors kept BF16), all concatenated
              and compressed by `zstd -3`
  bf16 %      words (BF16 elements) changed in the BF16 checkpoint
  fp8 %       FP8 codes changed (quantized tensors only); scales changed
  err         mean and max |dequantized - BF16| over the quantized tensors,
              fresh vs sticky scales
and the quantizer's throughput: BF16 tensor bytes in / seconds, one thread,
as `ferry quantize --json` reports them (the largest model is the figure).

Sequences: rl-a and rl-b of $FERRY_DATA (default ../shared/data) and, with
--syn, AdamW runs of build/examples/adamw_sim (--params 8M) at learning
rates giving about 0.05% to 5% of BF16 words changed per step, generated
under bench/data/fp8 once.

With --logits, the FP8 island's logits against the BF16 model's: every
checkpoint of rl-a and rl-b (Llama-style decoders, $FERRY_DATA/
make_snapshots.py), rebuilt in torch, FP32 forward of 64 x 24 random tokens
with the BF16 weights and with the FP8 checkpoint's (ferry quantize, codes x
scales by ferry.fp8.dequantize): max and mean |logit difference|, KL(BF16 ||
FP8) per position, share of positions with the same argmax.

With --demo, build/ferry-demo --rollout-dtype fp8 --json (default settings
plus --demo-args): per leg (BF16, FP8) reward and bytes per version, the FP8
patch against the BF16 patch of the same step, and the demo's own logits
probe of the FP8 island (its policy, 8 prompts x every answer context).

Writes bench/results/fp8.json, fp8.txt and (--demo) fp8_demo_steps.json.

    python3 bench/fp8.py [--build build] [--syn] [--big 64M] [--logits] [--demo]
"""
import argparse
import resource
import json
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "python"))

WORD = {"BF16": np.uint16, "F32": np.uint32, "F8_E4M3": np.uint8, "F16": np.uint16, "I32": np.uint32}


def st_read(path):
    """name -> (dtype, words array) of a .safetensors file (numpy only)."""
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    header.pop("__metadata__", None)
    out = {}
    for name, e in header.items():
        a, b = e["data_offsets"]
        out[name] = (e["dtype"], np.frombuffer(data[8 + n + a:8 + n + b], dtype=WORD[e["dtype"]]).reshape(e["shape"]))
    return out


class Bench:
    def __init__(self, build, tmp):
        self.ferry = os.path.join(build, "ferry")
        self.tmp = tmp
        self.qcache = {}
        self.qstats = []        # (in_bytes, seconds, cpu seconds) of every quantize

    def run(self, *args):
        """ferry's stdout; self.cpu: the CPU seconds (user + system) it took."""
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        r = subprocess.run([self.ferry] + [str(a) for a in args], capture_output=True, text=True)
        if r.returncode:
            sys.exit("ferry %s: %s" % (" ".join(map(str, args)), r.stderr.strip()))
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        self.cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        return r.stdout

    def quantize(self, src, scheme, prev=None):
        key = (src, scheme)
        if key not in self.qcache:
            out = os.path.join(self.tmp, "q%d.safetensors" % len(self.qcache))
            args = ["quantize", src, out, "--scheme", scheme, "--json"] + (["--prev", prev] if prev else [])
            info = json.loads(self.run(*args))
            self.qstats.append((info["in_bytes"], info["seconds"], self.cpu))
            self.qcache[key] = out
        return self.qcache[key]

    def diff_bytes(self, a, b):
        out = os.path.join(self.tmp, "d.patch")
        self.run("diff", a, b, "-o", out, "-q")
        n = os.path.getsize(out)
        os.unlink(out)
        return n


def quant_in_process(src, reps=3):
    """ferry_quantize alone, in this process (ctypes): the model opened and
    read once first (page cache, mapping), then the best of `reps` calls'
    thread CPU time and wall time.  Returns (BF16 bytes in, cpu s, wall s)."""
    import ctypes
    import time
    import ferry
    lib = ferry._lib.lib
    f = lib.ferry_quantize
    f.restype = ctypes.c_int
    f.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p),
                  ctypes.c_void_p]
    m = ferry.Model.open(src)
    m.hash()                                    # every page read once
    best = None
    for _ in range(reps):
        out = ctypes.c_void_p()
        c0, w0 = time.thread_time(), time.perf_counter()
        rc = f(m.handle, 1, 0, None, ctypes.byref(out), None)
        c1, w1 = time.thread_time(), time.perf_counter()
        if rc:
            sys.exit("ferry_quantize: %s" % ferry.last_error())
        lib.ferry_model_free(out)
        best = (c1 - c0, w1 - w0) if best is None or c1 - c0 < best[0] else best
    n = lib.ferry_model_nbytes(m.handle)
    m.close()
    return n, best[0], best[1]


def peer_bytes(old, new, tmp):
    """int32 positions + new words of every changed word, zstd -3."""
    idx, vals = [], []
    for name, (dt, w) in new.items():
        o = old[name][1].reshape(-1)
        w = w.reshape(-1)
        ch = np.nonzero(o != w)[0]
        idx.append(ch.astype(np.int32).tobytes())
        vals.append(w[ch].tobytes())
    raw = os.path.join(tmp, "peer.bin")
    with open(raw, "wb") as f:
        f.write(b"".join(idx) + b"".join(vals))
    subprocess.run(["zstd", "-3", "-q", "-f", raw, "-o", raw + ".zst"], check=True)
    n = os.path.getsize(raw + ".zst")
    os.unlink(raw)
    os.unlink(raw + ".zst")
    return n


def quant_error(bf16, q, table):
    """mean and max |code * scale - w| over the quantized tensors."""
    tot, n, mx = 0.0, 0, 0.0
    for name, (dt, codes) in q.items():
        if dt != "F8_E4M3":
            continue
        w = (bf16[name][1].astype(np.uint32) << 16).view(np.float32)
        s = q[name + "_scale_inv"][1].view(np.float32)
        rows, cols = codes.shape
        full = np.repeat(np.repeat(s, 128, 0), 128, 1)[:rows, :cols]
        e = np.abs(table[codes] * full - w).astype(np.float64)
        tot += e.sum()
        n += e.size
        mx = max(mx, float(e.max()))
    return tot / n, mx


def changed(old, new, dtype=None):
    c = t = 0
    for name, (dt, w) in new.items():
        if dtype and dt != dtype:
            continue
        c += int(np.count_nonzero(old[name][1] != w))
        t += w.size
    return c, t


def sequences(args):
    seqs = []
    for s in ("rl-a", "rl-b"):
        d = os.path.join(args.data, s)
        if os.path.isdir(d):
            seqs.append((s, d))
    if args.syn:
        for lr in ("1e-8", "1e-7", "1e-6", "2e-6", "3e-6"):
            d = os.path.join(ROOT, "bench/data/fp8/lr" + lr)
            if not os.path.exists(os.path.join(d, "step-002.safetensors")):
                subprocess.run([os.path.join(args.build, "examples/adamw_sim"), "--out", d, "--params", "8M",
                                "--steps", "2", "--seed", "5", "--lr", lr, "--quiet"], check=True,
                               stdout=subprocess.DEVNULL)
            seqs.append(("syn-lr" + lr, d))
    return seqs


# ---- the FP8 island's logits against the BF16 model -------------------------

def lm_forward(get, n_layers, heads, tokens):
    """Logits of the Llama-style decoder of $FERRY_DATA/make_snapshots.py
    (RMSNorm, q/k/v/o attention, SwiGLU MLP, learned positions, tied or
    separate lm_head) in FP32, with weights get(name) (a torch tensor)."""
    import torch
    def rms(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w
    b, t = tokens.shape
    emb = get("model.embed_tokens.weight")
    D = emb.shape[1]
    h = emb[tokens] + get("model.pos_embed")[:t]
    mask = torch.triu(torch.full((t, t), float("-inf")), 1)
    for i in range(n_layers):
        p = "model.layers.%d." % i
        x = rms(h, get(p + "input_layernorm.weight"))
        sp = lambda z: z.view(b, t, heads, D // heads).transpose(1, 2)
        q, k, v = (sp(x @ get(p + "self_attn.%s_proj.weight" % n).T) for n in "qkv")
        att = (q @ k.transpose(-1, -2)) / (D // heads) ** 0.5 + mask
        y = (att.softmax(-1) @ v).transpose(1, 2).reshape(b, t, D)
        h = h + y @ get(p + "self_attn.o_proj.weight").T
        x = rms(h, get(p + "post_attention_layernorm.weight"))
        g, u = x @ get(p + "mlp.gate_proj.weight").T, x @ get(p + "mlp.up_proj.weight").T
        h = h + (torch.nn.functional.silu(g) * u) @ get(p + "mlp.down_proj.weight").T
    h = rms(h, get("model.norm.weight"))
    head = get("lm_head.weight") if has_name(get, "lm_head.weight") else emb
    return h @ head.T


def has_name(get, name):
    try:
        get(name)
        return True
    except KeyError:
        return False


def logits_error(bf16_path, fp8_path, readme, batch=64, seq=24, seed=0):
    """The BF16 model (weights widened to FP32) against the FP8 checkpoint
    an island holds (codes x scales by ferry.fp8.dequantize, the BF16
    tensors widened), same random token batch: max and mean |logit diff|,
    the logits' standard deviation, mean KL(BF16 || FP8) per position in
    nats, share of positions with the same argmax."""
    import torch
    import ferry.fp8
    A, Q = st_read(bf16_path), st_read(fp8_path)

    def widen(words):
        return torch.from_numpy((words.astype(np.uint32) << 16).view(np.float32).copy())

    def g_bf16(name):
        return widen(A[name][1])

    def g_fp8(name):
        dt, x = Q[name]
        if dt == "F8_E4M3":
            return torch.from_numpy(ferry.fp8.dequantize(x, Q[name + "_scale_inv"][1].view(np.float32), name))
        return widen(x)

    torch.manual_seed(seed)
    V = A["model.embed_tokens.weight"][1].shape[0]
    tokens = torch.randint(0, V, (batch, seq))
    n_layers, heads = readme["args"]["layers"], readme["args"]["heads"]
    with torch.no_grad():
        lb = lm_forward(g_bf16, n_layers, heads, tokens).double()
        lf = lm_forward(g_fp8, n_layers, heads, tokens).double()
    d = (lf - lb).abs()
    pb, pf = lb.log_softmax(-1), lf.log_softmax(-1)
    kl = (pb.exp() * (pb - pf)).sum(-1)
    return {"max_abs": float(d.max()), "mean_abs": float(d.mean()), "logit_std": float(lb.std()),
            "kl": float(kl.mean()), "same_argmax": float((lb.argmax(-1) == lf.argmax(-1)).double().mean()),
            "fp8_tensors": sum(1 for dt, _ in Q.values() if dt == "F8_E4M3")}


def logits_section(args, b):
    out = []
    for s in ("rl-a", "rl-b"):
        d = os.path.join(args.data, s)
        if not os.path.isdir(d):
            continue
        with open(os.path.join(d, "README.json")) as f:
            readme = json.load(f)
        for fn in sorted(f for f in os.listdir(d) if f.startswith("step-") and f.endswith(".safetensors")):
            src = os.path.join(d, fn)
            r = logits_error(src, b.quantize(src, "fp8-block128"), readme)
            r["model"] = "%s:%s" % (s, fn[5:8])
            out.append(r)
            print("logits %-10s max |diff| %.4g  mean |diff| %.4g  (logit std %.3g)  KL %.3g  same argmax %.2f%%"
                  % (r["model"], r["max_abs"], r["mean_abs"], r["logit_std"], r["kl"], 100 * r["same_argmax"]), flush=True)
    return out


# ---- the demo: ferry-demo --rollout-dtype fp8 ----------------------------------

def demo_section(args, tmp):
    """Runs build/ferry-demo --rollout-dtype fp8 --json (default settings: a
    BF16 leg, then the FP8 leg) and keeps, per leg, its summary and per
    version the bytes, reward and (FP8 leg) the logits probe."""
    exe = os.path.join(args.build, "ferry-demo")
    env = dict(os.environ, TMPDIR=tmp, XDG_CACHE_HOME=os.path.join(tmp, "cache"))
    r = subprocess.run([exe, "--rollout-dtype", "fp8", "--json", "--report", os.path.join(tmp, "demo.html")] + args.demo_args,
                       capture_output=True, text=True, env=env)
    if r.returncode:
        sys.exit("ferry-demo: %s" % r.stderr.strip()[-2000:])
    ev = [json.loads(l) for l in r.stdout.splitlines()]
    legs = {}
    for e in ev:
        if e["event"] == "summary":
            legs.setdefault(e["leg"], {})["summary"] = e
        elif e["event"] == "step":
            st = legs.setdefault(e["leg"], {}).setdefault("steps", [])
            st.append({k: e.get(k) for k in ("step", "new_version", "reward", "changed_pct", "patch_bytes", "bf16_patch_bytes",
                                              "full_bytes", "fp8_logit_max_abs", "fp8_logit_mean_abs", "fp8_kl",
                                              "fp8_same_argmax")})
    start = [e for e in ev if e["event"] == "start"][0]
    return {"command": " ".join(["build/ferry-demo", "--rollout-dtype", "fp8", "--json"] + args.demo_args),
            "params": start["params"], "legs": legs}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.environ.get("BUILD", "build"))
    ap.add_argument("--data", default=os.environ.get("FERRY_DATA", os.path.join(ROOT, "../shared/data")))
    ap.add_argument("--syn", action="store_true", help="also the synthetic AdamW runs")
    ap.add_argument("--big", default=None, help="adamw_sim --params for the throughput model (e.g. 64M)")
    ap.add_argument("--logits", action="store_true",
                    help="the FP8 model's logits against the BF16 model's (torch, rl-a and rl-b)")
    ap.add_argument("--demo", action="store_true", help="run ferry-demo --rollout-dtype fp8 (a BF16 and an FP8 leg)")
    ap.add_argument("--demo-args", default="", help="more ferry-demo options (one string)")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench/results"))
    args = ap.parse_args()
    args.demo_args = args.demo_args.split()
    import ferry.fp8
    table = ferry.fp8.table()
    rows = []
    with tempfile.TemporaryDirectory(prefix="ferry-fp8-bench.") as tmp:
        b = Bench(args.build, tmp)
        for label, d in sequences(args):
            steps = sorted(f for f in os.listdir(d) if f.startswith("step-") and f.endswith(".safetensors"))
            sticky_prev = None
            for i, (fa, fb) in enumerate(zip(steps, steps[1:])):
                a, bb = os.path.join(d, fa), os.path.join(d, fb)
                qa, qb = b.quantize(a, "fp8-block128"), b.quantize(bb, "fp8-block128")
                if i == 0:
                    sticky_prev = b.quantize(a, "fp8-block128-sticky")
                sa = sticky_prev
                sb = b.quantize(bb, "fp8-block128-sticky", prev=sa)
                sticky_prev = sb
                A, B, QA, QB, SA, SB = (st_read(x) for x in (a, bb, qa, qb, sa, sb))
                bc, bt = changed(A, B)
                fc, ft = changed(QA, QB, "F8_E4M3")
                sc, st = changed({k: v for k, v in QA.items() if k.endswith("_scale_inv")},
                                 {k: v for k, v in QB.items() if k.endswith("_scale_inv")})
                stc, _ = changed(SA, SB, "F8_E4M3")
                ef, es = quant_error(B, QB, table), quant_error(B, SB, table)
                r = {"pair": "%s:%s->%s" % (label, fa[5:8], fb[5:8]),
                     "bf16_bytes": b.diff_bytes(a, bb), "fp8_bytes": b.diff_bytes(qa, qb),
                     "sticky_bytes": b.diff_bytes(sa, sb), "full_fp8_bytes": os.path.getsize(qb),
                     "peer_fp8_bytes": peer_bytes(QA, QB, tmp),
                     "bf16_changed": bc / bt, "fp8_changed": fc / ft, "sticky_fp8_changed": stc / ft,
                     "scales_changed": sc, "scales": st,
                     "err_mean_fresh": ef[0], "err_max_fresh": ef[1], "err_mean_sticky": es[0], "err_max_sticky": es[1]}
                r["fp8_of_full"] = r["fp8_bytes"] / r["full_fp8_bytes"]
                rows.append(r)
                print("%-22s bf16 %8d  fp8 %8d  sticky %8d  peer %8d  fp8/full %.3f%%  changed bf16 %.3f%% fp8 %.4f%%"
                      % (r["pair"], r["bf16_bytes"], r["fp8_bytes"], r["sticky_bytes"], r["peer_fp8_bytes"],
                         100 * r["fp8_of_full"], 100 * r["bf16_changed"], 100 * r["fp8_changed"]), flush=True)
        thr = None
        if args.big:
            d = os.path.join(ROOT, "bench/data/fp8/big-" + args.big)
            if not os.path.exists(os.path.join(d, "step-000.safetensors")):
                subprocess.run([os.path.join(args.build, "examples/adamw_sim"), "--out", d, "--params", args.big,
                                "--steps", "1", "--quiet"], check=True, stdout=subprocess.DEVNULL)
            src = os.path.join(d, "step-000.safetensors")
            best = None
            for rep in range(3):
                out = os.path.join(tmp, "big.safetensors")
                info = json.loads(b.run("quantize", src, out, "--json"))
                info["cpu"] = b.cpu
                best = info if best is None or info["seconds"] < best["seconds"] else best
                os.unlink(out)
            n, cpu, wall = quant_in_process(src)
            thr = {"params": args.big, "in_bytes": best["in_bytes"], "seconds": best["seconds"],
                   "inproc_bytes": n, "inproc_cpu_s": cpu, "inproc_wall_s": wall, "inproc_GB_per_cpu_s": n / cpu / 1e9,
                   "GB_per_s": best["in_bytes"] / best["seconds"] / 1e9, "process_cpu_s": best["cpu"],
                   "GB_per_cpu_s": best["in_bytes"] / best["cpu"] / 1e9}
        tot_in = sum(x for x, _, _ in b.qstats)
        tot_s = sum(s for _, s, _ in b.qstats)
        tot_cpu = sum(c for _, _, c in b.qstats)
        logits = logits_section(args, b) if args.logits else None
        demo = demo_section(args, tmp) if args.demo else None
    summary = {"pairs": rows, "throughput_big": thr, "logits": logits, "demo": demo,
               "throughput_all": {"in_bytes": tot_in, "seconds": tot_s, "GB_per_s": tot_in / tot_s / 1e9,
                                  "process_cpu_s": tot_cpu, "GB_per_cpu_s": tot_in / tot_cpu / 1e9}}
    write_results(summary, args.out)


def write_results(summary, out):
    """fp8.json (the demo's per-version rows apart, compact, in
    fp8_demo_steps.json) and fp8.txt."""
    os.makedirs(out, exist_ok=True)
    slim = dict(summary)
    if summary.get("demo"):
        slim["demo"] = dict(summary["demo"], legs={n: {"summary": l["summary"]} for n, l in summary["demo"]["legs"].items()})
        with open(os.path.join(out, "fp8_demo_steps.json"), "w") as f:
            f.write("{\n")
            legs = list(summary["demo"]["legs"].items())
            for i, (n, l) in enumerate(legs):
                f.write(" %s: [\n" % json.dumps(n))
                f.write(",\n".join("  " + json.dumps(x, separators=(",", ":")) for x in l["steps"]))
                f.write("\n ]%s\n" % ("," if i + 1 < len(legs) else ""))
            f.write("}\n")
    with open(os.path.join(out, "fp8.json"), "w") as f:
        json.dump(slim, f, indent=1)
    rows, thr, logits, demo = summary["pairs"], summary["throughput_big"], summary.get("logits"), summary.get("demo")
    lines = ["%-22s %9s %9s %9s %9s %9s %8s %8s %9s %9s %7s %11s %11s %11s %11s" % (
        "pair", "bf16", "fp8", "sticky", "peer", "full", "fp8/bf16", "fp8/full", "bf16 ch%", "fp8 ch%",
        "scales", "err fresh", "max fresh", "err sticky", "max sticky")]
    for r in rows:
        lines.append("%-22s %9d %9d %9d %9d %9d %8.3f %7.3f%% %8.4f%% %8.4f%% %3d/%-3d %11.5e %11.5e %11.5e %11.5e" % (
            r["pair"], r["bf16_bytes"], r["fp8_bytes"], r["sticky_bytes"], r["peer_fp8_bytes"], r["full_fp8_bytes"],
            r["fp8_bytes"] / r["bf16_bytes"], 100 * r["fp8_of_full"], 100 * r["bf16_changed"], 100 * r["fp8_changed"],
            r["scales_changed"], r["scales"], r["err_mean_fresh"], r["err_max_fresh"], r["err_mean_sticky"],
            r["err_max_sticky"]))
    ta = summary["throughput_all"]
    lines.append("quantizer, one thread: %.3f GB/s over every quantize of the pairs (%d bytes in %.3f s wall); "
                 "%.3f GB per CPU second of the whole `ferry quantize` process (%.3f s, file I/O included)"
                 % (ta["GB_per_s"], ta["in_bytes"], ta["seconds"], ta["GB_per_cpu_s"], ta["process_cpu_s"]))
    if thr:
        lines.append("quantizer, one thread, adamw_sim --params %s: %.3f GB/s (%d BF16 bytes in %.3f s wall, best of 3); "
                     "%.3f GB per process CPU second (%.3f s)" % (thr["params"], thr["GB_per_s"], thr["in_bytes"],
                                                                thr["seconds"], thr["GB_per_cpu_s"], thr["process_cpu_s"]))
        lines.append("ferry_quantize alone (in process, file already read), one thread: %.3f GB per CPU second "
                     "(%d bytes, %.3f s thread CPU, %.3f s wall; best of 3)" % (thr["inproc_GB_per_cpu_s"],
                                                                               thr["inproc_bytes"], thr["inproc_cpu_s"],
                                                                               thr["inproc_wall_s"]))
    if logits:
        lines.append("logits of the FP8 model (ferry quantize, dequantized) against the BF16 model, FP32 forward of 64 x 24 "
                     "random tokens:")
        lines.append("%-10s %11s %11s %10s %11s %12s" % ("model", "max |diff|", "mean |diff|", "logit std", "KL nats",
                                                         "same argmax"))
        for r in logits:
            lines.append("%-10s %11.4g %11.4g %10.4g %11.4g %11.2f%%" % (r["model"], r["max_abs"], r["mean_abs"],
                                                                         r["logit_std"], r["kl"], 100 * r["same_argmax"]))
    if demo:
        lines.append("ferry-demo --rollout-dtype fp8 (%s; %d parameters):" % (demo["command"], demo["params"]))
        for name, leg in demo["legs"].items():
            sm, st = leg["summary"], leg["steps"]
            pub = [x for x in st if x["patch_bytes"]]
            mean_patch = sum(x["patch_bytes"] for x in pub) / max(1, len(pub))
            line = ("  %-14s reward %.3f -> %.3f (first/last %d steps); %d versions; mean patch %.0f B = %.2f%% of its "
                    "checkpoint (%d B)" % (name, sm["reward_first"], sm["reward_last"], sm["window"], sm["versions"],
                                           mean_patch, 100 * mean_patch / sm["full_bytes"], sm["full_bytes"]))
            if sm["quantize"] != "none":
                mean16 = sum(x["bf16_patch_bytes"] for x in pub) / max(1, len(pub))
                line += ("; BF16 patch of the same steps %.0f B (FP8/BF16 %.3f; %.2f%% of a BF16 checkpoint, %d B); "
                         "logits vs BF16: max |diff| %.3g, mean |diff| %.3g, KL %.3g nats, same argmax %.2f%%"
                         % (mean16, mean_patch / mean16, 100 * mean16 / sm["bf16_full_bytes"], sm["bf16_full_bytes"],
                            sm["fp8_logit_max_abs"], sm["fp8_logit_mean_abs"], sm["fp8_kl"], 100 * sm["fp8_same_argmax"]))
            lines.append(line)
    with open(os.path.join(out, "fp8.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
