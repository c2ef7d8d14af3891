#!/usr/bin/env python3
"""Generates the must-fail safetensors files of this directory and the seed
corpus of the safetensors fuzz target (python3, standard library only).

Each hostile file is named NN-description.ERRNAME.safetensors, where ERRNAME
is the FERRY_ERR_ suffix ferry_model_open must return for it
(tests/unit/test_safetensors.c checks every file).  The seed corpus
(tests/fuzz/corpus/safetensors) gets a few small valid files plus a copy of
every hostile one; its fuzz-*.safetensors files are inputs the fuzzer found,
kept by hand and left alone here.  Run from anywhere:

    python3 tests/golden-errors/safetensors/make.py
"""
import json
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", "..", ".."))
CORPUS = os.path.join(ROOT, "tests", "fuzz", "corpus", "safetensors")


def st(header, data=b"", pad=True):
    """A safetensors image: u64 length, header (str/bytes/dict), data."""
    if isinstance(header, dict):
        header = json.dumps(header, separators=(",", ":"))
    if isinstance(header, str):
        header = header.encode()
    if pad:
        header += b" " * (-len(header) % 8)
    return struct.pack("<Q", len(header)) + header + data


def t(dtype, shape, begin, end):
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


OK = t("F32", [2], 0, 8)  # a well-formed 8-byte tensor

