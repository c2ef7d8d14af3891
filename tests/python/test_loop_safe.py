"""Failures that would break a training loop, from Python (issue 27 item
4): a store URL that lost its '//' is refused (StoreError ERR_STORE_URL
naming it) and no local directory appears; a private key given to
Keys(trust=...) warns, a public one does not; wait(timeout_s) with the
store down returns in about timeout_s (an s3:// store on a closed port of
127.0.0.1); an engine started before the trainer waits for the store and
the run (create=True); after a refused version the Subscriber's version
and stats describe what the tensors hold and wait() waits for a newer
version; structure mismatches name both sides and the missing and extra
tensors; a resumed Publisher refuses a freshly initialized model unless
told it is a new lineage."""
import os
import tempfile
import threading
import time
import warnings

from _harness import Skip, run
from _helpers import free_port, need_sync_torch as _need_sync

import ferry

TMP = tempfile.mkdtemp(prefix="ferry-pyloop-")


def test_scheme_like_paths_refused():
    if not hasattr(ferry, "Publisher"):
        raise Skip("this libferry has no sync layer")
    here = os.getcwd()
    os.chdir(TMP)
    try:
        for url in ("s3:/bkt/typo", "http:/x", "file:/x"):
            try:
                ferry.Publisher(url, "run")
            except ferry.StoreError as e:
                assert e.code == ferry.errors.ERR_STORE_URL and url in e.message, e
            else:
                raise AssertionError("%s accepted" % url)
        assert os.listdir(TMP) == [], os.listdir(TMP)
    finally:
        os.chdir(here)


def test_private_key_as_trusted_warns():
    if not hasattr(ferry, "Keys"):
        raise Skip("this libferry has no signing layer")
    ferry.keygen(os.path.join(TMP, "k"))
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        ferry.Keys(trust=[os.path.join(TMP, "k.key")]).close()
    assert len(w) == 1 and "PRIVATE key" in str(w[0].message) and "k.key" in str(w[0].message), w
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        ferry.Keys(trust=[os.path.join(TMP, "k.pub")]).close()
    assert not w, [str(x.message) for x in w]


def _model(seed, n=64):
    import torch
    g = torch.Generator().manual_seed(seed)
    return {"emb": torch.randn(n, 16, generator=g), "w": torch.randn(n, n, generator=g),
            "norm": torch.ones(16)}


def test_wait_honours_timeout_with_store_down():
    """Before: each HEAD read retried up to the store's deadline (300 s)."""
    _need_sync()
    endpoint = "http://127.0.0.1:%d" % free_port()     # nothing listens there now
    creds = dict(endpoint=endpoint, access_key="k", secret_key="s", region="us-east-1")
    st = ferry.Store("s3://bkt/policy", **creds)
    sub = ferry.Subscriber(st, "run")
    for timeout in (2, 0):
        t0 = time.monotonic()
        try:
            got = sub.wait(timeout_s=timeout)
        except ferry.StoreError as e:
            assert e.code in (ferry.errors.ERR_STORE_TIMEOUT, ferry.errors.ERR_STORE_NET), e
        else:
            raise AssertionError("wait() with the store down returned %r" % (got,))
        took = time.monotonic() - t0
        # about the timeout (at least 1 s per HEAD read), nowhere near 300 s
        assert took < max(timeout, 1) + 15, took
    # the store's own deadline (deadline_s) bounds a sync, from a URL too
    old = {k: os.environ.get(k) for k in ("AWS_ENDPOINT_URL_S3", "AWS_ACCESS_KEY_ID",
                                           "AWS_SECRET_ACCESS_KEY")}
    os.environ.update(AWS_ENDPOINT_URL_S3=endpoint, AWS_ACCESS_KEY_ID="k", AWS_SECRET_ACCESS_KEY="s")
    try:
        sub2 = ferry.Subscriber("s3://bkt/policy", "run", deadline_s=2)
        t0 = time.monotonic()
        try:
            sub2.sync()
        except ferry.StoreError:
            pass
        else:
            raise AssertionError("sync() with the store down succeeded")
        assert time.monotonic() - t0 < 17, time.monotonic() - t0
        sub2.close()
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    sub.close()


