"""The package installs the way Python users expect: `make install
PREFIX=P` puts libferry and libferry.pc under P, `pip install` of python/
(pyproject.toml, setuptools, offline: --no-build-isolation --no-deps)
puts the package in a target directory, and a clean process that knows
only PYTHONPATH and PKG_CONFIG_PATH imports ferry, finds P's libferry
through pkg-config, and uses it."""
import os
import re
import shutil
import subprocess
import sys
import tempfile

from _harness import ROOT, Skip, run

TMP = tempfile.mkdtemp(prefix="ferry-pyinst-")

USE = r"""
import os, sys, numpy as np, ferry
print(ferry.library_path)
a = {"w": np.arange(4096, dtype=np.float32), "meta": np.ones(3, np.int32)}
b = {"w": a["w"].copy(), "meta": a["meta"]}
b["w"][::97] += 1
patch = ferry.diff(a, b)
got = ferry.apply(a, patch)
assert np.array_equal(got["w"], b["w"]) and ferry.model_hash(got) == ferry.model_hash(b)
print("version", ferry.__version__)
"""


def _clean_env(**extra):
    keep = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "LD_PRELOAD", "ASAN_OPTIONS",
            "UBSAN_OPTIONS")
    env = {k: v for k, v in os.environ.items() if k in keep}
    env.update(extra)
    return env


def test_pip_install_finds_library_through_pkg_config():
    for tool in ("make", "pkg-config"):
        if not shutil.which(tool):
            raise Skip("no %s" % tool)
    import importlib.util
    missing = [m for m in ("pip", "setuptools", "wheel") if importlib.util.find_spec(m) is None]
    if missing:
        raise Skip("%s missing (scripts/install-deps.sh installs them)" % ", ".join(missing))
    build = os.environ.get("FERRY_BUILD") or os.path.join(ROOT, "build")
    prefix, target = os.path.join(TMP, "prefix"), os.path.join(TMP, "site")
    # The library: installed from the build under test (no rebuild: its
    # objects are up to date; SAN builds keep their flags).
    subprocess.run(["make", "-s", "-C", ROOT, "install", "PREFIX=" + prefix,
                    "BUILD=" + os.path.relpath(build, ROOT)] +
                   (["SAN=1"] if os.environ.get("SAN") == "1" else []),
                   check=True, stdout=subprocess.DEVNULL)
    assert os.path.exists(os.path.join(prefix, "lib", "pkgconfig", "libferry.pc"))
    # The package: from a copy of python/, so that the build leaves nothing
    # in the source tree.
    src = os.path.join(TMP, "src")
    shutil.copytree(os.path.join(ROOT, "python"), src,
                    ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info"))
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--no-build-isolation",
                        "--no-deps", "--no-index", "--disable-pip-version-check",
                        "--target", target, src],
                       capture_output=True, text=True, env=_clean_env())
    assert r.returncode == 0, r.stdout + r.stderr
    assert os.path.exists(os.path.join(target, "ferry", "_lib.py"))
    with open(os.path.join(ROOT, "include", "ferry.h")) as f:
        want = re.search(r'FERRY_VERSION_STRING "([^"]+)"', f.read()).group(1)
    # pyproject.toml's version follows the library's.
    assert "ferry-%s.dist-info" % want in os.listdir(target), (want, os.listdir(target))
    # A clean process, elsewhere: no $FERRY_LIB, no source tree, no loader path.
    pc = os.path.join(prefix, "lib", "pkgconfig")
    r = subprocess.run([sys.executable, "-c", USE], capture_output=True, text=True, cwd=TMP,
                       env=_clean_env(PYTHONPATH=target, PKG_CONFIG_PATH=pc))
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.split("\n")
    assert lines[0].startswith(os.path.join(prefix, "lib") + os.sep), lines
    assert "version " + want in lines, lines
    # Without PKG_CONFIG_PATH it is not found, and the message says how.
    r = subprocess.run([sys.executable, "-c", "import ferry"], capture_output=True, text=True,
                       cwd=TMP, env=_clean_env(PYTHONPATH=target))
    if r.returncode == 0:
        raise Skip("a libferry is installed system-wide; the negative case cannot be checked")
    assert "libferry.so not found" in r.stderr and "make install" in r.stderr, r.stderr


if __name__ == "__main__":
    try:
        run("install", [test_pip_install_finds_library_through_pkg_config])
    finally:
        shutil.rmtree(TMP, ignore_errors=True)
