"""Tensor-parallel engines follow a sharded run (issue 13 item 3).

R = 2 trainer processes, joined by torch.distributed (gloo, 127.0.0.1),
publish VERSIONS versions of a small Llama-style model's FP32 masters,
each rank its FSDP-style dim-0 shard (ferry.shard.ShardPublisher: the
token, part records and commit status move by broadcast_object_list /
gather_object).  At the same time two island groups, M = 2 and M = 3
processes, each its own gloo group, hold the model in engine layout
(fused qkv and gate_up column-parallel, o/down row-parallel, vocabulary-
parallel embedding and head, replicated norms: ferry.layout.Layout.llama)
and follow version by version (ShardSubscriber.apply, in place).  After
every version each island rank checks (1) its engine weights equal the
reference BF16 model's slices bit for bit and (2) the TP forward's logits
equal the unsharded BF16 model's bit for bit (tests/python/_tp.py says how
the forward is made exact), and that they moved since the last version.

In-process (no subprocess): a bad layout (a split that does not divide,
an engine parameter of the wrong shape, a layout that disagrees with the
checkpoint) is refused with a message naming the parameter, before
anything is written; tied parameters (one engine storage under two names)
are written once and stay consistent."""
import os
import shutil
import subprocess
import sys
import tempfile

from _harness import Skip, run
from _helpers import bits16 as _bits, engine_params, free_port, join, leave, need_shard, publish_solo, reap, spawn
from _helpers import raises_code as _raises

import torch

import ferry
from ferry.layout import Layout

import _tp

VERSIONS = 4
TMP = tempfile.mkdtemp(prefix="ferry-pytp-")
OPTS = dict(anchor_every=3, min_tile_words=1024)     # small tiles: islands fetch a part


def reference(v, tied=False):
    """The unsharded BF16 model of version v and its logits."""
    full = _tp.bf16(_tp.masters(v, tied=tied))
    return full, _tp.forward(Layout.llama(_tp.shapes(), 1, 0).shard(full), _tp.IDS, _tp.Solo())


# ----------------------------------------------------------------------
# The processes
# ----------------------------------------------------------------------

def trainer(rank, world, port, store):
    d = join(rank, world, port)
    pub = ferry.shard.ShardPublisher(store, "tp", **OPTS)
    assert (pub.rank, pub.world) == (rank, world)
    for v in range(1, VERSIONS + 1):
        parts = ferry.shard.dim0_parts(_tp.masters(v), rank, world)
        assert pub.publish(parts) == v and pub.version == v
        info = pub.last_info
        assert info["kind"] == "anchor" or v > 1, info
        print("trainer %d: version %d %s delta %d anchor %d bytes" % (
            rank, v, info["kind"], info["delta_bytes"], info["anchor_bytes"]))
    leave(d)


def island(rank, world, port, store):
    d = join(rank, world, port)
    lay = Layout.llama(_tp.shapes(), world, rank)
    params = engine_params(lay)
    ptrs = {n: t.data_ptr() for n, t in params.items()}
    sub = ferry.shard.ShardSubscriber(store, "tp", lay)
    comm, before = _tp.Dist(), None
    for v in range(1, VERSIONS + 1):
        assert sub.wait(after_version=v - 1, timeout_s=120) >= v
        assert sub.apply(params, exact_version=v) == v and sub.version == v
        full, want = reference(v)
        exp = lay.shard(full)
        bad = [n for n in params if not torch.equal(_bits(params[n]), _bits(exp[n]))]
        assert not bad, (v, bad[:3])
        got = _tp.forward(params, _tp.IDS, comm)
        assert torch.equal(_bits(got), _bits(want)), (v, float((got - want).abs().max()))
        assert before is None or not torch.equal(_bits(got), _bits(before)), v
        before = got
        a, info = sub.last_apply, sub.last_info
        # A cold start copies whole regions; a delta index_copy_s the changes.
        if v == 1:
            assert a["copied"] == len(lay.regions) and a["indexed"] == 0, a
        if v == 2:
            assert a["indexed"] > 0 and a["copied"] == 0, a
        # Only the tiles covering this rank's regions travel.
        assert 0 < info["object_bytes"] < info["version_bytes"] or world == 1, info
        print("island %d/%d: version %d ok, %s, fetched %d of %d bytes" % (
            rank, world, v, a, info["object_bytes"], info["version_bytes"]))
    assert {n: t.data_ptr() for n, t in params.items()} == ptrs     # in place
    leave(d)


# ----------------------------------------------------------------------
# The tests
# ----------------------------------------------------------------------

def test_tp_islands_follow_sharded_trainers():
    need_shard()
    store = "file://" + os.path.join(TMP, "store")
    os.makedirs(store[7:])
    procs = spawn(__file__, "trainer", 2, store) + spawn(__file__, "island", 2, store) + \
        spawn(__file__, "island", 3, store)
    failed = reap(procs, 180)
    assert not failed, failed


