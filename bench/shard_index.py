#!/usr/bin/env python3
"""Issue 24 item 2, sizing: what an island rank reads of the per-version
index today (the whole manifest-2, every tile listed) against what it would
read with the tile index moved out of the manifest into the rank objects.

Reads the real manifest-2 records of a sharded run in a file:// store (as
written by build/ferry-shard-mpi; unsigned or signed: the signature block
after the JSON is skipped) and, for island layouts rows / cols at M = 2, 3,
4 (the regions of tests/tools/shard_layout.h), prints per delta version and
island rank:

  before   the manifest-2 bytes (what every island rank reads today);
  tiles    the delta payload bytes of the tiles covering its regions;
  A        manifest + index bytes in layout A: the manifest lists only the
           R rank objects (key, bytes, SHA-256, index range, and the SHA-256
           of its layout, directory and entries sections); each rank object
           ends in an index of
             layout    its parts (name, dtype, shape, rows, cuts): fixed for
                       the run, so an island reads it once and keeps it by
                       digest (not counted per version);
             directory one SHA-256 per part (over the part's entries);
             entries   per part: u64 offset of its first tile, then per tile
                       u32 length, 16-byte target hash, 32-byte SHA-256;
           a rank whose every part it touches is read whole (entries, checked
           against the manifest's digest), otherwise the directory and the
           entries of its parts;
  B        as A, but per part one SHA-256 over the part's payload run and
           per tile only u32 length + target; the 32-byte per-tile digests
           sit in a separate per-part array read only for parts of which the
           island holds a strict subset of tiles;
  C        per rank object a Merkle tree over its tiles (in object order:
           by part, then row-major), leaf = SHA-256 of (u32 length, 16-byte
           target, payload); the manifest signs each root; the index holds
           per tile u32 length + target (20 bytes, range-read for the tiles
           the island holds) and the tree's node hashes, of which the island
           reads the siblings it needs to recompute the root (32 bytes each).
           No per-part digest, so the cost follows the tiles read, not the
           parts touched.

Layouts are counted with the manifest as the R objects list (about 2.2 KB
on rl-a), the layout section read once per run (not per version).
The bound of the issue is  A (or B) <= max(8192, 0.02 * tiles)  per delta
version and island rank.  Usage:
    bench/shard_index.py STORE_DIR RUN
"""
import glob
import json
import os
import sys

ENTRY_A, ENTRY_B, DIGEST, OFF = 4 + 16 + 32, 4 + 16, 32, 8


def load_manifest(path):
    raw = open(path, "rb").read()
    end = raw.rfind(b"}")
    # a sealed record: the JSON body, then the signature trailer
    body = raw[: end + 1]
    while True:
        try:
            return json.loads(body), len(raw)
        except ValueError:
            end = body.rfind(b"}", 0, len(body) - 1)
            if end < 0:
                raise
            body = body[: end + 1]


def view(shape):
    rows = shape[0] if shape else 1
    cols = 1
    for d in shape[1:]:
        cols *= d
    return rows, cols


def regions(tensors, layout, m, M):
    out = {}
    for name, shape in tensors.items():
        rows, cols = view(shape)
        by_cols = layout == "cols" and cols > 1
        n = cols if by_cols else rows
        a, b = n * m // M, n * (m + 1) // M
        out[name] = (0, rows, a, b) if by_cols else (a, b, 0, cols)
    return out


def tiles_of(part):
    rc, cc = part["row_cuts"], part["col_cuts"]
    k = 0
    for i in range(len(rc) - 1):
        for j in range(len(cc) - 1):
            yield (rc[i], rc[i + 1], cc[j], cc[j + 1]), part["tiles"][k]
            k += 1


def new_manifest_bytes(man):
    """The manifest-2 without its parts, objects with the new digests."""
    m = {k: v for k, v in man.items() if k != "parts"}
    m["index"] = "ferry-shard-index-1"
    objs = []
    for o in man["objects"]:
        o = dict(o)
        o["sha256"] = "0" * 64
        o["index"] = [0, 0]
        o["layout_sha256"] = o["dir_sha256"] = o["entries_sha256"] = "0" * 64
        objs.append(o)
    m["objects"] = objs
    return len(json.dumps(m, separators=(",", ":")))


