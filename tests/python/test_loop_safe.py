"""Failures that would break a training loop, from Python (issue 27 item
4): a store URL that lost its '//' is refused (StoreError ERR_STORE_URL
naming it) and no local directory appears; a private key given to
Keys(trust=...) warns, a public one does not."""
import os
import tempfile
import warnings

from _harness import Skip, run

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


if __name__ == "__main__":
    import shutil
    try:
        run("loop_safe", [test_scheme_like_paths_refused, test_private_key_as_trusted_warns])
    finally:
        shutil.rmtree(TMP, ignore_errors=True)