def test_layout_regions():
    """Where each checkpoint slice lands, rank 1 of 3."""
    lay = Layout.llama(_tp.shapes(), 3, 1)
    qkv = lay.params["model.layers.0.self_attn.qkv_proj.weight"]
    assert qkv.kind == "fused" and qkv.shape == (96, 96)
    assert [(r.source.split(".")[-2], r.row_begin, r.row_end, r.col_begin, r.col_end, r.offset)
            for r in qkv.regions] == [("q_proj", 32, 64, 0, 96, 0), ("k_proj", 32, 64, 0, 96, 3072),
                                      ("v_proj", 32, 64, 0, 96, 6144)]
    o = lay.params["model.layers.0.self_attn.o_proj.weight"]
    assert o.kind == "row" and o.shape == (96, 32)
    assert [(r.row_begin, r.row_end, r.col_begin, r.col_end) for r in o.regions] == [(0, 96, 32, 64)]
    gu = lay.params["model.layers.1.mlp.gate_up_proj.weight"]
    assert gu.shape == (128, 96) and [r.source for r in gu.regions] == [
        "model.layers.1.mlp.gate_proj.weight", "model.layers.1.mlp.up_proj.weight"]
    assert lay.params["lm_head.weight"].shape == (128, 96)
    assert lay.params["model.embed_tokens.weight"].kind == "vocab"
    assert lay.params["model.norm.weight"].kind == "replicated"
    assert len(lay.params) == 3 + 2 * 6 and len(lay.regions) == 3 + 2 * 9
    # shard() cuts exactly those slices.
    full = _tp.bf16(_tp.masters(1))
    p = lay.shard(full)
    w = full["model.layers.0.self_attn.o_proj.weight"]
    assert torch.equal(_bits(p["model.layers.0.self_attn.o_proj.weight"]), _bits(w[:, 32:64]))
    q = full["model.layers.0.self_attn.k_proj.weight"]
    assert torch.equal(_bits(p["model.layers.0.self_attn.qkv_proj.weight"][32:64]), _bits(q[32:64]))
    # Errors name the parameter.
    _raises(lambda: Layout(_tp.shapes(), 2, 0).add("x", "fused", ["lm_head.weight",
                                                                  "model.layers.0.mlp.down_proj.weight"]),
            47, "'x'", "fused parts differ")
    _raises(lambda: Layout(_tp.shapes(), 2, 0).add("y", "row", "model.norm.weight"), 2, "'y'", "2-D")
    _raises(lambda: Layout(_tp.shapes(), 2, 0).add("z", "column", "nope"), 2, "'z'", "'nope'")
    _raises(lambda: Layout(_tp.shapes(), 2, 2), 2, "rank 2 of tp_size 2")
    _raises(lambda: lay.check_engine({}), 2, "has no parameter")


def trainer_mpi(port, store):
    """A trainer rank started by mpirun: rank and world from Open MPI's
    environment, the collectives torch.distributed's (gloo)."""
    rank, world = ferry.shard.init_process_group("gloo", "127.0.0.1", port, timeout_s=120)
    pub = ferry.shard.ShardPublisher(store, "mpi", **OPTS)
    for v in (1, 2):
        assert pub.publish(ferry.shard.dim0_parts(_tp.masters(v), rank, world)) == v
    print("trainer-mpi %d/%d: published 1, 2" % (rank, world))
    leave(torch.distributed)


