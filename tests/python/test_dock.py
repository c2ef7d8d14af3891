"""ferry.Dock (python/ferry/dock.py over include/ferry_dock.h): two engine
processes put signed batches (numpy, no torch import: the machine is small) into a file:// store, a torch trainer
takes them sequentially (one version) and asynchronously (a staleness
bound), trains on them, and finds stale ones dropped; a batch signed by an
unknown key, one signed by another island's key, and a stored batch put
back after it was taken are refused and counted; the Keys object going out
of scope in user code does not crash the dock that borrows it; bytes,
numpy and torch payloads come back bit for bit.

Run directly, `python3 test_dock.py engine URL RUN KEYDIR ISLAND VERSIONS N`
is the engine process the first case starts."""
import gc
import glob
import os
import subprocess
import sys
import tempfile

from _harness import Skip, run
from _helpers import raises as _raises

import numpy as np

import ferry

TMP = tempfile.mkdtemp(prefix="ferry-pydock-")
KEYS = os.path.join(TMP, "keys")
SHAPE = (4, 16)


def need_dock():
    if not hasattr(ferry, "Dock") or not hasattr(ferry, "Keys"):
        raise Skip("this libferry has no dock or signing layer")


def key(name, ext="key"):
    if not os.path.exists(os.path.join(KEYS, "trainer.key")):
        os.makedirs(KEYS, exist_ok=True)
        for n in ("trainer", "island0", "island1", "stranger"):
            ferry.keygen(os.path.join(KEYS, n))
    return os.path.join(KEYS, "%s.%s" % (name, ext))


def trainer_keys():
    return ferry.Keys(sign=key("trainer"), trust=[(key("island0", "pub"), 0),
                                                  (key("island1", "pub"), 1)])


def island_keys(i, signer=None):
    """Island i's ring: its batch key, and the trainer's public key, which
    resume_seq needs to believe the trainer's (signed) cursor."""
    return ferry.Keys(sign=key(signer or "island%d" % i), island=i,
                      trust=[key("trainer", "pub")])


def payload(island, version, seq):
    """What an engine puts: a float32 tensor its (island, version, seq)
    determines, so the trainer can check every value it takes."""
    base = island * 10000 + version * 100 + seq
    return np.arange(SHAPE[0] * SHAPE[1], dtype=np.float32).reshape(SHAPE) / 64 + base


def store(name):
    return "file://" + os.path.join(TMP, name)


def engine(url, run_id, island, versions, n):
    """An engine process (numpy only): opens its own signed dock, continues its seqs from
    the store and the trainer's cursor, puts n batches per version."""
    with ferry.Dock(url, run_id, keys=island_keys(island)) as dock:
        seq = dock.resume_seq(island)
        for v in versions:
            for _ in range(n):
                dock.put(payload(island, v, seq), island=island, version=v, seq=seq)
                seq += 1
    print("island %d put up to seq %d" % (island, seq))


def engines(url, run_id, versions, n=3):
    procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "engine", url, run_id,
                               KEYS, str(i), ",".join(map(str, versions)), str(n)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for i in (0, 1)]
    for p in procs:
        out = p.communicate(timeout=120)[0]
        assert p.returncode == 0, out


def check_batch(b):
    import torch
    t = b.torch(torch.float32, SHAPE)
    assert torch.equal(t, torch.from_numpy(payload(b.island, b.version, b.seq))), b