def test_engine_before_trainer():
    """An engine started first: without create= its store does not exist
    (ERR_STORE_NOT_FOUND); with create=True wait() waits for the store's
    root and then for the run's first version."""
    _need_sync()
    import torch
    root = os.path.join(TMP, "later")
    try:
        ferry.Subscriber(root, "run")
    except ferry.StoreError as e:
        assert e.code == ferry.errors.ERR_STORE_NOT_FOUND, e
    else:
        raise AssertionError("a missing store root accepted without create=True")
    sub = ferry.Subscriber(root, "run", create=True)
    assert sub.wait(timeout_s=0.2) is None
    eng = {k: v.to(torch.bfloat16) for k, v in _model(1).items()}
    try:
        sub.sync_into(eng)
    except ferry.SyncError as e:
        assert e.code == ferry.errors.ERR_SYNC_NOT_YET, e
    else:
        raise AssertionError("sync_into before any version")
    w = _model(2)

    def trainer():
        time.sleep(1.0)
        with ferry.Publisher(root, "run") as pub:
            pub.publish(w)
    t = threading.Thread(target=trainer)
    t.start()
    assert sub.wait(timeout_s=60) == 1
    t.join()
    assert sub.sync_into(eng) == 1
    for k in w:
        assert torch.equal(eng[k], w[k].to(torch.bfloat16)), k
    sub.close()


def test_refused_version_keeps_state():
    """A version that does not fit (a changed shape) is refused: version
    stays at what the tensors hold, stats count both syncs (the first one
    included, through the tied names' first-sync mirrors), and wait()
    waits for a version above the refused one instead of returning at once."""
    _need_sync()
    import torch
    store = os.path.join(TMP, "refused")
    w = _model(3)
    w["head"] = w["emb"]          # tied, as lm_head and embed_tokens
    pub = ferry.Publisher(store, "run")
    pub.publish(w)
    emb = w["emb"].to(torch.bfloat16)
    eng = {"emb": emb, "w": w["w"].to(torch.bfloat16), "norm": w["norm"].to(torch.bfloat16),
           "head": emb}
    eng = {k: torch.zeros_like(v) if k != "head" else v for k, v in eng.items()}
    eng["head"] = eng["emb"]
    sub = ferry.Subscriber(store, "run")
    assert sub.sync_into(eng) == 1
    w2 = dict(w)
    w2["w"] = w["w"] + 1.0
    pub.publish(w2)
    assert sub.sync_into(eng) == 2
    st = sub.stats
    assert st["syncs"] == 2 and st["steps"] == 2, st
    bad = {k: v for k, v in w2.items()}
    bad["norm"] = torch.ones(17)
    pub.publish(bad)                 # version 3: norm is [17]
    try:
        sub.sync_into(eng)
    except ferry.SyncError as e:
        assert e.code == ferry.errors.ERR_SYNC_SHAPE, e
    else:
        raise AssertionError("a version of another shape synced into the engine")
    assert sub.version == 2 and sub.refused == 3, (sub.version, sub.refused)
    assert torch.equal(eng["w"], w2["w"].to(torch.bfloat16))
    assert sub.stats["syncs"] == 3, sub.stats
    t0 = time.monotonic()
    assert sub.wait(timeout_s=0.5) is None      # before: 3 at once
    assert time.monotonic() - t0 >= 0.4
    assert sub.wait(after_version=2, timeout_s=0) == 3   # asked for explicitly
    w4 = dict(w2)
    w4["w"] = w2["w"] * 2
    pub.publish(w4)                  # version 4 fits again
    assert sub.wait(timeout_s=10) == 4
    assert sub.sync_into(eng) == 4 and sub.refused == 0
    assert torch.equal(eng["w"], w4["w"].to(torch.bfloat16))
    assert eng["head"].data_ptr() == eng["emb"].data_ptr()
    sub.close()
    pub.close()


