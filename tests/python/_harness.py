"""Shared bits of the Python tests: import path, a tiny runner that prints
its own "LABEL: N passed, N failed, N skipped" line (tests/run.sh counts
it) and exits non-zero on failure, and a reference safetensors reader that
uses torch only (no ferry), to compare against.  The same test modules run
under pytest too (conftest.py): their cases are module-level test_*
functions without arguments, and Skip is pytest's skip there."""
import json
import os
import struct
import sys
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))


def _sanitized_reexec():
    """Under tests/run.sh the library of the build being tested is used
    ($FERRY_BUILD/libferry.so).  A SAN=1 build links ASan, whose runtime
    must be loaded first: re-run this script with it preloaded (leak checks
    off: CPython and torch keep allocations until exit by design)."""
    build = os.environ.get("FERRY_BUILD")
    if "FERRY_LIB" not in os.environ and build and os.path.exists(os.path.join(build, "libferry.so")):
        os.environ["FERRY_LIB"] = os.path.join(build, "libferry.so")
    if os.environ.get("SAN") != "1" or "libasan" in os.environ.get("LD_PRELOAD", ""):
        return
    import subprocess
    asan = subprocess.run(["cc", "-print-file-name=libasan.so"], capture_output=True,
                          text=True).stdout.strip()
    if not os.path.isabs(asan):
        return
    # libstdc++ too, so that ASan's __cxa_throw interceptor finds the real
    # one at start-up (python itself does not link it): without it the first
    # C++ exception thrown in a torch thread (gloo's store at shutdown)
    # aborts the process with "CHECK failed ... real___cxa_throw".
    import ctypes.util
    cxx = ctypes.util.find_library("stdc++")
    env = dict(os.environ, LD_PRELOAD=asan + (" " + cxx if cxx else ""),
               ASAN_OPTIONS="detect_leaks=0:" + os.environ.get("ASAN_OPTIONS", ""))
    sys.stdout.flush()
    os.execve(sys.executable, [sys.executable] + sys.argv, env)


_sanitized_reexec()
DATA = os.environ.get("FERRY_DATA") or os.path.join(ROOT, "..", "shared", "data")
if not os.path.isabs(DATA):
    DATA = os.path.join(ROOT, DATA)


if "pytest" in sys.modules:
    # Under pytest (tests/python/conftest.py) a Skip is pytest's own skip,
    # so a case skipped here is reported as skipped there, not failed.
    import pytest
    Skip = pytest.skip.Exception
else:
    class Skip(Exception):
        pass


def run(label, tests):
    passed = failed = skipped = 0
    for t in tests:
        t0 = time.time()
        try:
            t()
        except Skip as e:
            skipped += 1
            print("skip %s: %s" % (t.__name__, e))
            continue
        except Exception:
            failed += 1
            print("FAIL %s" % t.__name__)
            traceback.print_exc()
            continue
        passed += 1
        print("ok   %s (%.2fs)" % (t.__name__, time.time() - t0))
    print("%s: %d passed, %d failed, %d skipped" % (label, passed, failed, skipped))
    sys.stdout.flush()
    sys.exit(1 if failed else 0)


_TORCH_DT = {"BF16": "bfloat16", "F32": "float32", "F16": "float16", "F64": "float64",
             "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8",
             "U8": "uint8", "BOOL": "bool", "C64": "complex64"}


def torch_read_safetensors(path):
    """name -> torch tensor, parsed with json + torch.frombuffer only."""
    import torch
    with open(path, "rb") as f:
        blob = f.read()
    n = struct.unpack("<Q", blob[:8])[0]
    hdr = json.loads(blob[8:8 + n])
    hdr.pop("__metadata__", None)
    out = {}
    for name, e in hdr.items():
        if e["dtype"] not in _TORCH_DT:
            continue  # F8/F4/F6: no torch dtype to compare with
        b, end = e["data_offsets"]
        raw = bytearray(blob[8 + n + b:8 + n + end])
        dt = getattr(torch, _TORCH_DT[e["dtype"]])
        t = torch.frombuffer(raw, dtype=dt) if raw else torch.empty(0, dtype=dt)
        out[name] = t.reshape(e["shape"])
    return out


def bits(t):
    """Raw bits of a tensor or array as a comparable numpy array."""
    import numpy as np
    import torch
    if type(t).__name__ == "Raw":
        t = t.data
    if isinstance(t, torch.Tensor):
        if t.dtype == torch.bfloat16:
            t = t.view(torch.int16)
        return t.reshape(-1).numpy().view(np.uint8).copy()
    return np.ascontiguousarray(t).reshape(-1).view(np.uint8).copy()