def test_engines_to_torch_trainer_both_policies():
    need_dock()
    import torch
    url, rid = store("loop"), "rl"
    key("trainer")
    engines(url, rid, [1, 2])              # seqs 0..2 at version 1, 3..5 at version 2
    model = torch.nn.Linear(SHAPE[1], 1)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)

    def train(batches):
        x = torch.cat([b.torch(torch.float32, SHAPE) for b in batches])
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()

    with ferry.Dock(url, rid, role="consumer", keys=trainer_keys()) as dock:
        # sequential: the trainer asks for version 1 and gets exactly it
        got = dock.take(1, max_batches=6, timeout_s=30)
        assert len(got) == 6, got
        assert {(b.island, b.seq) for b in got} == {(i, s) for i in (0, 1) for s in range(3)}
        assert all(b.version == 1 and b.staleness == 0 and b.run == rid for b in got)
        for b in got:
            check_batch(b)
        train(got)
        assert dock.take(1, max_batches=6, timeout_s=0) == []   # version 2 waits its turn

        # the engines go on at version 3, continuing their seqs
        engines(url, rid, [3])
        # async: the newest version is 3, one version of staleness admitted
        got = dock.take(3, max_batches=12, timeout_s=30, max_staleness=1)
        assert len(got) == 12, got
        assert sorted((b.version, b.staleness) for b in got) == [(2, 1)] * 6 + [(3, 0)] * 6
        assert {(b.island, b.seq) for b in got} == {(i, s) for i in (0, 1) for s in range(3, 9)}
        for b in got:
            check_batch(b)
        train(got)

        # a late batch of version 1 is stale at T=3, S=1: dropped, counted
        with ferry.Dock(url, rid, keys=island_keys(0)) as late:
            assert late.resume_seq(0) == 9
            late.put(payload(0, 1, 9), island=0, version=1, seq=9)
        assert dock.take(3, max_batches=4, timeout_s=0, max_staleness=1) == []
        dock.sweep(3, max_staleness=1)     # takes list only the window: a sweep finds it
        st = dock.stats
        assert st["admitted"] == 18 and st["dropped_stale"] == 1, st
        assert st["staleness_hist"][0] == 12 and st["staleness_hist"][1] == 6, st
        assert st["rejected"] == 0 and st["cursor_commits"] > 0, st
        # a trainer_version below one already used is refused
        e = _raises(ferry.DockError, dock.take, 2, max_batches=1)
        assert e.code == ferry.errors.ERR_DOCK_REGRESSED, e
    assert all(np.isfinite(p.detach().numpy()).all() for p in model.parameters())


def test_forged_and_replayed_batches_refused():
    need_dock()
    url, rid = store("forge"), "rl"
    with ferry.Dock(url, rid, keys=island_keys(0)) as mine, \
            ferry.Dock(url, rid, keys=island_keys(0, signer="stranger")) as stranger, \
            ferry.Dock(url, rid, keys=island_keys(1)) as other:
        mine.put(b"island 0, seq 0", island=0, version=1, seq=0)
        stranger.put(b"forged: unknown key", island=0, version=1, seq=1)
        other.put(b"forged: island 1's key", island=0, version=1, seq=2)
    legit = glob.glob(os.path.join(TMP, "forge", rid, "traj", "*", "i*0-s*0"))
    assert len(legit) == 1, legit
    with open(legit[0], "rb") as f:
        stored = f.read()

    events = []
    with ferry.Dock(url, rid, role="consumer", keys=trainer_keys(),
                    on_event=events.append) as dock:
        got = dock.take(1, max_batches=8, timeout_s=0)
        assert [(b.island, b.seq, b.data) for b in got] == [(0, 0, b"island 0, seq 0")], got
        st = dock.stats
        assert st["rejected_signature"] == 2 and st["quarantined"] == 2, st
        rej = [e for e in events if e["kind"] == "rejected"]
        assert sorted(e["seq"] for e in rej) == [1, 2], events
        assert all(e["code"] == ferry.errors.ERR_DOCK_SIGNATURE and e["message"] for e in rej)

        # the stored bytes of the batch taken, put back: a replay
        with open(legit[0], "wb") as f:
            f.write(stored)
        assert dock.take(1, max_batches=8, timeout_s=0) == []
        st = dock.stats
        assert st["rejected_replay"] == 1 and st["rejected"] == 3 and st["admitted"] == 1, st
        assert any(e["code"] == ferry.errors.ERR_DOCK_REPLAY for e in events), events

        # the forgeries did not take island 0's numbers 1 and 2 from it
        with ferry.Dock(url, rid, keys=island_keys(0)) as mine:
            mine.put(b"island 0, seq 1", island=0, version=1, seq=1)
            mine.put(b"island 0, seq 2", island=0, version=1, seq=2)
        got = dock.take(1, max_batches=2, timeout_s=5)
        assert sorted(b.data for b in got) == [b"island 0, seq 1", b"island 0, seq 2"], got
    assert glob.glob(os.path.join(TMP, "forge", rid, "quarantine", "*", "**"), recursive=True)


