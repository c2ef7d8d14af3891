#!/usr/bin/env python3
"""Generates the must-fail records of the sync layer and the seed corpora of
their fuzz targets (python3, standard library only).

The records are the JSON objects anyone with write access to the bucket can
replace: HEAD, version manifests and the compaction index
(docs/PROTOCOL.md).  Each hostile record is written to
tests/golden-errors/{head,manifest,compactions}/NN-description.ERRNAME.json,
where ERRNAME is the FERRY_ERR_ suffix the parser must return for it
(tests/unit/test_records.c parses each one for run "r" with the key the
file's kind gives: r/HEAD, r/v/manifest.json, r/compactions.json).  The
seed corpora tests/fuzz/corpus/{head,manifest,compactions} get the valid
records plus a copy of every hostile one; their fuzz-* files are inputs the
fuzzer found, kept by hand and left alone here.  Run from anywhere:

    python3 tests/golden-errors/records/make.py
"""
import copy
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", "..", ".."))
RUN = "r"
ID = ["0123456789abcdef", "fedcba9876543210", "00000000000000aa", "1111111111111111"]
HASH = ["0" * 31 + "1", "a" * 32, "0123456789abcdef" * 2]
RUN_ID = "a4ef1295ba8f6d8e"  # docs/PROTOCOL.md "Run identity"; absent in records before run ids
VMAX = (1 << 63) - 2  # FS_VERSION_MAX


def vkey(v, i, ext):
    return "%s/v/%020d-%s%s" % (RUN, v, i, ext)


def ckey(f, t, i):
    return "%s/c/%020d-%020d-%s.patch" % (RUN, f, t, i)


def head(v=3, i=ID[2], kind="delta"):
    return {"format": "ferry-head-1", "run": RUN, "version": v, "id": i, "kind": kind,
            "manifest": vkey(v, i, ".json"), "model_hash": HASH[1], "publisher": "trainer-0",
            "time_unix": 1795965145, "time": "2026-11-29T15:12:25Z"}


def manifest(v, ids=ID, kind=None, anchor_v=1):
    """Version v of a lineage whose version k has id ids[k - 1]; anchors at
    anchor_v (and version 1)."""
    kind = kind or ("anchor" if v == anchor_v or v == 1 else "delta")
    a = v if kind == "anchor" else anchor_v
    cum = 100 * (v - 1)
    m = {"format": "ferry-manifest-1", "run": RUN, "version": v, "id": ids[v - 1], "kind": kind,
         "prev": None if v == 1 else {"version": v - 1, "id": ids[v - 2]},
         "anchor": {"version": a, "id": ids[a - 1], "bytes": 5000, "delta_bytes_cum": 100 * (a - 1)},
         "prev_anchor": None,
         "full": {"key": vkey(v, ids[v - 1], ".safetensors"), "bytes": 5000} if kind == "anchor" else None,
         "delta": None if v == 1 else {"key": vkey(v, ids[v - 1], ".patch"), "bytes": 100,
                                       "base_version": v - 1, "base_id": ids[v - 2], "base_hash": HASH[0]},
         "model_hash": HASH[1], "model_bytes": 4096, "tensors": 3, "delta_bytes_cum": cum,
         "created_unix": 1795965145, "created": "2026-11-29T15:12:25Z", "publisher": "trainer-0",
         "anchor_every": 4}
    if kind == "anchor" and a > 1:
        m["prev_anchor"] = {"version": 1, "id": ids[0], "bytes": 5000, "delta_bytes_cum": 0}
    return m


def compaction(f=1, t=3, i=ID[3]):
    return {"from": f, "from_id": ID[0], "to": t, "to_id": ID[2], "id": i, "key": ckey(f, t, i), "bytes": 150,
            "base_hash": HASH[0], "target_hash": HASH[1], "from_delta_bytes_cum": 0,
            "to_delta_bytes_cum": 200, "from_full_bytes": 5000, "created_unix": 1795965145, "chain_bytes": 200}


def index(*entries):
    return {"format": "ferry-compactions-1", "run": RUN, "compactions": list(entries)}


