"""Checkpoints: round trips, exact continuation, corruption, crashes, online saves."""

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import reprise as rp
from reprise import selectors as S

SIG = {"obs": rp.Field((3,), "float32"), "act": rp.Field((), "int64")}


def data(n, t=1, start=0):
    a = np.arange(start, start + n * t, dtype=np.int64).reshape(n, t)
    return {"obs": np.repeat(a[..., None], 3, axis=2).astype(np.float32), "act": a}


@pytest.fixture
def tables(make_store):
    store = make_store(SIG, capacity=512, block_steps=8)
    t = rp.Table("replay", store, sampler=S.Prioritized(0.6), remover=S.Fifo(), max_size=60, seed=7,
                 rate_limiter=rp.rate_limiters.SampleToInsertRatio(4.0, 5, 1000.0))
    q = rp.Table.queue("queue", store, max_size=20)
    t.insert(data(70, 2), priorities=np.arange(70) % 9 + 0.5)
    q.insert(data(6, 1, start=1000), priorities=1.0)
    with store.writer() as w:  # items sharing steps across both tables
        for i in range(5):
            w.append({"obs": np.full(3, 2000 + i, np.float32), "act": 2000 + i})
            w.create_item(t, 2 if i else 1, 3.0)
            w.create_item(q, 1, 1.0)
    t.sample(17)
    q.sample(3)
    t.delete(t.sample(2).keys[:1])
    return store, t, q


def close_all(loaded):
    for s in {id(t.store): t.store for t in loaded.values()}.values():
        s.close()


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_round_trip_continues_exactly(tables, tmp_path, compression):
    if compression:
        pytest.importorskip("zstandard")
    store, t, q = tables
    path = rp.checkpoint.save(tmp_path, [t, q], compression=compression)
    assert Path(path).parent == tmp_path and Path(path).name.startswith("ckpt-")
    loaded = rp.checkpoint.load(path)
    try:
        t2, q2 = loaded["replay"], loaded["queue"]
        assert t2.store is q2.store  # a shared store is restored once, shared again
        assert t2.items() == t.items() and q2.items() == q.items()
        assert t2.info() == t.info() and q2.info() == q.info()
        for _ in range(5):  # same seed state: the same next draws, data and counts
            a, b = t.sample(8), t2.sample(8)
            np.testing.assert_array_equal(a.keys, b.keys)
            np.testing.assert_array_equal(a.probabilities, b.probabilities)
            for k in SIG:
                np.testing.assert_array_equal(a.data[k], b.data[k])
            np.testing.assert_array_equal(t.insert(data(1, 1, 5000), 1.0), t2.insert(data(1, 1, 5000), 1.0))
        a, b = q.sample(3), q2.sample(3)  # FIFO order and max_times_sampled continue
        np.testing.assert_array_equal(a.data["act"], b.data["act"])
        assert q.info() == q2.info() and t.info() == t2.info()
        # The limiter decides the same way.
        with pytest.raises(rp.errors.Timeout):
            q.sample(50, timeout=0)
        with pytest.raises(rp.errors.Timeout):
            q2.sample(50, timeout=0)
        def limiter(table):
            r = table.info()["rate_limiter"]
            return {k: v for k, v in r.items() if not k.startswith("blocked")}  # wall-clock times
        assert limiter(q) == limiter(q2)
    finally:
        close_all(loaded)


FIXTURES = Path(__file__).parent / "data"


