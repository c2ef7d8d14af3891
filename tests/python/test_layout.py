"""The ctypes mirrors of libferry's structs (python/ferry/_lib.py, sync.py)
against the C headers: a small C program prints sizeof and offsetof of
every field, compiled with the compiler the library was built with."""
import os
import shutil
import subprocess
import tempfile

from _harness import ROOT, Skip, run

import ctypes

import ferry
from ferry import _lib

STRUCTS = [("ferry_tensor", _lib.Tensor, "ferry.h"),
           ("ferry_diff_options", _lib.DiffOptions, "ferry.h"),
           ("ferry_apply_options", _lib.ApplyOptions, "ferry.h"),
           ("ferry_patch_tensor_info", _lib.PatchTensorInfo, "ferry.h")]
if hasattr(ferry, "Publisher"):
    from ferry import sync
    STRUCTS += [("ferry_store_options", sync._StoreOptions, "ferry_store.h"),
                ("ferry_publisher_options", sync._PublisherOptions, "ferry_sync.h"),
                ("ferry_publish_info", sync._PublishInfo, "ferry_sync.h"),
                ("ferry_subscriber_options", sync._SubscriberOptions, "ferry_sync.h"),
                ("ferry_sync_info", sync._SyncInfo, "ferry_sync.h"),
                ("ferry_subscriber_stats", sync._SubscriberStats, "ferry_sync.h"),
                ("ferry_mirror_options", sync._MirrorOptions, "ferry_sync.h"),
                ("ferry_mirror_info", sync._MirrorInfo, "ferry_sync.h")]
if hasattr(ferry, "shard"):
    from ferry import shard
    STRUCTS += [("ferry_shard_options", shard._Options, "ferry_shard.h"),
                ("ferry_shard_part", shard._Part, "ferry_shard.h"),
                ("ferry_shard_publish_info", shard._PublishInfo, "ferry_shard.h"),
                ("ferry_shard_region", shard._Region, "ferry_shard.h"),
                ("ferry_shard_sub_options", shard._SubOptions, "ferry_shard.h"),
                ("ferry_shard_pull_info", shard._PullInfo, "ferry_shard.h"),
                ("ferry_shard_sub_stats", shard._SubStats, "ferry_shard.h")]
if hasattr(ferry, "Dock"):
    from ferry import dock
    STRUCTS += [("ferry_dock_policy", dock._Policy, "ferry_dock.h"),
                ("ferry_dock_event", dock._Event, "ferry_dock.h"),
                ("ferry_dock_options", dock._Options, "ferry_dock.h"),
                ("ferry_dock_batch", dock._Batch, "ferry_dock.h"),
                ("ferry_dock_stats", dock._Stats, "ferry_dock.h")]


def test_struct_layouts_match_headers():
    cc = os.environ.get("CC", "cc")
    if not shutil.which(cc):
        raise Skip("no C compiler")
    heads = sorted({h for _, _, h in STRUCTS})
    src = ["#include <stdio.h>", "#include <stddef.h>"] + ['#include "%s"' % h for h in heads]
    src.append("int main(void) {")
    want = []
    for cname, py, _ in STRUCTS:
        src.append('printf("%%s %%zu\\n", "%s", sizeof(%s));' % (cname, cname))
        want.append("%s %d" % (cname, ctypes.sizeof(py)))
        for f in py._fields_:
            src.append('printf("%%s.%%s %%zu\\n", "%s", "%s", offsetof(%s, %s));'
                       % (cname, f[0], cname, f[0]))
            want.append("%s.%s %d" % (cname, f[0], getattr(py, f[0]).offset))
    src.append("return 0; }")
    d = tempfile.mkdtemp()
    try:
        c, exe = os.path.join(d, "layout.c"), os.path.join(d, "layout")
        with open(c, "w") as f:
            f.write("\n".join(src) + "\n")
        subprocess.run([cc, "-std=c11", "-I", os.path.join(ROOT, "include"), c, "-o", exe], check=True)
        got = subprocess.run([exe], capture_output=True, text=True, check=True).stdout.split("\n")[:-1]
    finally:
        shutil.rmtree(d, ignore_errors=True)
    bad = [(w, g) for w, g in zip(want, got) if w != g]
    assert not bad and len(got) == len(want), bad


if __name__ == "__main__":
    run("layout", [test_struct_layouts_match_headers])
