"""README.md as a first-time user reads it (issue 27 item 5): every
```python block runs as written, in order, in one fresh directory (the
trainer's block publishes, the worker's block follows), on a directory
store and, when s3rver is installed (tests/npm), on the local S3 server
the README's set-up starts, with the environment it exports; a block whose
first line is "# sketch" is a fragment and is only compiled.  Also what the
README promises around them: both publishers' last_info have the same keys,
the ImportError without a library says how to fix it, and `make install`
installs ferry-shard-mpi whenever it is built (MPI present)."""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

from _harness import ROOT, Skip, run

import ferry

TMP = tempfile.mkdtemp(prefix="ferry-pyreadme-")
PY = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable


def blocks():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        text = f.read()
    out = re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)
    assert len(out) >= 3, "README.md has %d python blocks" % len(out)
    return out


def _env(**extra):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.join(ROOT, "python")
    env.update(extra)
    return env


def _run_blocks(where, env, store=None):
    os.makedirs(where)
    outs = []
    for i, code in enumerate(blocks()):
        if code.startswith("# sketch"):
            compile(code, "README.md block %d" % i, "exec")
            continue
        if store is not None:
            assert 'STORE = "policies"' in code, code
            code = code.replace('STORE = "policies"', 'STORE = "%s"' % store)
        path = os.path.join(where, "block%d.py" % i)
        with open(path, "w") as f:
            f.write(code)
        r = subprocess.run([PY, path], cwd=where, env=env, capture_output=True, text=True,
                           timeout=300)
        assert r.returncode == 0, "README block %d:\n%s\n%s%s" % (i, code, r.stdout, r.stderr)
        outs.append(r.stdout)
    trainer, worker = outs[0], outs[1]
    assert trainer.split("\n")[0].startswith("1 anchor"), trainer
    assert trainer.split("\n")[4].startswith("5 delta"), trainer
    assert "engine at version 5" in worker, worker


def test_python_blocks_run_on_a_directory():
    if not hasattr(ferry, "Publisher"):
        raise Skip("this libferry has no sync layer")
    _run_blocks(os.path.join(TMP, "dir"), _env())


def test_python_blocks_run_on_local_s3():
    if not hasattr(ferry, "Publisher"):
        raise Skip("this libferry has no sync layer")
    js = os.environ.get("S3RVER_JS") or os.path.join(ROOT, "tests", "npm", "node_modules",
                                                     "s3rver", "bin", "s3rver.js")
    if not os.path.exists(js) or not shutil.which("node"):
        raise Skip("s3rver is not installed (scripts/install-deps.sh runs npm install in tests/npm)")
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    data = os.path.join(TMP, "s3")
    os.makedirs(data)
    major = subprocess.run(["node", "-p", "process.versions.node.split('.')[0]"],
                           capture_output=True, text=True).stdout.strip()
    legacy = ["--openssl-legacy-provider"] if major.isdigit() and int(major) >= 17 else []
    log = open(os.path.join(TMP, "s3rver.log"), "w")
    srv = subprocess.Popen(["node"] + legacy + [js, "-d", data, "-a", "127.0.0.1", "-p", str(port),
                                                "--configure-bucket", "bkt"],
                           stdout=log, stderr=subprocess.STDOUT)
    try:
        for _ in range(150):
            with open(os.path.join(TMP, "s3rver.log")) as f:
                if "S3rver listening" in f.read():
                    break
            time.sleep(0.1)
        else:
            raise AssertionError("s3rver did not start")
        env = _env(AWS_ENDPOINT_URL="http://127.0.0.1:%d" % port, AWS_ACCESS_KEY_ID="S3RVER",
                   AWS_SECRET_ACCESS_KEY="S3RVER", AWS_REGION="us-east-1")
        env.pop("AWS_ENDPOINT_URL_S3", None)
        _run_blocks(os.path.join(TMP, "s3leg"), env, store="s3://bkt/policies")
    finally:
        srv.terminate()
        srv.wait()
        log.close()


