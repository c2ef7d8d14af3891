#!/usr/bin/env python3
"""Issue 24 item 8: a projection of sharded versions to frontier geometries
from rates MEASURED here with the real tools.

Measures (synthetic BF16 models of two sizes, R = 4 trainer ranks under
mpirun BUILD/ferry-shard-mpi, an island rank of M = 4 row slices pulled
with BUILD/ferry shard-pull --out, steady state):
  - part bytes per changed BF16 word at 1% and at 0.05% of words changed,
    and the fixed bytes per tile (a version with no change: each tile's
    SAME byte and its tile index entry and leaf), projected by tiles;
  - words per tile of the grid the current build lays out (default
    settings) and MANIFEST/INDEX BYTES PER TILE as the island rank reads
    them per delta version (the sharded manifest/index is being reworked by
    issue 24 item 2 right now: this rate is measured from what the current
    build writes, never a constant, so rerunning after that change
    re-projects with the new index);
  - an island rank's object bytes against 1/M of the parts (over-fetch);
    its ranged GETs per delta version: 1 for a row slice that is one
    trainer rank's rows, and, for a column slice (the shard of a
    row-parallel o_proj / down_proj / w2), GETs per tile it covers;
  - trainer encode and island decode throughput (GB of BF16 model per
    second per core; the mpirun ranks share this machine's cores);
  - trainer peak RSS per rank: fixed + per GB of its shard (a fit over
    the two sizes).
Then projects bytes, requests, index bytes, trainer RSS and time per
version for Qwen3-30B-A3B, Qwen3-235B-A22B and a Kimi K2-shaped 1T model
with R = 64 trainer ranks and island ranks of TP 8 / EP 8 (each holds 1/8
of the words) at 1% and 0.05% of BF16 words changed.

    /usr/bin/python3 bench/shard_projection.py [--build build] [--json] [--save PATH]

Needs numpy and mpirun; about 1-2 minutes on 2 cores.
"""
import argparse
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COLS = 4096
NT = 8            # tensors per synthetic model
R_MEAS, M_MEAS = 4, 4
DENSITIES = (0.01, 0.0005)
SIZES = (32 << 20, 128 << 20)    # BF16 words: 64 MiB and 256 MiB models
MPI_ENV = dict(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_btl="self,vader",
               OMPI_MCA_btl_tcp_if_include="lo", OMPI_MCA_oob_tcp_if_include="lo",
               OMPI_MCA_rmaps_base_oversubscribe="1")


# ----------------------------------------------------------------------
# Geometries (public configs; BF16 words of every weight)
# ----------------------------------------------------------------------

def qwen3_moe(hidden, layers, experts, moe_inter, q_heads, kv_heads, head_dim, vocab):
    attn = hidden * q_heads * head_dim * 2 + hidden * kv_heads * head_dim * 2 + 2 * head_dim
    moe = experts * 3 * moe_inter * hidden + experts * hidden
    per_layer = attn + moe + 2 * hidden
    rowpar = layers * hidden * q_heads * head_dim   # o_proj (experts: whole, EP 8)
    return (layers * per_layer + 2 * vocab * hidden + hidden, layers * experts * 3 * moe_inter * hidden,
            rowpar)


def kimi_k2(layers=61, hidden=7168, experts=384, moe_inter=2048, shared=1, dense_inter=18432,
            q_lora=1536, kv_lora=512, heads=64, nope=128, rope=64, v=128, vocab=163840, dense_layers=1):
    attn = (hidden * q_lora + q_lora + q_lora * heads * (nope + rope) + hidden * (kv_lora + rope) + kv_lora
            + kv_lora * heads * (nope + v) + heads * v * hidden)
    moe = (experts + shared) * 3 * moe_inter * hidden + experts * hidden
    dense = 3 * dense_inter * hidden
    total = layers * (attn + 2 * hidden) + dense_layers * dense + (layers - dense_layers) * moe \
        + 2 * vocab * hidden + hidden
    rowpar = layers * heads * v * hidden + dense_layers * dense_inter * hidden \
        + (layers - dense_layers) * shared * moe_inter * hidden       # o_proj, dense/shared down
    return total, (layers - dense_layers) * experts * 3 * moe_inter * hidden, rowpar


