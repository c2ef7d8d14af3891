#!/usr/bin/python3
"""The judges of issue 24's sharded-version costs, written once for
tests/scripts/shard_cost.sh (rl-a, rl-b) and bench/shard_unseen.sh (new
sequences).  Inputs are the JSON lines of `ferry-shard-mpi --json` (SH, the
R-rank publish), `ferry publish --json` (ONE, the single-rank publish of the
same files) and build/tools/shard_island (ISL, every rank of an island group
appended to one file).  Each mode prints one summary line last; the scripts
read its fields by position, so their order is part of the interface.

  parts SH ONE R      per delta version: the R rank objects together
                      <= 1.05 x the single-rank delta + 4 KiB per rank
      -> "WORST r FAILS n N n"
  tiles ISL ONE M R   per delta version and island rank: tile bytes
                      <= (1/M + 0.05) x the single-rank delta; every
                      version bit-identical; GETs per version <= R
      -> "WORST r LIMIT l FAILS n ROWS n MANIFEST b GETS g GETFAILS n"
  index ISL SH R      per delta version and island rank: HEAD + manifest +
                      tile index bytes <= max(8192, 0.02 x its tile bytes);
                      GETs <= R
      -> "INDEX_MAX b B (share of its object bytes) COLD b B GETS g ROWS n
          FAILS n GETFAILS n"
"""
import json
import sys


def load(path):
    return [json.loads(l) for l in open(path) if l.startswith("{")]


def parts(sh, one, R, verbose=True):
    """(worst ratio, failures, delta versions, per-version ratios)."""
    worst, fails, ratios = 0.0, 0, []
    for a, b in zip(sh, one):
        if a["kind"] != "delta":
            continue
        r = a["delta_bytes"] / b["delta_bytes"]
        worst = max(worst, r)
        ok = a["delta_bytes"] <= 1.05 * b["delta_bytes"] + 4096 * R
        fails += not ok
        ratios.append((a["version"], r, ok))
        if verbose:
            print("  version %d: parts %d B, single-rank delta %d B, ratio %.4f, manifest %d B%s" % (
                a["version"], a["delta_bytes"], b["delta_bytes"], r, a["manifest_bytes"], "" if ok else "  OVER"))
    return worst, fails, sum(1 for a in sh if a["kind"] == "delta"), ratios


def tiles(isl, one, M, R):
    """Tile bytes of each island rank against the single-rank delta."""
    one = {d["version"]: d for d in one}
    r = dict(worst=0.0, limit=1 / M + 0.05, fails=0, rows=0, manifest=0, gets=0, getfails=0, identical=0, pulls=0)
    for x in isl:
        r["pulls"] += 1
        r["identical"] += x["identical"] is True
        r["fails"] += x["identical"] is not True
        r["gets"] = max(r["gets"], x["requests"])
        r["getfails"] += x["requests"] > R
        d = one[x["version"]]
        if d["kind"] != "delta":
            continue
        r["rows"] += 1
        r["worst"] = max(r["worst"], x["object_bytes"] / d["delta_bytes"])
        r["manifest"] = max(r["manifest"], x["manifest_bytes"])
        r["fails"] += not (x["object_bytes"] <= (1 / M + 0.05) * d["delta_bytes"])
    return r


def index(isl, pub, R):
    """Manifest + index bytes of each island rank per delta version."""
    kinds = {d["version"]: d["kind"] for d in pub}
    size = {d["version"]: d["manifest_bytes"] for d in pub}
    head = max(size)
    r = dict(worst=0, share=0.0, cold=0, gets=0, rows=0, fails=0, getfails=0)
    for x in isl:
        # the islands run after the publish: a pull of version v walks the
        # manifests down from HEAD; a following island reads only v's
        mb = x["manifest_bytes"] - sum(size[u] for u in range(x["version"] + 1, head + 1))
        if kinds.get(x["version"]) != "delta":
            r["cold"] = max(r["cold"], mb)
            continue
        r["rows"] += 1
        r["fails"] += mb > max(8192, 0.02 * x["object_bytes"])
        r["worst"] = max(r["worst"], mb)
        r["share"] = max(r["share"], mb / max(1, x["object_bytes"]))
        r["gets"] = max(r["gets"], x["requests"])
        r["getfails"] += x["requests"] > R
    return r


def main(argv):
    mode = argv[1] if len(argv) > 1 else ""
    if mode == "parts" and len(argv) == 5:
        worst, fails, n, _ = parts(load(argv[2]), load(argv[3]), int(argv[4]))
        print("WORST %.4f FAILS %d N %d" % (worst, fails, n))
    elif mode == "tiles" and len(argv) == 6:
        r = tiles(load(argv[2]), load(argv[3]), int(argv[4]), int(argv[5]))
        print("WORST %.4f LIMIT %.4f FAILS %d ROWS %d MANIFEST %d GETS %d GETFAILS %d" % (
            r["worst"], r["limit"], r["fails"], r["rows"], r["manifest"], r["gets"], r["getfails"]))
    elif mode == "index" and len(argv) == 5:
        r = index(load(argv[2]), load(argv[3]), int(argv[4]))
        print("INDEX_MAX %d B (%.4f of its object bytes) COLD %d B GETS %d ROWS %d FAILS %d GETFAILS %d" % (
            r["worst"], r["share"], r["cold"], r["gets"], r["rows"], r["fails"], r["getfails"]))
    else:
        sys.stderr.write("usage: shard_judge.py parts SH ONE R | tiles ISL ONE M R | index ISL SH R\n")
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