@pytest.mark.parametrize("fixture", ["checkpoint_v1", "checkpoint_v1_zstd"])
def test_a_checkpoint_written_before_the_format_moved_to_rust_loads_exactly(fixture):
    """tests/data/<fixture> was written by the Python format code of 9619e5f (see
    tests/data/make_checkpoint_v1.py), before the format moved into Rust; the expected
    items, counters, draws and keys are what the saved tables themselves gave."""
    expected = json.loads((FIXTURES / "checkpoint_v1_expected.json").read_text())
    path = FIXTURES / fixture / "ckpt-00000000000000000001"
    assert rp.checkpoint.verify(path)["version"] == 1
    assert rp.checkpoint.latest(FIXTURES / fixture) == str(path)
    loaded = rp.checkpoint.load(FIXTURES / fixture)
    try:
        t, q = loaded["replay"], loaded["queue"]
        assert set(loaded) == {"replay", "queue"} and t.store is q.store
        assert t.store.signature == {"obs": rp.Field((3,), "float32"), "act": rp.Field((), "int64")}
        assert (t.store.capacity, t.store.block_steps) == (48, 4)
        assert len(t) == 11 and len(q) == 8
        assert [list(i) for i in t.items()] == expected["replay_items"]
        assert [list(i) for i in q.items()] == expected["queue_items"]

        def info(table):
            i = table.info()
            return {**i, "rate_limiter": {k: v for k, v in i["rate_limiter"].items() if not k.startswith("blocked")}}
        # Version 1 had no attributes: the tables have no policy version and
        # nothing was stale (the figures version 2 added).
        newer = {"version": None, "stale_removed": 0, "stale_dropped": 0, "groups": None, "attributes": {},
                 # and the store's bytes, as Store.memory() gives them (a figure added since).
                 "store": {"raw_bytes": 48 * (3 * 4 + 8), "stored_bytes": t.store.memory()["stored_bytes"]}}
        assert info(t) == {**expected["replay_info"], **newer} and info(q) == {**expected["queue_info"], **newer}
        for want in expected["replay_draws"]:  # the sampler and its generator continue
            s = t.sample(4)
            assert s.keys.tolist() == want["keys"]
            assert s.probabilities.tolist() == want["probabilities"]
            assert s.data["obs"].tolist() == want["obs"] and s.data["act"].tolist() == want["act"]
        assert q.sample(3).data["act"].tolist() == expected["queue_draw"]  # FIFO order continues
        inserted = {"obs": np.full((2, 1, 3), 7.0, np.float32), "act": np.array([[700], [701]], np.int64)}
        assert t.insert(inserted, 2.0).tolist() == expected["inserted_keys"]  # keys continue
    finally:
        close_all(loaded)


@pytest.mark.parametrize("sampler", [S.Uniform(), S.Fifo(), S.Lifo(), S.MaxHeap(), S.MinHeap(), S.TopK(), S.Prioritized(1.0)])
def test_every_selector_continues(make_store, tmp_path, sampler):
    store = make_store(SIG, capacity=256, block_steps=4)
    t = rp.Table("t", store, sampler=sampler, remover=S.Uniform(), max_size=30, max_times_sampled=2, seed=3)
    t.insert(data(40), priorities=np.arange(40) % 5 + 1.0)
    t.sample(7)
    loaded = rp.checkpoint.load(rp.checkpoint.save(tmp_path, t))
    try:
        t2 = loaded["t"]
        for _ in range(6):
            np.testing.assert_array_equal(t.sample(4, timeout=0).data["act"], t2.sample(4, timeout=0).data["act"])
            np.testing.assert_array_equal(t.insert(data(2, 1, 900), 2.0), t2.insert(data(2, 1, 900), 2.0))
        assert t.items() == t2.items()
    finally:
        close_all(loaded)


def test_files_are_private_and_documented(tables, tmp_path):
    _, t, q = tables
    path = Path(rp.checkpoint.save(tmp_path, [t, q]))
    names = sorted(p.name for p in path.iterdir())
    assert names == ["MANIFEST.json", "store-0.col-0", "store-0.col-1", "store-0.rows", "table-0.npz", "table-1.npz"]
    assert all((p.stat().st_mode & 0o777) == 0o600 for p in path.iterdir())
    m = json.loads((path / "MANIFEST.json").read_text())
    assert m["format"] == "reprise-checkpoint" and m["version"] == 2
    assert set(m["files"]) == set(names) - {"MANIFEST.json"}
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary left