HOSTILE = [
    ("empty-file", "ST_TRUNCATED", b""),
    ("short-length", "ST_TRUNCATED", b"\x08\x00\x00\x00\x00"),
    ("header-length-zero", "ST_HEADER_SIZE", struct.pack("<Q", 0) + b"{}"),
    ("header-length-huge", "ST_HEADER_SIZE", struct.pack("<Q", 1 << 63) + b"{}"),
    ("header-length-over-bound", "ST_HEADER_SIZE", struct.pack("<Q", 100_000_001) + b"{}"),
    ("header-past-eof", "ST_TRUNCATED", struct.pack("<Q", 100) + b'{"a":1}'),
    ("not-brace", "ST_JSON", st("[]")),
    ("leading-space", "ST_JSON", st(" {}")),
    ("bad-json", "ST_JSON", st('{"a":{"dtype":"F32",')),
    ("invalid-utf8", "ST_JSON", st(b'{"\xff\xfe":' + json.dumps(OK).encode() + b"}", b"\0" * 8)),
    ("garbage-after-object", "ST_JSON", st("{} x")),
    ("nul-in-header", "ST_JSON", st(b"{}\0\0\0\0\0\0", pad=False)),
    ("nul-escape-in-name", "ST_JSON", st('{"a\\u0000b":' + json.dumps(OK) + "}", b"\0" * 8)),
    ("entry-not-object", "ST_JSON", st('{"a":[1,2]}')),
    ("unknown-field", "ST_JSON", st({"a": dict(OK, extra=1)}, b"\0" * 8)),
    ("integer-too-big", "ST_JSON", st('{"a":{"dtype":"U8","shape":[18446744073709551616],"data_offsets":[0,0]}}')),
    ("deep-nesting", "ST_JSON", st('{"__metadata__":' + "[" * 5000 + "]" * 5000 + "}")),
    ("unknown-dtype", "ST_DTYPE", st({"a": t("F128", [1], 0, 16)}, b"\0" * 16)),
    ("lowercase-dtype", "ST_DTYPE", st({"a": t("bf16", [1], 0, 2)}, b"\0" * 2)),
    ("missing-dtype", "ST_DTYPE", st({"a": {"shape": [1], "data_offsets": [0, 1]}}, b"\0")),
    ("dtype-not-string", "ST_DTYPE", st({"a": t(16, [1], 0, 2)}, b"\0" * 2)),
    ("missing-shape", "ST_SHAPE", st({"a": {"dtype": "U8", "data_offsets": [0, 1]}}, b"\0")),
    ("shape-not-array", "ST_SHAPE", st({"a": t("U8", 1, 0, 1)}, b"\0")),
    ("shape-negative", "ST_SHAPE", st({"a": t("U8", [-1], 0, 1)}, b"\0")),
    ("shape-float", "ST_SHAPE", st({"a": t("U8", [1.0], 0, 1)}, b"\0")),
    ("shape-bool", "ST_SHAPE", st({"a": t("U8", [True], 0, 1)}, b"\0")),
    ("shape-overflow", "ST_SHAPE", st({"a": t("U8", [1 << 32, 1 << 32], 0, 0)})),
    ("shape-bits-overflow", "ST_SHAPE", st({"a": t("F64", [1 << 62], 0, 0)})),
    ("missing-offsets", "ST_OFFSETS", st({"a": {"dtype": "U8", "shape": [1]}}, b"\0")),
    ("offsets-three", "ST_OFFSETS", st({"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1, 2]}}, b"\0")),
    ("offsets-negative", "ST_OFFSETS", st({"a": t("U8", [1], -1, 0)}, b"\0")),
    ("offsets-reversed", "ST_OFFSETS", st({"a": t("U8", [0], 1, 0)}, b"\0")),
    ("offsets-not-from-zero", "ST_OFFSETS", st({"a": t("U8", [1], 1, 2)}, b"\0\0")),
    ("offsets-gap", "ST_OFFSETS", st({"a": t("U8", [1], 0, 1), "b": t("U8", [1], 2, 3)}, b"\0" * 3)),
    ("offsets-overlap", "ST_OFFSETS", st({"a": t("U8", [2], 0, 2), "b": t("U8", [2], 1, 3)}, b"\0" * 3)),
    ("offsets-past-end", "ST_TRUNCATED", st({"a": t("F32", [4], 0, 16)}, b"\0" * 8)),
    ("data-cut-short", "ST_TRUNCATED", st({"a": OK, "b": t("F32", [2], 8, 16)}, b"\0" * 16)[:-3]),
    ("size-mismatch", "ST_SIZE", st({"a": t("F32", [3], 0, 8)}, b"\0" * 8)),
    ("f4-odd-count", "ST_SIZE", st({"a": t("F4", [3], 0, 2)}, b"\0" * 2)),
    ("f6-partial-byte", "ST_SIZE", st({"a": t("F6_E2M3", [2], 0, 2)}, b"\0" * 2)),
    ("trailing-bytes", "ST_TRAILING", st({"a": OK}, b"\0" * 9)),
    ("empty-with-trailing", "ST_TRAILING", st("{}", b"\0")),
    ("metadata-not-object", "ST_METADATA", st('{"__metadata__":"pt"}')),
    ("metadata-int-value", "ST_METADATA", st('{"__metadata__":{"format":"pt","step":3}}')),
    ("metadata-null", "ST_METADATA", st('{"__metadata__":null}')),
    ("duplicate-name", "ST_DUPLICATE", st('{"a":' + json.dumps(OK) + ',"a":' + json.dumps(OK) + "}", b"\0" * 8)),
    ("duplicate-field", "ST_DUPLICATE", st('{"a":{"dtype":"U8","dtype":"U8","shape":[1],"data_offsets":[0,1]}}', b"\0")),
    ("too-many-dims", "UNSUPPORTED", st({"a": t("U8", [1] * 33, 0, 1)}, b"\0")),
    ("empty-name", "UNSUPPORTED", st({"": t("U8", [1], 0, 1)}, b"\0")),
]

VALID = [
    ("empty", st("{}")),
    ("metadata-only", st({"__metadata__": {"format": "pt"}})),
    ("scalar-and-empty", st({"s": t("F32", [], 0, 4), "z": t("BF16", [0, 3], 4, 4)}, b"\0\0\x80\x3f")),
    ("mixed-dtypes", st({
        "__metadata__": {"format": "pt", "step": "7"},
        "w.bf16": t("BF16", [2, 2], 0, 8),
        "w.f4": t("F4", [4], 8, 10),
        "w.f6": t("F6_E3M2", [4], 10, 13),
        "w.f8": t("F8_E4M3", [3], 13, 16),
        "w.i64": t("I64", [1], 16, 24),
    }, bytes(range(24)))),
    ("unsorted-offsets", st({"b": t("U8", [2], 2, 4), "a": t("U8", [2], 0, 2)}, b"abcd")),
]


def write(path, data):
    with open(path, "wb") as f:
        f.write(data)


def clean(directory, keep):
    for name in os.listdir(directory):
        if name.endswith(".safetensors") and keep(name):
            os.unlink(os.path.join(directory, name))


def main():
    os.makedirs(CORPUS, exist_ok=True)
    clean(HERE, lambda n: True)
    clean(CORPUS, lambda n: n.startswith(("err-", "valid-")))
    for i, (desc, err, data) in enumerate(HOSTILE):
        name = "%02d-%s.%s.safetensors" % (i, desc, err)
        write(os.path.join(HERE, name), data)
        write(os.path.join(CORPUS, "err-" + name), data)
    for desc, data in VALID:
        write(os.path.join(CORPUS, "valid-%s.safetensors" % desc), data)
    print("%d hostile files, %d valid seeds" % (len(HOSTILE), len(VALID)))


if __name__ == "__main__":
    main()