GEOMETRIES = [
    ("Qwen3-30B-A3B",) + qwen3_moe(2048, 48, 128, 768, 32, 4, 128, 151936),
    ("Qwen3-235B-A22B",) + qwen3_moe(4096, 94, 128, 1536, 64, 4, 128, 151936),
    ("Kimi-K2 (1T)",) + kimi_k2(),
]
R_PROJ, M_PROJ = 64, 8


# ----------------------------------------------------------------------
# Synthetic models
# ----------------------------------------------------------------------

def write_st(path, tensors):
    hdr, off = {}, 0
    for n, a in tensors.items():
        hdr[n] = {"dtype": "BF16", "shape": list(a.shape), "data_offsets": [off, off + a.nbytes]}
        off += a.nbytes
    h = json.dumps(hdr).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for a in tensors.values():
            f.write(a.tobytes())


def make_versions(d, words, rng):
    """v1 (base), v2 (1% of words changed), v3 (0.05% more), v4 (= v3):
    BF16 of N(0, 0.02), changes of 1..3 ulp as RL steps make."""
    rows = words // NT // COLS
    base = {"layers.%d.weight" % i: (rng.standard_normal((rows, COLS), dtype=np.float32) * 0.02)
            .view(np.uint32).__rshift__(16).astype(np.uint16) for i in range(NT)}
    paths = [os.path.join(d, "v1.safetensors")]
    write_st(paths[0], base)
    changed = []
    for i, p in enumerate(DENSITIES + (0.0,)):
        nxt, n = {}, 0
        for name, a in base.items():
            b = a.reshape(-1).copy()
            idx = np.unique(rng.integers(0, b.size, int(round(p * b.size * 1.0005))))[:int(round(p * b.size))]
            b[idx] += rng.integers(1, 4, idx.size).astype(np.uint16)
            n += idx.size
            nxt[name] = b.reshape(a.shape)
        paths.append(os.path.join(d, "v%d.safetensors" % (i + 2)))
        write_st(paths[-1], nxt)
        changed.append(n)
        base = nxt
    return paths, changed, rows


# ----------------------------------------------------------------------
# Measurement
# ----------------------------------------------------------------------

def measure(build, words, d, rng):
    paths, changed, rows = make_versions(d, words, rng)
    store = "file://" + os.path.join(d, "store")
    env = dict(os.environ, **MPI_ENV)
    out = subprocess.run(["timeout", "300", "mpirun", "-np", str(R_MEAS), "--oversubscribe",
                          os.path.join(build, "ferry-shard-mpi"), store, "--run", "p", "--json"] + paths,
                         capture_output=True, text=True, env=env)
    if out.returncode:
        sys.exit("ferry-shard-mpi failed:\n" + out.stdout + out.stderr)
    pub = [json.loads(l) for l in out.stdout.splitlines() if l.startswith("{")]
    assert [p["kind"] for p in pub] == ["anchor", "delta", "delta", "delta"], pub
    # Islands in steady state: a second store where each version is
    # published by its own mpirun (HEAD = the version the island pulls next,
    # as when following); the island rank 1 of M = 4 (rows on tile edges)
    # goes cold to v1, then resumes from the version it holds (--out).
    store = "file://" + os.path.join(d, "follow")
    r0, r1 = rows // M_MEAS, 2 * rows // M_MEAS
    slices = []
    for i in range(NT):
        slices += ["--slice", "layers.%d.weight@%d:%d" % (i, r0, r1)]
    isl = []
    for v in range(1, 5):
        o = subprocess.run(["timeout", "300", "mpirun", "-np", str(R_MEAS), "--oversubscribe",
                            os.path.join(build, "ferry-shard-mpi"), store, "--run", "p", paths[v - 1]],
                           capture_output=True, text=True, env=env)
        if o.returncode:
            sys.exit("ferry-shard-mpi failed:\n" + o.stdout + o.stderr)
        t0 = time.time()
        o = subprocess.run([os.path.join(build, "ferry"), "shard-pull", store, "--run", "p", "--exact-version",
                            str(v), "--out", os.path.join(d, "isl.safetensors"), "--json"] + slices,
                           capture_output=True, text=True)
        wall = time.time() - t0
        if o.returncode:
            sys.exit("ferry shard-pull failed:\n" + o.stdout + o.stderr)
        j = json.loads(o.stdout.strip().splitlines()[-1])
        if v > 1 and (j["from_version"] != v - 1 or j["head"] != v):
            sys.exit("island not in steady state (from %r, head %r at v%d): %s"
                     % (j["from_version"], j["head"], v, o.stderr))
        j["wall"] = wall
        isl.append(j)
    # A column slice (what a row-parallel o_proj / down_proj shard is)
    # crosses every trainer rank's rows: its ranged GETs per delta version.
    c0, c1 = COLS // M_MEAS, 2 * COLS // M_MEAS
    cols = []
    for i in range(NT):
        cols += ["--slice", "layers.%d.weight@:,%d:%d" % (i, c0, c1)]
    for v in (1, 2):
        o = subprocess.run([os.path.join(build, "ferry"), "shard-pull", store, "--run", "p", "--exact-version",
                            str(v), "--out", os.path.join(d, "col.safetensors"), "--json"] + cols,
                           capture_output=True, text=True)
        if o.returncode:
            sys.exit("ferry shard-pull (columns) failed:\n" + o.stdout + o.stderr)
    col = json.loads(o.stdout.strip().splitlines()[-1])
    return dict(words=words, changed=changed, pub=pub, isl=isl, col=col)