@pytest.mark.parametrize("victim", ["store-0.col-0", "store-0.col-1", "store-0.rows", "table-0.npz", "table-1.npz"])
@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_corrupt_files_are_named_and_load_nothing(tables, tmp_path, victim, damage):
    _, t, q = tables
    path = Path(rp.checkpoint.save(tmp_path, [t, q]))
    f = path / victim
    raw = bytearray(f.read_bytes())
    if damage == "flip":
        raw[len(raw) // 2] ^= 0x40
    else:
        raw = raw[: len(raw) // 2]
    f.write_bytes(bytes(raw))
    before = set(os.listdir("/dev/shm"))
    with pytest.raises(rp.errors.Corrupt, match=victim):
        rp.checkpoint.load(path)
    assert set(os.listdir("/dev/shm")) == before  # no store was left behind
    assert rp.checkpoint.latest(tmp_path) is None


def test_manifest_version_and_garbage(tables, tmp_path):
    _, t, q = tables
    path = Path(rp.checkpoint.save(tmp_path, [t, q]))
    m = json.loads((path / "MANIFEST.json").read_text())
    m["version"] = 99
    (path / "MANIFEST.json").write_text(json.dumps(m))
    with pytest.raises(rp.errors.Corrupt, match="MANIFEST.json: format version 99"):
        rp.checkpoint.load(path)
    (path / "MANIFEST.json").write_text("{not json")
    with pytest.raises(rp.errors.Corrupt, match="MANIFEST.json: unreadable"):
        rp.checkpoint.load(path)
    (path / "MANIFEST.json").unlink()
    with pytest.raises(rp.errors.Corrupt, match="no valid checkpoint"):
        rp.checkpoint.load(tmp_path)


def test_load_takes_the_newest_valid_one(tables, tmp_path):
    _, t, q = tables
    saved, items = [], []  # oldest first: each checkpoint and the table's items when it was taken
    for i in range(3):
        if i:
            t.insert(data(3, 1, 7000 + 10 * i), 1.0)
        saved.append(rp.checkpoint.save(tmp_path, [t, q]))
        items.append(t.items())
    assert len({tuple(x) for x in items}) == 3  # the three are told apart by their items
    assert rp.checkpoint.checkpoints(tmp_path) == saved[::-1]
    loaded = rp.checkpoint.load(tmp_path)
    assert loaded["replay"].items() == items[2]
    close_all(loaded)
    (Path(saved[2]) / "store-0.col-1").write_bytes(b"x")
    assert rp.checkpoint.latest(tmp_path) == saved[1]
    loaded = rp.checkpoint.load(tmp_path)
    assert loaded["replay"].items() == items[1], "not the newest valid checkpoint"
    close_all(loaded)


def test_bad_arguments(tables, tmp_path):
    store, t, q = tables
    with pytest.raises(rp.errors.InvalidArgument, match="tables must be"):
        rp.checkpoint.save(tmp_path, [])
    with pytest.raises(rp.errors.InvalidArgument, match="compression"):
        rp.checkpoint.save(tmp_path, [t], compression="lz5")
    with pytest.raises(rp.errors.InvalidArgument, match="unique"):
        rp.checkpoint.save(tmp_path, [t, t])
    assert rp.checkpoint.checkpoints(tmp_path) == []


def test_saving_while_inserting_and_sampling(make_store, tmp_path):
    store = make_store(SIG, capacity=1 << 14, block_steps=64)
    t = rp.Table("t", store, sampler=S.Uniform(), remover=S.Fifo(), max_size=1 << 13, seed=1)
    t.insert(data(4000), 1.0)
    stop = threading.Event()
    counts = {"inserted": 0, "sampled": 0}

    def writer():
        i = 0
        while not stop.is_set():
            t.insert(data(64, 1, 10_000 + i * 64), 1.0)
            counts["inserted"] += 64
            i += 1

    def sampler():
        while not stop.is_set():
            s = t.sample(64)
            assert (s.data["obs"][:, 0, 0] == s.data["act"][:, 0]).all()
            counts["sampled"] += 64

    threads = [threading.Thread(target=writer), threading.Thread(target=sampler)]
    for th in threads:
        th.start()
    paths = [rp.checkpoint.save(tmp_path, t) for _ in range(3)]
    stop.set()
    for th in threads:
        th.join()
    info = t.info()
    assert info["num_inserts"] == 4000 + counts["inserted"]
    assert info["num_samples"] == counts["sampled"]
    for p in paths:  # every checkpoint is a consistent table: each item's data is its own
        loaded = rp.checkpoint.load(p)
        t2 = loaded["t"]
        s = t2.sample(500)
        assert (s.data["obs"][:, 0, 0] == s.data["act"][:, 0]).all()
        assert t2.info()["size"] == len(t2.items())
        close_all(loaded)


def test_inserts_and_samples_go_on_while_a_save_is_half_written(make_store, tmp_path, monkeypatch):
    """"Saving is online": a save of a 48 MB table is held half-way through writing its rows
    (its index copied, its blocks pinned, its files half written) until other threads have
    inserted and sampled. A save that kept them out for its duration fails at the deadline."""
    sig = {"obs": rp.Field((1024,), "float32"), "act": rp.Field((), "int64")}

    def items_of(n, t, start):  # obs[..., j] == act: any mix-up of rows shows
        a = np.arange(start, start + n * t, dtype=np.int64).reshape(n, t)
        return {"obs": np.repeat(a[..., None], 1024, axis=2).astype(np.float32), "act": a}

    store = make_store(sig, capacity=1 << 14, block_steps=64)
    t = rp.Table("t", store, sampler=S.Uniform(), remover=S.Fifo(), max_size=1000, seed=3)
    for i in range(3):  # 192 items of 64 steps of 4 KB: 48 MB, written in two pieces
        t.insert(items_of(64, 64, i * 4096), 1.0)
    before = t.items()
    need = 5  # inserts and samples each that must complete while the save is held
    midway = threading.Event()
    held, errors = [], []
    done = {"inserted": 0, "sampled": 0}

    class HeldHalfWay(rp.checkpoint._Progress):
        """The save's progress: holds the save once half of its rows are written."""

        def __init__(self, total, desc, enabled, unit="B"):
            super().__init__(total, desc, False, unit)
            self.total, self.written, self.desc = total, 0, desc

        def update(self, n):
            half = self.written < self.total / 2 <= self.written + n < self.total
            self.written += n
            if self.desc != "checkpoint" or not half:
                return
            held.append(self.written / self.total)
            midway.set()
            deadline = time.monotonic() + 20
            while min(done.values()) < need and not errors and time.monotonic() < deadline:
                time.sleep(0.002)
            assert not errors, errors
            assert min(done.values()) >= need, f"while the save was half-way, only {done} completed"

    monkeypatch.setattr(rp.checkpoint, "_Progress", HeldHalfWay)

    def insert(i):
        t.insert(items_of(4, 2, 100_000 + 8 * i), 1.0, timeout=20)
        done["inserted"] += 1

    def sample(i):
        s = t.sample(16, timeout=20)
        assert (s.data["obs"][:, :, 7] == s.data["act"]).all(), "a sampled item's rows were torn"
        done["sampled"] += 1

    def work(op):
        def run():
            try:
                if midway.wait(30):  # from when the save is half-way: after its index was copied
                    for i in range(need):
                        op(i)
            except BaseException as e:  # noqa: BLE001 - reported in the main thread
                errors.append(e)
        return run

    threads = [threading.Thread(target=work(insert)), threading.Thread(target=work(sample))]
    for th in threads:
        th.start()
    try:
        path = rp.checkpoint.save(tmp_path, t)
    finally:
        midway.set()
        for th in threads:
            th.join(30)
    assert not errors, errors
    assert len(held) == 1 and 0.5 <= held[0] < 1, held
    assert t.info()["num_inserts"] == 192 + 4 * need and t.info()["num_samples"] == 16 * need
    loaded = rp.checkpoint.load(path)
    try:  # the checkpoint is the table as it was when the save began
        assert loaded["t"].items() == before
        s = loaded["t"].sample(64)
        assert (s.data["obs"][:, :, 7] == s.data["act"]).all()
    finally:
        close_all(loaded)


CRASH = """
import sys, numpy as np, reprise as rp
store = rp.Store({"x": rp.Field((1024,), "float32")}, capacity=1 << 14, block_steps=64)
t = rp.Table("t", store, max_size=1 << 14, seed=0)
for i in range(16):
    t.insert({"x": np.full((1024, 1, 1024), i, np.float32)}, 1.0)
print("ready", flush=True)
while True:
    rp.checkpoint.save(sys.argv[1], t)
"""


def test_sigkill_during_save_leaves_previous_checkpoints_intact(tables, tmp_path):
    _, t, q = tables
    good = rp.checkpoint.save(tmp_path, [t, q])
    rng = np.random.default_rng(0)
    for _ in range(4):
        p = subprocess.Popen([sys.executable, "-c", CRASH, str(tmp_path)], stdout=subprocess.PIPE,
                             env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
        assert p.stdout.readline().strip() == b"ready"
        threading.Event().wait(float(rng.uniform(0.05, 0.6)))
        p.send_signal(signal.SIGKILL)
        p.wait()
    for c in rp.checkpoint.checkpoints(tmp_path):
        rp.checkpoint.verify(c)  # every complete one verifies; partial ones are hidden temporaries
    loaded = rp.checkpoint.load(good)
    assert loaded["replay"].items() == t.items()
    close_all(loaded)


def test_saves_clean_up_after_killed_ones(tables, tmp_path):
    _, t, q = tables
    stale = tmp_path / ".ckpt-00000000000000000001.tmp-999999999"
    stale.mkdir()
    (stale / "store-0.rows").write_bytes(b"partial")
    rp.checkpoint.save(tmp_path, [t, q])
    assert not stale.exists()


def test_server_checkpoint_and_restart(make_store, tmp_path):
    store = make_store(SIG, capacity=256, block_steps=8)
    t = rp.Table("replay", store, sampler=S.Uniform(), max_size=100, seed=2)
    t.insert(data(10), 1.0)
    server = rp.Server([t], checkpoint_dir=tmp_path / "ck")
    assert server.restored_from is None
    with rp.Client(server.local_address) as c:
        with c.writer() as w:
            w.append({"obs": np.zeros(3, np.float32), "act": 77})
            w.create_item("replay", 1, 1.0)
    path = server.checkpoint()
    with rp.Client(server.local_address) as c:  # clients ask the server for one
        from_client = c.checkpoint()
    assert Path(from_client).parent == tmp_path / "ck" and from_client != path
    rp.checkpoint.verify(from_client)
    path = from_client
    server.stop()
    plain = rp.Server([t])
    with pytest.raises(rp.errors.InvalidArgument, match="no checkpoint_dir"):
        plain.checkpoint()
    with rp.Client(plain.local_address) as c:
        with pytest.raises(rp.errors.InvalidArgument, match="no checkpoint directory"):
            c.checkpoint()
        assert c.info()["replay"]["size"] == 11  # the connection is still fine
    plain.stop()
    fresh_store = make_store(SIG, capacity=256, block_steps=8)
    fresh = rp.Table("replay", fresh_store, sampler=S.Uniform(), max_size=100)
    with pytest.raises(rp.errors.InvalidArgument, match="not empty"):
        rp.Server([t], checkpoint_dir=tmp_path / "ck")
    server2 = rp.Server([fresh], checkpoint_dir=tmp_path / "ck")
    try:
        assert server2.restored_from == path
        served = server2.tables[0]
        assert served is not fresh and served.items() == t.items()
        with rp.Client(server2.local_address) as c:
            assert c.info()["replay"]["size"] == 11
            assert 77 in c.sample("replay", 200).data["act"][:, 0]
    finally:
        server2.stop()
        served.store.close()


def test_a_loaded_full_store_still_makes_room(make_store, tmp_path):
    store = make_store(SIG, capacity=64, block_steps=8)
    t = rp.Table("t", store, sampler=S.Fifo(), max_size=64)
    for i in range(12):
        t.insert(data(8, 1, 8 * i), 1.0)  # the store wraps: items are evicted to make room
    loaded = rp.checkpoint.load(rp.checkpoint.save(tmp_path, t))
    try:
        t2 = loaded["t"]
        for i in range(3):
            np.testing.assert_array_equal(t.insert(data(8, 1, 500 + 8 * i), 1.0), t2.insert(data(8, 1, 500 + 8 * i), 1.0))
        assert t.items() == t2.items()
    finally:
        close_all(loaded)


def test_device_store_round_trip(tmp_path):
    torch = pytest.importorskip("torch")
    import reprise.torch as rt
    emulated = not torch.cuda.is_available()
    rt.emulate_cuda(emulated)
    try:
        store = rp.Store(SIG, capacity=128, block_steps=8, device="cuda")
        t = rp.Table("d", store, sampler=S.Uniform(), max_size=100, seed=4)
        t.insert({k: torch.from_numpy(v) for k, v in data(20, 2).items()}, priorities=1.0)
        t.sample(5)
        loaded = rp.checkpoint.load(rp.checkpoint.save(tmp_path, t))
        t2 = loaded["d"]
        assert t2.store._device_columns is not None and t2.store.device == store.device
        assert t2.items() == t.items()
        a, b = t.sample(9), t2.sample(9)
        np.testing.assert_array_equal(a.keys, b.keys)
        np.testing.assert_array_equal(a.data["obs"], b.data["obs"])
        np.testing.assert_array_equal(a.data["act"], b.data["act"])
        t2.store.close()
        store.close()
    finally:
        rt.emulate_cuda(False)


def test_server_restore_onto_a_different_store_is_refused(make_store, tmp_path):
    store = make_store(SIG, capacity=256, block_steps=8)
    t = rp.Table("replay", store, max_size=100)
    t.insert(data(5), 1.0)
    rp.checkpoint.save(tmp_path, t)
    before = set(os.listdir("/dev/shm"))
    other_sig = make_store({"obs": rp.Field((4,), "float32"), "act": rp.Field((), "int64")}, capacity=256, block_steps=8)
    small = make_store(SIG, capacity=128, block_steps=8)
    for s_, what in ((other_sig, "signature"), (small, "capacity")):
        fresh = rp.Table("replay", s_, max_size=100)
        with pytest.raises(rp.errors.InvalidArgument, match=f"saved from a store with {what}"):
            rp.Server([fresh], checkpoint_dir=tmp_path)
        assert len(fresh) == 0
    assert set(os.listdir("/dev/shm")) - before <= {os.path.basename(other_sig.path), os.path.basename(small.path)}
