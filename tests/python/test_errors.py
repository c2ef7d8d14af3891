"""python/ferry/errors.py against include/ferry_errors.h, the one list of
codes in C: every code of the list has its ERR_* constant with the same
number (and errors.py none the list lacks), the loaded library's
ferry_strerror() returns the list's message, each code raises the exception
class of the area the list's range map gives it, and failures of real calls
(no mocks) arrive as those classes."""
import os
import pickle
import re
import shutil
import tempfile

from _harness import ROOT, run
from _helpers import raises as _raises

import numpy as np

import ferry
from ferry import errors

HEADER = os.path.join(ROOT, "include", "ferry_errors.h")
TMP = tempfile.mkdtemp(prefix="ferry-pyerrors-")

# The range map's area words (the header's comment) -> the Python class.
AREA_CLASS = {"core": ferry.FerryError, "safetensors": ferry.FormatError,
              "patch": ferry.PatchError, "store": ferry.StoreError, "sync": ferry.SyncError,
              "dock": ferry.DockError, "loco": ferry.LocoError,
              "signatures": ferry.SignatureError, "sharding": ferry.ShardError}


def read_list():
    """[(name, number, message)] of the list, in its order."""
    with open(HEADER) as f:
        text = f.read()
    entries = [(n, int(v), m) for n, v, m in
               re.findall(r'^\s*X\((FERRY_ERR_\w+), (\d+), "((?:[^"\\]|\\.)*)"\)(?: \\)?$', text, re.M)]
    # Every X( line must parse: a line in another shape would otherwise be
    # skipped here and its code left untested.
    assert len(entries) == len(re.findall(r"^\s*X\(", text, re.M)), "an X(...) line does not parse"
    assert len(entries) >= 88, len(entries)
    return entries


def read_ranges():
    """[(first, last, area word)] of the header's range map."""
    with open(HEADER) as f:
        text = f.read()
    ranges = [(int(a), int(b), w) for a, b, w in
              re.findall(r"^ \*\s+(\d+)\.\.(\d+)\s+(\w+)", text, re.M)]
    assert len(ranges) == len(AREA_CLASS), ranges
    return ranges


def test_every_code_has_its_constant():
    listed = read_list()
    for name, num, _ in listed:
        py = name[len("FERRY_"):]
        assert hasattr(errors, py), "%s (%d) has no errors.%s" % (name, num, py)
        assert getattr(errors, py) == num, (name, num, getattr(errors, py))
        assert errors.CODES[py] == num
    names = {n[len("FERRY_"):] for n, _, _ in listed}
    extra = set(errors.CODES) - names
    assert not extra, "errors.py has codes the list lacks: %s" % sorted(extra)
    assert len(errors.CODES) == len(listed) and errors.OK == 0


def test_strerror_matches_list():
    for name, num, msg in read_list():
        assert ferry.strerror(num) == msg, (name, num, ferry.strerror(num), msg)
    assert ferry.strerror(0) == "ok"
    # The number after each run of codes (a gap inside an area or the end
    # of one), derived from the list so that a code added there never
    # turns a probe into a listed code.
    listed = {num for _, num, _ in read_list()}
    gaps = {num + 1 for num in listed if num + 1 not in listed}
    assert len(gaps) >= 9, sorted(gaps)
    for n in sorted(gaps) + [-1, -60, 10 ** 6, 2 ** 31 - 1]:
        assert ferry.strerror(n) == "unknown error", n


def test_area_classes_follow_range_map():
    ranges = read_ranges()
    for first, last, word in ranges:
        assert word in AREA_CLASS, word
        for n in range(first, last + 1):
            assert errors.error_class(n) is AREA_CLASS[word], (n, word, errors.error_class(n))
    for name, num, _ in read_list():
        holders = [w for a, b, w in ranges if a <= num <= b]
        assert len(holders) == 1, (name, num, holders)
        cls = AREA_CLASS[holders[0]]
        e = ferry.FerryError(num, "detail")
        assert type(e) is cls, (name, num, type(e))
        assert isinstance(e, ferry.FerryError) and e.code == num and e.message == "detail"
        assert e.name == ferry.strerror(num) and "detail" in str(e)
    # Outside every range (and FERRY_OK): the base class.
    for n in (0, 180, 999, -5):
        assert type(ferry.FerryError(n)) is ferry.FerryError
    # A subclass named directly stays that class.
    assert type(ferry.SyncError(errors.ERR_ARG)) is ferry.SyncError


def test_pickle_keeps_class_and_fields():
    e = ferry.FerryError(errors.ERR_STORE_NOT_FOUND, "store file:///x: key 'a': absent")
    back = pickle.loads(pickle.dumps(e))
    assert type(back) is ferry.StoreError
    assert (back.code, back.message, back.name, str(back)) == (e.code, e.message, e.name, str(e))


def test_library_failures_raise_area_classes():
    base = np.zeros((2, 3), np.float32)
    e = _raises(ferry.FerryError, ferry.model_hash, {"": base})
    assert type(e) is ferry.FerryError and e.code == errors.ERR_ARG
    junk = os.path.join(TMP, "junk.safetensors")
    with open(junk, "wb") as f:
        f.write(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}      ")
    e = _raises(ferry.FormatError, ferry.load, junk)
    assert e.code == errors.ERR_ST_JSON, e
    e = _raises(ferry.PatchError, ferry.apply, {"x": base}, b"not a patch at all, really")
    assert e.code in (errors.ERR_PATCH_MAGIC, errors.ERR_PATCH_TRUNCATED), e
    if hasattr(ferry, "Store"):
        e = _raises(ferry.StoreError, ferry.Store, "file://" + os.path.join(TMP, "no-such-root"))
        assert e.code == errors.ERR_STORE_NOT_FOUND, e
        store = "file://" + os.path.join(TMP, "store")
        ferry.Store(store, create=True)
        sub = ferry.Subscriber(store, "run-e")
        e = _raises(ferry.SyncError, sub.sync_into, {"x": base})
        assert e.code == errors.ERR_SYNC_NOT_YET, e
        sub.close()
    if hasattr(ferry, "Keys"):
        e = _raises(ferry.SignatureError, ferry.Keys, trust=[os.path.join(TMP, "missing.pub")])
        assert e.code == errors.ERR_SIG_KEY, e


def test_exported():
    for name in ("FerryError", "FormatError", "PatchError", "StoreError", "SyncError",
                 "DockError", "LocoError", "SignatureError", "ShardError", "errors"):
        assert name in ferry.__all__ and hasattr(ferry, name), name


if __name__ == "__main__":
    try:
        run("test_errors", [test_every_code_has_its_constant, test_strerror_matches_list,
                            test_area_classes_follow_range_map, test_pickle_keeps_class_and_fields,
                            test_library_failures_raise_area_classes, test_exported])
    finally:
        shutil.rmtree(TMP, ignore_errors=True)