def proof_nodes(n, wanted):
    """Sibling hashes a reader of leaves `wanted` (of n) needs to recompute
    the root of a Merkle tree whose odd last node at a level is promoted
    (it has no sibling to send)."""
    level, cnt, count = set(wanted), n, 0
    while cnt > 1:
        count += sum(1 for i in level if (i ^ 1) < cnt and (i ^ 1) not in level)
        level = {i // 2 for i in level}
        cnt = (cnt + 1) // 2
    return count


def main():
    store, run = sys.argv[1], sys.argv[2]
    paths = sorted(glob.glob(os.path.join(store, run, "v", "*.json")))
    print("| version | layout | M | rank | before B | tiles B | A B | A ok | B B | B ok | C B | C ok |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    worst = {}
    for path in paths:
        man, before = load_manifest(path)
        if man.get("format") != "ferry-manifest-2" or man["kind"] != "delta":
            continue
        if "index" in man:  # the index form: no tile is listed (what this sized)
            sys.exit("%s: a manifest of the index form (%s): this sizing reads the old form only" % (path, man["index"]))
        newm = new_manifest_bytes(man)
        tensors = {p["name"]: p["shape"] for p in man["parts"]}
        byrank = {}
        for p in man["parts"]:
            byrank.setdefault(p["rank"], []).append(p)
        for layout in ("rows", "cols"):
            for M in (2, 3, 4):
                for m in range(M):
                    reg = regions(tensors, layout, m, M)
                    tiles = 0
                    a_bytes = b_bytes = c_bytes = newm
                    for r, parts in byrank.items():
                        full_a = full_b = 0
                        part_a = part_b = subset = 0
                        leaves, wanted_leaves = 0, set()
                        touched = 0
                        for p in parts:
                            n = len(p["tiles"])
                            ga, gb = OFF + n * ENTRY_A, OFF + DIGEST + n * ENTRY_B
                            full_a += ga
                            full_b += gb
                            r0, r1, c0, c1 = reg[p["name"]]
                            hit = [tr0 < r1 and r0 < tr1 and tc0 < c1 and c0 < tc1 for (tr0, tr1, tc0, tc1), _ in tiles_of(p)]
                            want = [t for h, (_, t) in zip(hit, tiles_of(p)) if h]
                            wanted_leaves.update(leaves + i for i, h in enumerate(hit) if h)
                            leaves += n
                            if not want:
                                continue
                            touched += 1
                            tiles += sum(t["delta"][1] for t in want)
                            part_a += ga
                            part_b += gb
                            subset += 0 if len(want) == n else n * DIGEST
                        if not touched:
                            continue
                        c_bytes += len(wanted_leaves) * ENTRY_B + DIGEST * proof_nodes(leaves, wanted_leaves)
                        # whole entries (checked against the manifest) or directory + parts
                        a_bytes += full_a if touched == len(parts) else min(full_a, len(parts) * DIGEST + part_a)
                        b_bytes += subset + (full_b if touched == len(parts) else min(full_b, len(parts) * DIGEST + part_b))
                    bound = max(8192, 0.02 * tiles)
                    key = (layout, M)
                    w = worst.setdefault(key, [0, 0, 0, 0, True, True, 0, True])
                    w[6] = max(w[6], c_bytes)
                    w[7] &= c_bytes <= bound
                    w[0] = max(w[0], before)
                    w[1] = max(w[1], a_bytes)
                    w[2] = max(w[2], b_bytes)
                    w[3] = max(w[3], tiles)
                    w[4] &= a_bytes <= bound
                    w[5] &= b_bytes <= bound
                    print("| %d | %s | %d | %d | %d | %d | %d | %s | %d | %s | %d | %s |" % (
                        man["version"], layout, M, m, before, tiles, a_bytes, "yes" if a_bytes <= bound else "no",
                        b_bytes, "yes" if b_bytes <= bound else "no", c_bytes, "yes" if c_bytes <= bound else "no"))
    print()
    print("| layout | M | tile bytes (max) | before: manifest-2 (max B) | A (max B) | A within bound | B (max B) | B within bound | C (max B) | C within bound |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for (layout, M), w in sorted(worst.items()):
        print("| %s | %d | %d | %d | %d | %s | %d | %s | %d | %s |" % (layout, M, w[3], w[0], w[1], "yes" if w[4] else "no", w[2],
                                                                   "yes" if w[5] else "no", w[6], "yes" if w[7] else "no"))


if __name__ == "__main__":
    main()