def rates(ms):
    """The per-GB, per-tile and per-request rates of the measurements."""
    big = ms[-1]
    fixed = big["pub"][3]["delta_bytes"] / R_MEAS      # v4: nothing changed
    # a version with no change costs per TILE (its SAME code byte and its
    # tile index entry and leaf), not per rank: projected by tiles
    out = dict(fixed_bytes_per_rank=fixed, fixed_bytes_per_tile=big["pub"][3]["delta_bytes"] / big["pub"][3]["tiles"])
    for i, dens in enumerate(DENSITIES):
        p = big["pub"][1 + i]
        out["bytes_per_changed_word@%g" % dens] = (p["delta_bytes"] - fixed * R_MEAS) / big["changed"][i]
    out["words_per_tile"] = big["words"] / big["pub"][1]["tiles"]
    # Manifest/index bytes an island rank reads per delta version, per tile
    # of the version (what the current build writes: measured, not assumed).
    deltas = [x for x in big["isl"][1:]]
    out["index_bytes_per_tile"] = sum(x["manifest_bytes"] for x in deltas) / len(deltas) / big["pub"][1]["tiles"]
    out["island_overfetch"] = max(x["object_bytes"] * M_MEAS / big["pub"][x["version"] - 1]["delta_bytes"]
                                  for x in big["isl"][1:3])
    # GETs per delta version: row slices read 1 of R objects here; a TP rank
    # also holds row-parallel (column) slices, which cross every object.
    out["gets_row_slice_per_version"] = max(x["requests"] for x in deltas)
    out["gets_per_tile_column_slice"] = big["col"]["requests"] / big["col"]["tiles"]
    cores = min(R_MEAS, os.cpu_count() or 1)
    out["encode_gb_s_per_core"] = big["words"] * 2 / 1e9 / (big["pub"][1]["seconds"] * R_MEAS / cores)
    region_gb = big["words"] * 2 / M_MEAS / 1e9
    out["island_gb_s"] = region_gb / min(x["wall"] for x in big["isl"][1:3])
    # Trainer RSS: fixed + per GB of the rank's shard, fitted on the sizes.
    xs = [m["words"] * 2 / R_MEAS / 2 ** 30 for m in ms]
    ys = [max(max(p["peak_rss_kib"]) for p in m["pub"]) / 2 ** 20 for m in ms]
    slope = (ys[-1] - ys[0]) / (xs[-1] - xs[0])
    out["rss_gib_per_shard_gib"] = slope
    out["rss_fixed_gib"] = ys[0] - slope * xs[0]
    return out