def edit(obj, path, value):
    """A deep copy of obj with obj[path...] = value (value DELETE removes it)."""
    o = copy.deepcopy(obj)
    cur = o
    for k in path[:-1]:
        cur = cur[k]
    if value is DELETE:
        del cur[path[-1]]
    else:
        cur[path[-1]] = value
    return o


DELETE = object()


def text(obj):
    return obj if isinstance(obj, bytes) else json.dumps(obj, indent=1).encode()


BIG_V = {"version": VMAX + 1}
HEAD_VALID = [head(), head(1, ID[0], "anchor"), head(VMAX, ID[1]), edit(head(), ["run_id"], RUN_ID)]
HEAD_BAD = [
    ("empty", b""),
    ("not-json", b"HEAD"),
    ("not-an-object", b"[1,2]"),
    ("wrong-format", edit(head(), ["format"], "ferry-head-2")),
    ("other-run", edit(head(), ["run"], "q")),
    ("version-zero", edit(head(0), ["manifest"], vkey(0, ID[2], ".json"))),
    ("version-negative", edit(head(), ["version"], -3)),
    ("version-2-63-minus-1", head((1 << 63) - 1, ID[1])),
    ("version-2-64", b'{"format":"ferry-head-1","run":"r","version":18446744073709551616}'),
    ("version-float", edit(head(), ["version"], 3.0)),
    ("version-string", edit(head(), ["version"], "3")),
    ("id-short", edit(head(), ["id"], "0123")),
    ("id-uppercase", edit(head(), ["id"], "0123456789ABCDEF")),
    ("kind-unknown", edit(head(), ["kind"], "full")),
    ("manifest-key-of-another-version", edit(head(), ["manifest"], vkey(4, ID[2], ".json"))),
    ("model-hash-short", edit(head(), ["model_hash"], "abc")),
    ("publisher-empty", edit(head(), ["publisher"], "")),
    ("publisher-control-char", edit(head(), ["publisher"], "a\nb")),
    ("publisher-too-long", edit(head(), ["publisher"], "p" * 128)),
    ("time-negative", edit(head(), ["time_unix"], -1)),
    ("missing-id", edit(head(), ["id"], DELETE)),
    ("duplicate-field", b'{"format":"ferry-head-1","format":"ferry-head-1"}'),
    ("nul-in-text", b'{"format":"ferry-head-1"\0}'),
    ("run-id-short", edit(head(), ["run_id"], "a4ef")),
    ("run-id-uppercase", edit(head(), ["run_id"], RUN_ID.upper())),
    ("run-id-not-a-string", edit(head(), ["run_id"], 7)),
    ("run-id-null", edit(head(), ["run_id"], None)),
]

MANIFEST_VALID = [manifest(1), manifest(2), manifest(3), manifest(3, kind="anchor"), manifest(4, anchor_v=3),
                  edit(manifest(3), ["run_id"], RUN_ID)]
