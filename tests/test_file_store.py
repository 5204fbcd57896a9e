"""File stores (issue 36): ``rp.Store(..., directory=D, backing="file")`` keeps its columns
in ``D/columns`` on a disk; ``close()`` writes the tables' indexes beside them and
``rp.Store.open(D)`` maps them again with the tables, copying nothing. A store whose
process died while it was open is refused, never opened over rows that may have changed."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import reprise as rp
from reprise.errors import Corrupt, InvalidArgument
from reprise.file_store import MEMORY_FILE_SYSTEMS, file_system


SIG = {"obs": rp.Field((16,), "float32"), "img": rp.Field((24, 24), "uint8", compress="zstd"),
       "step": rp.Field((), "int64")}


def fill(store, n, first=0, tables=("t",)):
    with store.writer() as w:
        for i in range(first, first + n):
            w.append({"obs": np.full(16, i, np.float32), "img": np.full((24, 24), i % 251, np.uint8), "step": i})
            for t in tables:
                w.create_item(t, 1, 1.0 + i % 5)
            if i % 40 == 39:
                w.end_episode()


def check(sample):
    steps = sample.data["step"][:, 0]
    assert (sample.data["obs"][:, 0, 0] == steps).all()
    assert (sample.data["img"][:, 0, 3, 5] == steps % 251).all()


def test_a_file_store_reopens_with_its_tables_items_and_rows(disk):
    store = rp.Store(SIG, capacity=2048, block_steps=32, directory=disk, backing="file")
    assert store.backing == "file" and store.path == os.path.join(os.path.abspath(disk), "columns")
    assert oct(os.stat(store.path).st_mode & 0o777) == "0o600"
    t = rp.Table("t", store, sampler=rp.selectors.Prioritized(0.7), remover=rp.selectors.Fifo(), max_size=1500,
                 seed=1)
    q = rp.Table("q", store, sampler=rp.selectors.Fifo(), remover=rp.selectors.Fifo(), max_size=500)
    fill(store, 1800, tables=("t", "q"))   # wraps: FIFO evictions, blocks reused and compressed again
    items, info = t.items(), t.info()
    assert q.size == 500
    store.close()
    assert os.path.exists(os.path.join(disk, "columns")) and not os.path.exists(os.path.join(disk, "open"))

    again = rp.Store.open(disk)
    try:
        assert again.signature == SIG and again.capacity == 2048 and again.block_steps == 32
        assert set(again.tables) == {"t", "q"}
        t2 = again.tables["t"]
        assert t2.items() == items
        for k in ("size", "num_inserts", "num_evictions", "sampler", "remover", "max_size"):
            assert t2.info()[k] == info[k], k
        check(t2.sample(300))
        check(again.tables["q"].sample(50))
        # It keeps working as a store: more steps, evictions, another close and open.
        fill(again, 700, first=1800, tables=("t", "q"))
        items = t2.items()
    finally:
        again.close()
    third = rp.Store.open(disk)
    try:
        assert third.tables["t"].items() == items
        check(third.tables["t"].sample(200))
        assert len(os.listdir(os.path.join(disk, "index"))) == 1   # older indexes are removed
    finally:
        third.close()


def test_a_store_whose_process_died_while_open_is_refused_and_left_alone(disk):
    code = textwrap.dedent(f"""
        import os, signal, numpy as np, reprise as rp
        s = rp.Store({{"x": rp.Field((4,), "float32")}}, capacity=512, block_steps=16, directory={disk!r},
                     backing="file")
        t = rp.Table("t", s)
        with s.writer() as w:
            for i in range(100):
                w.append({{"x": np.full(4, i, np.float32)}})
                w.create_item("t", 1, 1.0)
        s.close()
        s = rp.Store.open({disk!r})
        with s.writer() as w:
            for i in range(100):
                w.append({{"x": np.full(4, -i, np.float32)}})
                w.create_item("t", 1, 1.0)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == -9, r.stderr
    before = sorted(os.listdir(disk))
    with pytest.raises(Corrupt, match=r"was not closed \(process \d+ had it open and is gone\).*cannot be opened"):
        rp.Store.open(disk)
    assert sorted(os.listdir(disk)) == before   # nothing changed, the marker stays


def test_an_index_saved_in_place_is_not_loaded_as_a_checkpoint(disk):
    store = rp.Store(SIG, capacity=256, block_steps=32, directory=disk, backing="file")
    t = rp.Table("t", store)  # noqa: F841 (kept alive: the index holds the tables alive at close)
    fill(store, 50)
    store.close()
    index = os.path.join(disk, "index")
    with pytest.raises(InvalidArgument, match=r"saved in place: open it with rp.Store.open"):
        rp.checkpoint.load(index)
    rp.Store.open(disk).close()   # still opens