def test_mismatch_names_both_sides():
    _need_sync()
    import torch
    store = os.path.join(TMP, "mismatch")
    w = _model(4)
    with ferry.Publisher(store, "run") as pub:
        pub.publish(w)
    eng = {k: v.to(torch.bfloat16) for k, v in w.items()}
    eng["w"] = eng["w"][:, :-1].contiguous()
    try:
        ferry.Subscriber(store, "run").sync_into(eng)
    except ferry.SyncError as e:
        assert e.code == ferry.errors.ERR_SYNC_SHAPE, e
        assert "'w' is BF16 [64, 64] in the version, BF16 [64, 63] in the caller's model" in e.message, e
    else:
        raise AssertionError("shape mismatch accepted")
    eng = {k: v.to(torch.bfloat16) for k, v in w.items()}
    eng["norm"] = w["norm"].clone()   # F32 where the version has BF16
    try:
        ferry.Subscriber(store, "run").sync_into(eng)
    except ferry.SyncError as e:
        assert "'norm' is BF16 [16] in the version, F32 [16] in the caller's model" in e.message, e
    else:
        raise AssertionError("dtype mismatch accepted")
    eng = {k: v.to(torch.bfloat16) for k, v in w.items() if k != "emb"}
    eng["lm_head"] = torch.zeros(64, 16, dtype=torch.bfloat16)
    eng["extra"] = torch.zeros(3, dtype=torch.bfloat16)
    try:
        ferry.Subscriber(store, "run").sync_into(eng)
    except ferry.SyncError as e:
        assert ("the version has 3 tensors, the caller's model 4; not in the caller's model: "
                "'emb'; missing from the version: 'extra', 'lm_head'") in e.message, e
    else:
        raise AssertionError("missing tensor accepted")


def test_resumed_publisher_refuses_fresh_init():
    """A trainer re-run under an old run name resumes at HEAD: a freshly
    initialized model is refused (SyncError ERR_SYNC_FOREIGN, HEAD
    unchanged) unless new_lineage=True; the trained model a step further
    is published, so is one whose every word changed by a small step."""
    _need_sync()
    store = os.path.join(TMP, "lineage")
    w = _model(5)
    with ferry.Publisher(store, "run") as pub:
        pub.publish(w)
        w["w"][0] += 1.0
        pub.publish(w)
    fresh = _model(6)
    for _ in range(2):    # refused again: no second chance by retrying
        pub = ferry.Publisher(store, "run")
        try:
            pub.publish(fresh)
        except ferry.SyncError as e:
            assert e.code == ferry.errors.ERR_SYNC_FOREIGN, e
            assert "resumed at version 2" in e.message and "new_lineage=True" in e.message, e
        else:
            raise AssertionError("a fresh init published over version 2")
        try:
            pub.publish(fresh)
        except ferry.SyncError:
            pass
        else:
            raise AssertionError("the second try published it")
        assert pub.version == 2
        pub.close()
    w["w"][1] += 1.0                  # the trainer resumed from its checkpoint
    with ferry.Publisher(store, "run") as pub:
        assert pub.publish(w) == 3
    w = {k: v * 1.02 for k, v in w.items()}   # a large step: every word, 2% of the norm
    with ferry.Publisher(store, "run") as pub:
        assert pub.publish(w) == 4
    with ferry.Publisher(store, "run", new_lineage=True) as pub:
        assert pub.publish(fresh) == 5
    sub = ferry.Subscriber(store, "run")
    assert sub.sync() == 5
    import torch
    from _harness import bits
    got = sub.tensors("torch")
    assert (bits(got["w"]) == bits(fresh["w"].to(torch.bfloat16))).all()
    sub.close()


if __name__ == "__main__":
    import shutil
    try:
        run("loop_safe", [test_scheme_like_paths_refused, test_private_key_as_trusted_warns,
                          test_wait_honours_timeout_with_store_down, test_engine_before_trainer,
                          test_refused_version_keeps_state, test_mismatch_names_both_sides,
                          test_resumed_publisher_refuses_fresh_init])
    finally:
        shutil.rmtree(TMP, ignore_errors=True)
