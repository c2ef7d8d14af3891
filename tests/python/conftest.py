"""pytest's view of the Python tests (`/usr/bin/python3 -m pytest
tests/python`); tests/run.sh runs each file directly instead, through
_harness.run, which is faster (one interpreter per file, no collection).
Both run the same module-level test_* functions, so the setup several
modules share is plain functions in _helpers.py, not pytest fixtures here.
The library tested is $FERRY_LIB, else $FERRY_BUILD/libferry.so, else the
tree's build/ (see _harness.py and python/ferry/_lib.py)."""
import os
import shutil
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _harness  # noqa: E402,F401  (sets the import path and FERRY_LIB first)


@pytest.fixture(autouse=True, scope="module")
def _module_tmp(request):
    """A module's TMP scratch directory (made at import) goes with its last
    case, as the direct runner's `finally` removes it."""
    yield
    tmp = getattr(request.module, "TMP", None)
    if tmp:
        shutil.rmtree(tmp, ignore_errors=True)