def project(rt):
    rows = []
    for name, words, expert_words, rowpar in GEOMETRIES:
        for dens in DENSITIES:
            changed = dens * words
            tiles = words / rt["words_per_tile"]
            parts = rt["bytes_per_changed_word@%g" % dens] * changed + rt["fixed_bytes_per_tile"] * tiles
            index = rt["index_bytes_per_tile"] * tiles
            island = parts / M_PROJ * rt["island_overfetch"]
            shard_gib = words * 2 / R_PROJ / 2 ** 30
            rows.append(dict(
                model=name, params_b=words / 1e9, experts_share=expert_words / words, density=dens,
                parts_bytes=parts, tiles=tiles, island_object_bytes=island, island_index_bytes=index,
                island_gets=R_PROJ / M_PROJ + 2 + rt["gets_per_tile_column_slice"] * rowpar / rt["words_per_tile"] / M_PROJ,
                trainer_rss_gib=rt["rss_fixed_gib"] + rt["rss_gib_per_shard_gib"] * shard_gib,
                trainer_encode_s=words * 2 / R_PROJ / 1e9 / rt["encode_gb_s_per_core"],
                island_apply_s=words * 2 / M_PROJ / 1e9 / rt["island_gb_s"]))
    return rows


def human(b):
    for u in ("B", "KB", "MB", "GB"):
        if b < 1000 or u == "GB":
            return "%.0f %s" % (b, u) if u == "B" else "%.1f %s" % (b, u)
        b /= 1000.0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.environ.get("FERRY_BUILD", os.path.join(ROOT, "build")))
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--save", metavar="PATH", help="also write everything --json prints to PATH")
    a = ap.parse_args()
    for tool in ("ferry", "ferry-shard-mpi"):
        if not os.access(os.path.join(a.build, tool), os.X_OK):
            sys.exit("no %s in %s (make; NO_MPI=1 builds skip ferry-shard-mpi)" % (tool, a.build))
    if not shutil.which("mpirun"):
        sys.exit("no mpirun")
    rng = np.random.default_rng(24)
    tmp = tempfile.mkdtemp(prefix="ferry-proj-")
    t0 = time.time()
    try:
        ms = []
        for words in SIZES:
            d = os.path.join(tmp, str(words))
            os.makedirs(d)
            ms.append(measure(a.build, words, d, rng))
            shutil.rmtree(d)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    rt = rates(ms)
    rows = project(rt)
    everything = json.dumps(dict(rates=rt, R=R_PROJ, M=M_PROJ, projection=rows,
                                 measured=[dict(words=m["words"], changed=m["changed"], publish=m["pub"],
                                                island=m["isl"]) for m in ms]), indent=1)
    if a.save:
        with open(a.save, "w") as f:
            f.write(everything + "\n")
    if a.json:
        print(everything)
        return
    print("Measured rates (R = %d trainer ranks, island rank 1 of M = %d rows, synthetic BF16 models of %s words; "
          "%.0f s):" % (R_MEAS, M_MEAS, " and ".join("%dM" % (w >> 20) for w in SIZES), time.time() - t0))
    for k, v in rt.items():
        print("  %-32s %.4g" % (k, v))
    print()
    print("Projection per version, R = %d trainer ranks, island ranks of TP %d / EP %d (1/%d of the words each):"
          % (R_PROJ, M_PROJ, M_PROJ, M_PROJ))
    hdr = ("model", "params", "changed", "parts (all ranks)", "tiles", "island objects", "island index",
           "GETs", "trainer RSS", "encode", "island apply")
    print("| " + " | ".join(hdr) + " |")
    print("|" + "---|" * len(hdr))
    for r in rows:
        print("| %s | %.1fB | %g%% | %s | %.0fk | %s | %s | %.0f | %.1f GiB | %.1f s | %.1f s |" % (
            r["model"], r["params_b"], r["density"] * 100, human(r["parts_bytes"]), r["tiles"] / 1e3,
            human(r["island_object_bytes"]), human(r["island_index_bytes"]), r["island_gets"],
            r["trainer_rss_gib"], r["trainer_encode_s"], r["island_apply_s"]))


if __name__ == "__main__":
    main()
