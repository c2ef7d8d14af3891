"""The binding's owned handles (python/ferry/_lib.py Handle): ferry.Store
and ferry.Model close at the end of a with block; a Store closed while a
Publisher still uses it is not freed under it (the C publisher borrows
it).  And the public API's annotations resolve (the package ships
py.typed)."""
import inspect
import os
import shutil
import tempfile
import typing

from _harness import Skip, run
from _helpers import raises as _raises

import numpy as np

import ferry

TMP = tempfile.mkdtemp(prefix="ferry-pyhandles-")


def need_sync():
    if not hasattr(ferry, "Store"):
        raise Skip("this libferry has no sync layer")


def test_store_with_block_closes():
    need_sync()
    url = "file://" + os.path.join(TMP, "with")
    with ferry.Store(url, create=True) as s:
        assert isinstance(s, ferry.Store)
        assert s.url.rstrip("/").endswith("/with")
        assert s.handle
    e = _raises(ValueError, lambda: s.handle)
    assert "closed" in str(e)
    assert not s._h                        # freed, not merely marked
    _raises(ValueError, lambda: s.url)
    _raises(ValueError, ferry.Publisher, s, "run")   # a closed store is not lent
    s.close()                              # twice: nothing


def test_store_closed_under_a_publisher():
    need_sync()
    url = "file://" + os.path.join(TMP, "early")
    w = {"w": np.arange(64, dtype=np.float32)}
    with ferry.Store(url, create=True) as s:
        pub = ferry.Publisher(s, "run", cast_bf16=False)
    # The block ended with the publisher open: it still works (the C store
    # it borrows was not freed), and the store takes no new user.
    assert s._h
    _raises(ValueError, ferry.Subscriber, s, "run")
    assert pub.publish(w) == 1
    w["w"][3] += 1
    assert pub.publish(w) == 2
    pub.close()
    sub = ferry.Subscriber(url, "run")
    assert sub.sync() == 2
    got = sub.tensors(framework="np")
    assert np.array_equal(got["w"], w["w"])
    sub.close()


def test_model_with_block_closes():
    with ferry.Model.from_tensors({"a": np.zeros(3, np.float32)}) as m:
        assert len(m) == 1 and m.names() == ["a"]
    _raises(ValueError, len, m)
    _raises(ValueError, m.hash)


def _public():
    """(qualified name, function) of every public function and method."""
    for name in ferry.__all__ + (["shard"] if hasattr(ferry, "shard") else []):
        obj = getattr(ferry, name)
        if inspect.ismodule(obj):
            for k, v in vars(obj).items():
                if not k.startswith("_") and (inspect.isfunction(v) or inspect.isclass(v)) \
                        and getattr(v, "__module__", "") == obj.__name__:
                    yield from _members("%s.%s" % (name, k), v)
        else:
            yield from _members(name, obj)


def _members(name, obj):
    if inspect.isfunction(obj):
        yield name, obj
    elif inspect.isclass(obj) and obj.__module__.startswith("ferry"):
        for k, v in vars(obj).items():
            if k.startswith("_") and k != "__init__":
                continue
            if isinstance(v, (classmethod, staticmethod)):
                v = v.__func__
            elif isinstance(v, property):
                v = v.fget
            if inspect.isfunction(v):
                yield "%s.%s" % (name, k), v


def test_public_api_annotated():
    # names the modules import for type checkers only (TYPE_CHECKING)
    import ferry.layout
    extra = {"Layout": ferry.layout.Layout, "Model": ferry.Model}
    for k in ("Keys", "Store"):
        if hasattr(ferry, k):
            extra[k] = getattr(ferry, k)
    checked = 0
    for name, f in _public():
        if getattr(f, "__module__", "").startswith("ferry.errors"):
            continue  # errors.py is typed on its own
        hints = typing.get_type_hints(f, localns=extra)   # resolves every annotation
        params = [p for p in inspect.signature(f).parameters.values()
                  if p.name not in ("self", "cls") and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        missing = [p.name for p in params if p.name not in hints]
        assert not missing, "%s: parameters %s have no annotation" % (name, missing)
        assert "return" in hints, "%s: no return annotation" % name
        checked += 1
    assert checked > 40, checked
    assert os.path.isfile(os.path.join(os.path.dirname(ferry.__file__), "py.typed"))


if __name__ == "__main__":
    try:
        run("handles", [v for k, v in list(globals().items()) if k.startswith("test_")])
    finally:
        shutil.rmtree(TMP, ignore_errors=True)