M3 = manifest(3)
MANIFEST_BAD = [
    ("empty", b""),
    ("wrong-format", edit(M3, ["format"], "ferry-head-1")),
    ("other-run", edit(M3, ["run"], "q")),
    ("version-negative", edit(M3, ["version"], -3)),
    ("version-2-63-minus-1", edit(edit(M3, ["version"], (1 << 63) - 1), ["prev", "version"], (1 << 63) - 2)),
    ("prev-not-version-minus-1", edit(M3, ["prev", "version"], 1)),
    ("prev-version-zero", edit(M3, ["prev", "version"], 0)),
    ("version-1-with-prev", edit(manifest(1), ["prev"], {"version": 1, "id": ID[0]})),
    ("version-1-a-delta", edit(edit(manifest(1), ["kind"], "delta"), ["full"], None)),
    ("anchor-above-version", edit(M3, ["anchor", "version"], 4)),
    ("anchor-missing", edit(M3, ["anchor"], None)),
    ("delta-names-itself-anchor", edit(M3, ["anchor", "version"], 3)),
    ("anchor-link-not-itself", edit(manifest(3, kind="anchor"), ["anchor", "bytes"], 4999)),
    ("prev-anchor-not-below", edit(M3, ["prev_anchor"], {"version": 1, "id": ID[0], "bytes": 1, "delta_bytes_cum": 0})),
    ("cum-decreases", edit(M3, ["anchor", "delta_bytes_cum"], 10 ** 6)),
    ("full-on-a-delta", edit(M3, ["full"], {"key": vkey(3, ID[2], ".safetensors"), "bytes": 1})),
    ("anchor-without-full", edit(manifest(3, kind="anchor"), ["full"], None)),
    ("full-key-of-another-version", edit(manifest(3, kind="anchor"), ["full", "key"], vkey(2, ID[2], ".safetensors"))),
    ("delta-missing", edit(M3, ["delta"], None)),
    ("delta-key-of-another-version", edit(M3, ["delta", "key"], vkey(2, ID[1], ".patch"))),
    ("delta-base-not-prev", edit(M3, ["delta", "base_version"], 1)),
    ("delta-bytes-negative", edit(M3, ["delta", "bytes"], -1)),
    ("delta-bytes-2-64", json.dumps(M3).replace('"bytes": 100', '"bytes": 18446744073709551616').encode()),
    ("model-bytes-negative", edit(M3, ["model_bytes"], -4096)),
    ("model-hash-not-hex", edit(M3, ["model_hash"], "g" * 32)),
    ("link-not-an-object", edit(M3, ["prev"], [2, ID[1]])),
    ("run-id-not-hex", edit(M3, ["run_id"], "zzzzzzzzzzzzzzzz")),
    ("run-id-too-long", edit(M3, ["run_id"], RUN_ID + "0")),
]

IX_VALID = [index(), index(compaction()), index(compaction(), compaction(2, 4, ID[0])),
            edit(index(compaction()), ["run_id"], RUN_ID)]
IX_BAD = [
    ("empty", b""),
    ("wrong-format", edit(index(), ["format"], "ferry-compactions-0")),
    ("other-run", edit(index(), ["run"], "q")),
    ("not-an-array", edit(index(), ["compactions"], {})),
    ("entry-not-an-object", index(3)),
    ("range-empty", index(compaction(3, 3))),
    ("range-reversed", index(compaction(3, 1))),
    ("from-zero", index(compaction(0, 3))),
    ("to-2-63-minus-1", index(compaction(1, (1 << 63) - 1))),
    ("to-negative", index(edit(compaction(), ["to"], -1))),
    ("cum-reversed", index(edit(compaction(), ["from_delta_bytes_cum"], 300))),
    ("key-of-another-range", index(edit(compaction(), ["key"], ckey(1, 4, ID[3])))),
    ("bytes-missing", index(edit(compaction(), ["bytes"], DELETE))),
    ("id-not-hex", index(edit(compaction(), ["id"], "zzzzzzzzzzzzzzzz"))),
    ("second-entry-bad", index(compaction(), edit(compaction(2, 4, ID[0]), ["target_hash"], 7))),
    ("run-id-empty", edit(index(compaction()), ["run_id"], "")),
]

KINDS = [("head", HEAD_VALID, HEAD_BAD), ("manifest", MANIFEST_VALID, MANIFEST_BAD),
         ("compactions", IX_VALID, IX_BAD)]


def clean(d, keep):
    os.makedirs(d, exist_ok=True)
    for n in os.listdir(d):
        if not keep(n):
            os.remove(os.path.join(d, n))


def main():
    for kind, valid, bad in KINDS:
        errs = os.path.join(ROOT, "tests", "golden-errors", kind)
        corpus = os.path.join(ROOT, "tests", "fuzz", "corpus", kind)
        clean(errs, lambda n: False)
        clean(corpus, lambda n: n.startswith("fuzz-"))
        for i, (name, obj) in enumerate(bad):
            fname = "%02d-%s.SYNC_MANIFEST.json" % (i, name)
            for d in (errs, corpus):
                with open(os.path.join(d, fname), "wb") as f:
                    f.write(text(obj))
        for i, obj in enumerate(valid):
            with open(os.path.join(corpus, "valid-%02d.json" % i), "wb") as f:
                f.write(text(obj))
        print("%s: %d must-fail, %d valid" % (kind, len(bad), len(valid)))


if __name__ == "__main__":
    main()
