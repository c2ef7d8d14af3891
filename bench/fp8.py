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
under bench/data/fp8 once.  Writes bench/results/fp8.json and fp8.txt.

    python3 bench/fp8.py [--build build] [--syn] [--big 64M]
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
        for lr in ("1e-8", "1e-7", "1e-6", "3e-6"):
            d = os.path.join(ROOT, "bench/data/fp8/lr" + lr)
            if not os.path.exists(os.path.join(d, "step-002.safetensors")):
                subprocess.run([os.path.join(args.build, "examples/adamw_sim"), "--out", d, "--params", "8M",
                                "--steps", "2", "--seed", "5", "--lr", lr, "--quiet"], check=True,
                               stdout=subprocess.DEVNULL)
            seqs.append(("syn-lr" + lr, d))
    return seqs


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.environ.get("BUILD", "build"))
    ap.add_argument("--data", default=os.environ.get("FERRY_DATA", os.path.join(ROOT, "../shared/data")))
    ap.add_argument("--syn", action="store_true", help="also the synthetic AdamW runs")
    ap.add_argument("--big", default=None, help="adamw_sim --params for the throughput model (e.g. 64M)")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench/results"))
    args = ap.parse_args()
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
    summary = {"pairs": rows, "throughput_big": thr,
               "throughput_all": {"in_bytes": tot_in, "seconds": tot_s, "GB_per_s": tot_in / tot_s / 1e9,
                                  "process_cpu_s": tot_cpu, "GB_per_cpu_s": tot_in / tot_cpu / 1e9}}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "fp8.json"), "w") as f:
        json.dump(summary, f, indent=1)
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
    with open(os.path.join(args.out, "fp8.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