def test_last_info_same_keys():
    """Publisher.last_info and ShardPublisher.last_info: the schema the
    README documents (ferry.sync.PUBLISH_INFO_KEYS)."""
    if not hasattr(ferry, "Publisher") or not hasattr(ferry, "shard"):
        raise Skip("this libferry has no sync or shard layer")
    import numpy as np
    from ferry.sync import PUBLISH_INFO_KEYS
    w = {"a": np.arange(64, dtype=np.float32).reshape(8, 8), "b": np.ones(8, np.float32)}
    pub = ferry.Publisher(os.path.join(TMP, "info"), "run")
    pub.publish(w)
    one = pub.last_info
    pub.close()
    sp = ferry.shard.ShardPublisher(os.path.join(TMP, "info"), "sharded", rank=0, world=1)
    tok = sp.begin()
    rec = sp.put(tok, ferry.shard.dim0_parts(w, 0, 1))
    two = sp.commit(tok, [rec])
    sp.finish(True)
    sp.close()
    assert tuple(one) == PUBLISH_INFO_KEYS and tuple(two) == PUBLISH_INFO_KEYS, (one, two)
    assert one["version"] == two["version"] == 1 and one["kind"] == two["kind"] == "anchor"
    assert one["world"] == two["world"] == 1 and one["full_bytes"] > 0 and two["full_bytes"] > 0
    assert one["anchor_bytes"] == one["full_bytes"] and two["anchor_bytes"] == two["full_bytes"]
    assert one["parts"] is None and two["parts"] == 2, (one, two)
    for d in (one, two):
        assert len(d["model_hash"]) == 16 and len(d["id"]) == 16 and d["seconds"] >= 0, d


def test_import_error_says_how():
    """No $FERRY_LIB, no build/ beside the package, nothing installed."""
    pkg = os.path.join(TMP, "pkg")
    shutil.copytree(os.path.join(ROOT, "python", "ferry"), os.path.join(pkg, "ferry"),
                    ignore=shutil.ignore_patterns("__pycache__"))
    keep = ("PATH", "HOME", "LANG", "TMPDIR", "LD_PRELOAD", "ASAN_OPTIONS")
    env = {k: v for k, v in os.environ.items() if k in keep}
    env["PYTHONPATH"] = pkg
    r = subprocess.run([PY, "-c", "import ferry"], cwd=TMP, env=env, capture_output=True,
                       text=True, timeout=120)
    if r.returncode == 0:
        raise Skip("a libferry is installed system-wide; the negative case cannot be checked")
    msg = r.stderr.strip().split("\n")[-1]
    for want in ("ImportError", "libferry.so not found", "To fix", "`make`", "$FERRY_LIB",
                 "PKG_CONFIG_PATH=P/lib/pkgconfig", "make install PREFIX=P"):
        assert want in msg, (want, msg)
    env["FERRY_LIB"] = os.path.join(TMP, "nowhere", "libferry.so")
    r = subprocess.run([PY, "-c", "import ferry"], cwd=TMP, env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode != 0 and "$FERRY_LIB is set" in r.stderr and "nowhere" in r.stderr, r.stderr


def test_install_lists_every_program():
    """`make install` names ferry, and ferry-shard-mpi whenever mpicc is
    there (dry run: nothing built or written)."""
    if not shutil.which("make"):
        raise Skip("no make")
    build = os.environ.get("FERRY_BUILD") or os.path.join(ROOT, "build")
    r = subprocess.run(["make", "-n", "-C", ROOT, "install", "PREFIX=" + os.path.join(TMP, "p"),
                        "BUILD=" + os.path.relpath(build, ROOT)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    line = [x for x in r.stdout.split("\n") if x.startswith("install -m 755") and "/bin/" in x]
    assert line, r.stdout
    assert "/ferry " in line[0]
    if shutil.which("mpicc"):
        assert "ferry-shard-mpi" in line[0], line
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        assert "`ferry-shard-mpi` when `mpicc` is installed" in f.read()


if __name__ == "__main__":
    try:
        run("readme", [test_python_blocks_run_on_a_directory, test_python_blocks_run_on_local_s3,
                       test_last_info_same_keys, test_import_error_says_how,
                       test_install_lists_every_program])
    finally:
        shutil.rmtree(TMP, ignore_errors=True)