def test_trainers_under_mpirun():
    need_shard()
    mpirun = shutil.which("mpirun")
    if not mpirun:
        raise Skip("no mpirun")
    store = "file://" + tempfile.mkdtemp(dir=TMP)
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_btl="self,vader", OMPI_MCA_btl_tcp_if_include="lo",
               OMPI_MCA_oob_tcp_if_include="lo", OMPI_MCA_rmaps_base_oversubscribe="1")
    r = subprocess.run(["timeout", "150", mpirun, "-np", "2", "--oversubscribe", sys.executable,
                        os.path.abspath(__file__), "trainer-mpi", str(free_port()), store],
                       capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "trainer-mpi 1/2" in r.stdout, r.stdout
    # A one-rank island (the whole model) reads both versions bit for bit.
    lay = Layout.llama(_tp.shapes(), 1, 0)
    params = engine_params(lay)
    sub = ferry.shard.ShardSubscriber(store, "mpi", lay)
    for v in (1, 2):
        assert sub.apply(params, exact_version=v) == v
        exp = lay.shard(_tp.bf16(_tp.masters(v)))
        assert all(torch.equal(_bits(params[n]), _bits(exp[n])) for n in exp), v


def _publish_solo(store, run, versions, tied=False):
    """R = 1 without torch.distributed."""
    publish_solo(store, run, versions, lambda v: _tp.masters(v, tied=tied), **OPTS)


def test_bad_layout_refused_nothing_changed():
    need_shard()
    store = "file://" + os.path.join(TMP, "bad")
    _publish_solo(store, "b", [1, 2])
    # A split that does not divide: named at once.
    _raises(lambda: Layout.llama(_tp.shapes(), 5, 0), 2, "not divisible by tp_size 5")
    lay = Layout.llama(_tp.shapes(), 2, 1)
    full, _ = reference(2)
    good = lay.shard(full)
    # An engine parameter of the wrong shape: refused before any fetch.
    params = {n: t.clone() for n, t in good.items()}
    params["model.layers.1.mlp.down_proj.weight"] = torch.zeros(96, 192, dtype=torch.bfloat16)
    sub = ferry.shard.ShardSubscriber(store, "b", lay)
    snap = {n: _bits(t).clone() for n, t in params.items()}
    _raises(lambda: sub.apply(params), 47, "model.layers.1.mlp.down_proj.weight", "[96, 96]")
    assert sub.stats["pulls"] == 0 and sub.version == 0
    assert all(torch.equal(_bits(params[n]), snap[n]) for n in params)
    # A layout that disagrees with the checkpoint (it believes ffn is 256):
    # the pull or the region check refuses, nothing is written.
    wrong = dict(_tp.shapes(dict(_tp.CFG, ffn=256)))
    lay2 = Layout.llama(wrong, 2, 1)
    params2 = engine_params(lay2, 7.0)
    snap = {n: _bits(t).clone() for n, t in params2.items()}
    sub2 = ferry.shard.ShardSubscriber(store, "b", lay2)
    try:
        sub2.apply(params2)
        raise AssertionError("a layout of other shapes was applied")
    except ferry.FerryError as e:
        # FERRY_ERR_SHARD_REGION (by its name: its number is ferry_shard.h's) or 47.
        assert (e.code == 47 or "region" in e.name) and "mlp" in e.message, e
    assert sub2.version == 0 and all(torch.equal(_bits(params2[n]), snap[n]) for n in params2)
    # The right engine follows the same run.
    right = engine_params(lay)
    assert ferry.shard.ShardSubscriber(store, "b", lay).apply(right) == 2
    assert all(torch.equal(_bits(right[n]), _bits(good[n])) for n in good)


def test_tied_engine_parameters():
    """embed_tokens and lm_head as one engine storage (a tied model): both
    regions fetched and checked identical, the storage written once, and a
    version that unties them refused with the storage as it was."""
    need_shard()
    store = "file://" + os.path.join(TMP, "tied")
    _publish_solo(store, "t", [1, 2], tied=True)
    lay = Layout.llama(_tp.shapes(), 2, 0)
    params = engine_params(lay)
    params["lm_head.weight"] = params["model.embed_tokens.weight"]
    sub = ferry.shard.ShardSubscriber(store, "t", lay)
    assert sub.apply(params, exact_version=1) == 1
    for v in (2,):
        assert sub.apply(params) == v
        exp = lay.shard(_tp.bf16(_tp.masters(v, tied=True)))
        assert all(torch.equal(_bits(params[n]), _bits(exp[n])) for n in exp)
    assert params["lm_head.weight"].data_ptr() == params["model.embed_tokens.weight"].data_ptr()
    assert sub.last_apply["indexed"] > 0
    # Other tensors (a restarted engine) hold no known version: whole copies.
    fresh = engine_params(lay)
    assert sub.apply(fresh) == 2 and sub.last_apply["copied"] == len(lay.regions)
    assert all(torch.equal(_bits(fresh[n]), _bits(params[n])) for n in params)
    # Version 3 publishes an lm_head that differs from the embedding.
    pub = ferry.shard.ShardPublisher(store, "t", rank=0, world=1, **OPTS)
    w = _tp.masters(3)
    w["lm_head.weight"] = w["model.embed_tokens.weight"] + 1.0
    tok = pub.begin()
    pub.commit(tok, [pub.put(tok, ferry.shard.dim0_parts(w, 0, 1))])
    pub.finish(True)
    snap = {n: _bits(t).clone() for n, t in params.items()}
    _raises(lambda: sub.apply(params), 2, "lm_head.weight", "model.embed_tokens.weight")
    assert sub.version == 2 and all(torch.equal(_bits(params[n]), snap[n]) for n in params)


if __name__ == "__main__":
    if len(sys.argv) > 1:
        shutil.rmtree(TMP, ignore_errors=True)   # a role process: the store is the parent's
    if len(sys.argv) > 1 and sys.argv[1] == "trainer-mpi":
        trainer_mpi(int(sys.argv[2]), sys.argv[3])
        sys.exit(0)
    if len(sys.argv) > 1:
        role, rank, world, port, store = sys.argv[1:6]
        {"trainer": trainer, "island": island}[role](int(rank), int(world), int(port), store)
        sys.exit(0)
    try:
        run("tp", [v for k, v in list(globals().items()) if k.startswith("test_")])
    finally:
        shutil.rmtree(TMP, ignore_errors=True)