def test_keys_out_of_scope_do_not_crash():
    """The C dock borrows the ring: the Dock keeps the Keys alive."""
    need_dock()
    url, rid = store("scope"), "rl"

    def producer():
        return ferry.Dock(url, rid, keys=island_keys(1))   # its Keys referenced nowhere else

    d = producer()
    gc.collect()
    d.put(b"after gc", island=1, version=4, seq=0)
    keys = trainer_keys()
    c = ferry.Dock(url, rid, role="consumer", keys=keys)
    del keys
    gc.collect()
    got = c.take(4, max_batches=1, timeout_s=5)
    assert [b.data for b in got] == [b"after gc"], got     # verified against the freed-looking ring
    assert c.stats["rejected"] == 0
    d.close()
    c.close()
    gc.collect()


def test_payload_kinds_with_and_close():
    need_dock()
    import torch
    url, rid = store("kinds"), "rl"
    arr = np.arange(12, dtype=np.float32).reshape(3, 4)
    bf = torch.linspace(-2, 2, 10).to(torch.bfloat16)
    with ferry.Dock(url, rid) as p:              # unsigned: no keys on either side
        p.put(b"raw bytes", island=0, version=1, seq=0)
        p.put(arr, island=0, version=1, seq=1)
        p.put(bf, island=0, version=1, seq=2)
        p.put(arr[:, ::2], island=0, version=1, seq=3)   # not contiguous: copied
        p.put(bytearray(b""), island=0, version=1, seq=4)
        assert "producer" in repr(p)
        e = _raises(ferry.FerryError, p.take, 1)          # a producer cannot take
        assert e.code == ferry.errors.ERR_ARG
    p.close()                                           # again: nothing
    _raises(ValueError, p.put, b"x", island=0, version=1, seq=5)
    assert "closed" in repr(p)
    _raises(TypeError, ferry.Dock(url, rid).put, object(), island=0, version=1, seq=6)
    _raises(ferry.FerryError, ferry.Dock, url, rid, role="trainer")
    _raises(ferry.FerryError, ferry.Dock, url, "bad/run")

    with ferry.Dock(url, rid, role="consumer") as c:
        got = {b.seq: b for b in c.take(1, max_batches=5, timeout_s=5)}
    assert sorted(got) == [0, 1, 2, 3, 4]
    assert got[0].data == b"raw bytes"
    assert np.array_equal(got[1].numpy(np.float32, (3, 4)), arr)
    assert torch.equal(got[2].torch(torch.bfloat16), bf)
    assert np.array_equal(got[3].numpy("<f4", (3, 2)), arr[:, ::2])
    assert got[4].data == b"" and got[4].torch().numel() == 0
    assert got[1].put_time_ms > 0 and "version=1" in repr(got[1])


if __name__ == "__main__":
    if sys.argv[1:2] == ["engine"]:
        os.rmdir(TMP)                  # the engine uses the trainer's directories
        url, run_id, KEYS, island, versions, n = sys.argv[2:8]
        engine(url, run_id, int(island), [int(v) for v in versions.split(",")], int(n))
        sys.exit(0)
    try:
        run("dock", [test_engines_to_torch_trainer_both_policies,
                     test_forged_and_replayed_batches_refused,
                     test_keys_out_of_scope_do_not_crash,
                     test_payload_kinds_with_and_close])
    finally:
        import shutil
        shutil.rmtree(TMP, ignore_errors=True)