def test_a_dataset_imported_as_a_file_store_reopens_without_copying(disk, tmp_path):
    n = 300
    np.savez(tmp_path / "d.npz", observations=np.arange(n * 3, dtype=np.float32).reshape(n, 3),
             actions=np.arange(n, dtype=np.int64), rewards=np.ones(n, np.float32),
             terminals=(np.arange(n) % 50 == 49))
    r = subprocess.run([sys.executable, "-m", "reprise.cli", "import", str(tmp_path / "d.npz"), "--window", "4",
                        "--file-store", disk], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert f"rp.Store.open({os.path.abspath(disk)!r})" in r.stdout
    store = rp.Store.open(disk)
    try:
        assert set(store.tables) == {"episodes", "windows"}
        assert store.tables["episodes"].size == 6
        s = store.tables["windows"].sample(64)
        np.testing.assert_array_equal(s.data["observations"][:, :, 0], s.data["actions"] * 3)
    finally:
        store.close()


def test_bad_file_store_arguments_are_refused_and_nothing_is_made(disk, tmp_path):
    with pytest.raises(InvalidArgument, match=r"backing must be 'memory' .* or 'file'.*got 'disk'"):
        rp.Store(SIG, capacity=64, directory=disk, backing="disk")
    with pytest.raises(InvalidArgument, match=r"backing='file' needs directory="):
        rp.Store(SIG, capacity=64, backing="file")
    with pytest.raises(InvalidArgument, match=r"neither device nor huge_pages=True"):
        rp.Store(SIG, capacity=64, directory=disk, backing="file", huge_pages=True)
    if file_system("/dev/shm") == "tmpfs":
        before = set(os.listdir("/dev/shm"))
        with pytest.raises(InvalidArgument, match=r"/dev/shm/x is on a tmpfs \(memory\).*local disk"):
            rp.Store(SIG, capacity=64, directory="/dev/shm/x", backing="file")
        assert set(os.listdir("/dev/shm")) == before
    assert not os.path.exists(disk)
    with pytest.raises(InvalidArgument, match=r"holds no file store"):
        rp.Store.open(tmp_path)
    store = rp.Store(SIG, capacity=64, directory=disk, backing="file")
    try:
        with pytest.raises(InvalidArgument, match=r"already holds a file store: open it with rp.Store.open"):
            rp.Store(SIG, capacity=64, directory=disk, backing="file")
        with pytest.raises(InvalidArgument, match=r"is open \(its lock is held"):
            rp.Store.open(disk)
    finally:
        store.close()
    if os.geteuid() != 0:
        locked = tmp_path / "ro"
        locked.mkdir(mode=0o500)
        with pytest.raises(InvalidArgument, match=r"cannot make the file store directory|not writable"):
            rp.Store(SIG, capacity=64, directory=locked / "s", backing="file")


def test_device_samples_of_a_file_store_are_read_on_the_host_and_moved(disk):
    torch = pytest.importorskip("torch")
    import reprise.torch as rt
    store = rp.Store(SIG, capacity=512, block_steps=32, directory=disk, backing="file")
    try:
        t = rp.Table("t", store)
        fill(store, 300)
        rt.emulate_cuda(True)
        try:
            s = t.sample(64, device="cuda")
            assert isinstance(s.data["obs"], torch.Tensor)
            assert (s.data["obs"][:, 0, 0].long() == s.data["step"][:, 0]).all()
            with pytest.raises(InvalidArgument, match=r"selection_device.*compressed"):
                rp.Table("g", store, selection_device="cuda")
            raw = rp.Store({"x": rp.Field((2,), "float32")}, capacity=64, directory=disk + "-raw", backing="file")
            try:
                with pytest.raises(InvalidArgument, match=r"selection_device.*it is a file store"):
                    rp.Table("g", raw, selection_device="cuda")
            finally:
                raw.close()
        finally:
            rt.emulate_cuda(False)
    finally:
        store.close()


def test_local_and_remote_clients_serve_a_file_store_that_reopens_with_what_they_wrote(disk):
    """Stacked and compressed fields on a file tier, written and read by clients."""
    sig = dict(SIG, frames=rp.Field((8, 8), "uint8", stack=3, compress="zstd"))
    store = rp.Store(sig, capacity=1024, block_steps=32, directory=disk, backing="file")
    t = rp.Table("t", store, max_size=400)
    server = rp.Server([t], address="127.0.0.1:0")
    try:
        first = 0
        for address in (server.local_address, server.address):
            with rp.Client(address) as c:
                with c.writer("t") as w:
                    for i in range(first, first + 100):
                        w.append({"obs": np.full(16, i, np.float32), "img": np.full((24, 24), i % 251, np.uint8),
                                  "step": i, "frames": np.full((8, 8), i % 251, np.uint8)})
                        w.create_item("t", 1, 1.0)
                    w.flush()
                check(c.sample("t", 64))
                if address == server.local_address:
                    # The server says it is a file store: its rows are read on the host.
                    assert c._staged("t")
            first += 100
    finally:
        server.stop()
    s = t.sample(200)
    frames = s.data["frames"][:, 0, :, 0, 0].astype(np.int64)
    steps = s.data["step"][:, 0]
    # Each client's writer is one episode: its first frames are padded with the first.
    np.testing.assert_array_equal(frames, np.maximum(steps[:, None] + np.arange(-2, 1), steps[:, None] // 100 * 100) % 251)
    store.close()
    opened = rp.Store.open(disk)
    try:
        again = opened.tables["t"].sample(200)
        check(again)
        g = again.data["frames"][:, 0, :, 0, 0].astype(np.int64)
        st = again.data["step"][:, 0]
        np.testing.assert_array_equal(g, np.maximum(st[:, None] + np.arange(-2, 1), st[:, None] // 100 * 100) % 251)
    finally:
        opened.close()


def test_packed_samples_of_a_file_store_hold_each_items_steps(disk):
    store = rp.Store(SIG, capacity=1024, block_steps=32, directory=disk, backing="file")
    try:
        t = rp.Table("t", store, max_size=500)
        with store.writer() as w:
            for i in range(600):
                w.append({"obs": np.full(16, i, np.float32), "img": np.full((24, 24), i % 251, np.uint8), "step": i})
                if i % 40 >= 2:
                    w.create_item("t", 3, 1.0)
                if i % 40 == 39:
                    w.end_episode()
        s = t.sample(64, packed=True)
        steps = s.packed_data["step"]
        assert len(steps) == 3 * 64
        np.testing.assert_array_equal(s.packed_data["obs"][:, 0], steps)
        np.testing.assert_array_equal(s.packed_data["img"][:, 3, 5], steps % 251)
        np.testing.assert_array_equal(np.diff(steps.reshape(64, 3), axis=1), 1)
    finally:
        store.close()


def test_a_transition_buffer_in_a_file_store_reopens_with_its_transitions(disk):
    buf = rp.TransitionBuffer(300, (4,), "float32", n_step=3, gamma=0.5, alpha=0.6, seed=1,
                              directory=disk, backing="file")
    obs = np.zeros(4, np.float32)
    for i in range(250):
        nxt = np.full(4, i + 1, np.float32)
        buf.add(obs, i % 3, 1.0, nxt, False, i % 50 == 49)
        obs = np.zeros(4, np.float32) if i % 50 == 49 else nxt
    # 5 episodes of 50 ended; the sixth has none: every transition is an item.
    buf.update_priorities(buf.sample(8).keys, np.full(8, 7.0))
    held = len(buf)
    before = buf.sample(300)
    buf.close()
    again = rp.TransitionBuffer.open(disk)
    try:
        assert len(again) == held == 250
        assert again._max_priority >= 7.0   # new transitions keep getting the largest priority
        s = again.sample(300)
        # Rows and the n-step targets they give are what the closed buffer sampled.
        by_key = {int(k): (o.tolist(), float(r)) for k, o, r in zip(before.keys, before.obs, before.reward)}
        common = [int(k) for k in s.keys if int(k) in by_key]
        assert len(common) > 100
        for k, o, r in zip(s.keys, s.obs, s.reward):
            if int(k) in by_key:
                assert by_key[int(k)] == (o.tolist(), float(r))
        again.add(np.zeros(4, np.float32), 0, 1.0, np.ones(4, np.float32), True, False)
        assert len(again) == 251
    finally:
        again.close()
    with pytest.raises(InvalidArgument, match="not a TransitionBuffer's"):
        plain = rp.Store({"x": rp.Field((), "float32")}, capacity=64, directory=disk + "-plain", backing="file")
        plain.close()
        rp.TransitionBuffer.open(disk + "-plain")
