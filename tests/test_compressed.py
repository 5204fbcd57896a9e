"""Compressed columns (issue 36): ``Field(compress="zstd")`` stores a block's rows as
zstd frames once the block is written whole. Every path that reads rows (in-process
samples, local and remote serving, checkpoints, pickling, the GPU path through the
host, the transition buffer's row reader) returns exactly what was written; the raw
pages of compressed blocks are given back."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import reprise as rp
from reprise.errors import InvalidArgument

FRAME = (32, 32)


def frames(n: int, seed: int = 0) -> np.ndarray:
    """Atari-like frames: a flat background, a moving block and a counter row."""
    out = np.full((n, *FRAME), 87, np.uint8)
    for i in range(n):
        x = (i * 3 + seed) % 24
        out[i, 8:14, x:x + 6] = 200
        out[i, -1, :] = (i + seed) % 256
    return out


def signature(compress: bool, level=None) -> dict:
    c = dict(compress="zstd", level=level) if compress else {}
    return {"obs": rp.Field(FRAME, "uint8", **c), "step": rp.Field((), "int64")}


def fill(store: rp.Store, table: str, n: int, length: int = 1, seed: int = 0) -> np.ndarray:
    """n steps in episodes of 25, an item over the last ``length`` steps at each step."""
    obs = frames(n, seed)
    with store.writer() as w:
        for i in range(n):
            w.append({"obs": obs[i], "step": i})
            if i % 25 >= length - 1:
                w.create_item(table, length, 1.0 + i % 7)
            if i % 25 == 24:
                w.end_episode()
        w.flush()
    return obs


def twins(capacity=2048, block_steps=16, max_size=1000, sampler=None, level=None):
    """A compressed store and a raw one, each with a table seeded alike."""
    out = []
    for compress in (True, False):
        s = rp.Store(signature(compress, level), capacity=capacity, block_steps=block_steps)
        t = rp.Table("t", s, sampler=sampler or rp.selectors.Uniform(), remover=rp.selectors.Fifo(),
                     max_size=max_size, seed=11)
        out.append((s, t))
    return out


def assert_same(a: rp.Sample, b: rp.Sample):
    np.testing.assert_array_equal(a.keys, b.keys)
    np.testing.assert_array_equal(a.lengths, b.lengths)
    for name in b.data:
        np.testing.assert_array_equal(np.asarray(a.data[name]), np.asarray(b.data[name]), err_msg=name)


def test_samples_of_a_compressed_store_equal_the_raw_stores_and_take_far_less_memory():
    (cs, ct), (rs, rt_) = twins(capacity=4096, block_steps=64, max_size=3000)
    try:
        obs = fill(cs, "t", 3000, length=3)
        fill(rs, "t", 3000, length=3)
        for n in (1, 7, 256):
            assert_same(ct.sample(n), rt_.sample(n))
        s = ct.sample(64)
        steps = s.data["step"]
        np.testing.assert_array_equal(s.data["obs"], obs[steps])   # exactly what was written
        m = cs.memory()
        assert cs.compressed_fields == {"obs"}
        assert m["raw_bytes"] == 4096 * (32 * 32 + 8)
        f = m["fields"]["obs"]
        assert f["blocks"] >= 3000 // 64 - 1 and f["ratio"] > 8, f
        # The raw store wrote 3000 rows of 1 KiB; the compressed one keeps far fewer pages.
        assert m["stored_bytes"] < rs.memory()["stored_bytes"] / 3, (m, rs.memory())
        assert rs.memory()["fields"] == {}
    finally:
        cs.close()
        rs.close()


def test_a_store_that_wraps_many_times_reads_back_what_its_items_hold():
    (cs, ct), (rs, rt_) = twins(capacity=256, block_steps=16, max_size=150)
    try:
        for seed in range(6):   # each round evicts the last: blocks are compressed, freed, leased again
            fill(cs, "t", 200, length=2, seed=seed)
            fill(rs, "t", 200, length=2, seed=seed)
            assert ct.size == rt_.size
            assert_same(ct.sample(64), rt_.sample(64))
        assert cs.memory()["fields"]["obs"]["blocks"] > 0
    finally:
        cs.close()
        rs.close()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dtype=st.sampled_from(["bool", "int8", "uint8", "int16", "float16", "int32", "float32", "int64",
                              "uint64", "float64"]),
       shape=st.sampled_from([(), (3,), (4, 5)]),
       block_steps=st.sampled_from([1, 2, 5, 16]),
       level=st.sampled_from([1, 3, 19]),
       episodes=st.lists(st.integers(1, 30), min_size=1, max_size=8),
       length=st.integers(1, 4),
       noisy=st.booleans(),
       seed=st.integers(0, 2**16))
def test_every_dtype_round_trips_against_a_raw_store(dtype, shape, block_steps, level, episodes, length, noisy,
                                                     seed):
    """Writers of random episodes into a compressed and a raw store, then the same
    seeded draws from both: equal data, whatever the dtype, block size, level and
    compressibility (noise stays raw: KEPT)."""
    rng = np.random.default_rng(seed)
    stores = []
    try:
        tables = []
        for compress in (True, False):
            sig = {"x": rp.Field(shape, dtype, compress="zstd" if compress else None, level=level if compress else None)}
            s = rp.Store(sig, capacity=512, block_steps=block_steps)
            stores.append(s)
            tables.append(rp.Table("t", s, sampler=rp.selectors.Uniform(), remover=rp.selectors.Fifo(),
                                   max_size=400, seed=seed))
        total = sum(episodes)
        if noisy:
            raw = rng.integers(0, 256, size=(total, *shape, np.dtype(dtype).itemsize), dtype=np.uint8)
        else:
            raw = np.repeat(rng.integers(0, 3, size=(total, 1), dtype=np.uint8),
                            int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize, axis=1)
        data = raw.reshape(total, -1).view(dtype).reshape(total, *shape)
        for s, t in zip(stores, tables):
            at = 0
            with s.writer() as w:
                for e in episodes:
                    for i in range(e):
                        w.append({"x": data[at]})
                        at += 1
                        if i + 1 >= length:
                            w.create_item("t", length, 1.0)
                    w.end_episode()
        if tables[1].size == 0:
            return
        a, b = tables[0].sample(32), tables[1].sample(32)
        assert_same(a, b)
    finally:
        for s in stores:
            s.close()


def test_checkpoint_and_pickle_round_trips_keep_the_compression_and_the_data(tmp_path):
    (cs, ct), (rs, _) = twins(capacity=1024, block_steps=16, max_size=500)
    rs.close()
    try:
        obs = fill(cs, "t", 400, length=2)
        path = rp.checkpoint.save(tmp_path / "ck", [ct])
        loaded = rp.checkpoint.load(path)["t"]
        try:
            assert loaded.store.signature["obs"] == rp.Field(FRAME, "uint8", compress="zstd")
            assert loaded.store.memory()["fields"]["obs"]["blocks"] > 0   # restored blocks are compressed
            assert loaded.size == ct.size
            keys = sorted(k for k, *_ in ct.items())
            assert sorted(k for k, *_ in loaded.items()) == keys
            s = loaded.sample(128)
            np.testing.assert_array_equal(s.data["obs"][:, 1], obs[s.data["step"][:, 1]])
        finally:
            loaded.store.close()
        copy = pickle.loads(pickle.dumps(ct))
        try:
            assert copy.store.compressed_fields == {"obs"}
            s = copy.sample(64)
            np.testing.assert_array_equal(s.data["obs"][:, 0], obs[s.data["step"][:, 0]])
        finally:
            copy.store.close()
    finally:
        cs.close()


def test_local_and_remote_clients_read_and_write_compressed_rows():
    store = rp.Store(signature(True), capacity=2048, block_steps=16)
    table = rp.Table("t", store, sampler=rp.selectors.Uniform(), remover=rp.selectors.Fifo(), max_size=1000)
    server = rp.Server([table], address="127.0.0.1:0")
    try:
        obs = frames(300)
        for address in (server.local_address, server.address):
            with rp.Client(address) as c:
                # A client's writer fills and compresses blocks in the shared columns
                # (local) or through the server (remote).
                with c.writer("t") as w:
                    for i in range(150):
                        w.append({"obs": obs[i], "step": i})
                        w.create_item("t", 1, 1.0)
                    w.flush()
                s = c.sample("t", 200)
                np.testing.assert_array_equal(s.data["obs"][:, 0], obs[s.data["step"][:, 0]])
                for batch in c.iterate("t", 16, num_batches=2):
                    np.testing.assert_array_equal(batch.data["obs"][:, 0], obs[batch.data["step"][:, 0]])
        assert store.memory()["fields"]["obs"]["blocks"] >= 2 * (150 // 16) - 2
    finally:
        server.stop()
        store.close()


def test_device_samples_go_through_the_host_and_hold_what_was_written():
    torch = pytest.importorskip("torch")
    import reprise.torch as rt
    (cs, ct), (rs, _) = twins()
    rs.close()
    try:
        obs = torch.from_numpy(fill(cs, "t", 500))

        def check(s):
            assert isinstance(s.data["obs"], torch.Tensor)
            steps = s.data["step"].cpu().long()
            assert torch.equal(s.data["obs"].cpu(), obs[steps])

        rt.emulate_cuda(True)
        try:
            for device in ("cpu", "cuda"):
                check(ct.sample(32, device=device))
                for batch in ct.iterate(8, device=device, num_batches=2):
                    check(batch)
            check(ct.sample(tokens=5, device="cuda"))
        finally:
            rt.emulate_cuda(False)
    finally:
        cs.close()


def test_a_transition_buffer_with_compressed_frame_stacks_samples_what_the_raw_one_does():
    torch = pytest.importorskip("torch")
    bufs = [rp.TransitionBuffer(500, (4, *FRAME), "uint8", n_step=3, frame_stack=4, seed=5,
                                compress=c) for c in ("zstd", None)]
    try:
        obs = frames(400)
        for buf in bufs:
            for i in range(300):
                stack = obs[max(0, i - 3):i + 1]
                stack = np.concatenate([np.repeat(stack[:1], 4 - len(stack), 0), stack])
                nxt = np.concatenate([stack[1:], obs[i + 1][None]])
                buf.add(stack, i % 4, 1.0, nxt, i % 50 == 49, False)
        a, b = bufs[0].sample(64), bufs[1].sample(64)
        for name in ("obs", "next_obs", "action", "reward", "done", "discount"):
            assert torch.equal(getattr(a, name), getattr(b, name)), name
        assert bufs[0]._store.memory()["stored_bytes"] < bufs[1]._store.memory()["stored_bytes"] / 3
    finally:
        for buf in bufs:
            buf._store.close()


def test_bad_compression_settings_are_refused_and_nothing_is_made():
    import glob
    before = set(glob.glob("/dev/shm/reprise-*"))
    with pytest.raises(InvalidArgument, match=r"compress='lz4'.*'zstd'"):
        rp.Field(FRAME, "uint8", compress="lz4")
    with pytest.raises(InvalidArgument, match=r"level=0.*1 to 19"):
        rp.Field(FRAME, "uint8", compress="zstd", level=0)
    with pytest.raises(InvalidArgument, match=r"level=20.*1 to 19"):
        rp.Field(FRAME, "uint8", compress="zstd", level=20)
    with pytest.raises(InvalidArgument, match=r"level=3 needs compress='zstd'"):
        rp.Field(FRAME, "uint8", level=3)
    with pytest.raises(InvalidArgument, match=r"field 'obs' is compressed.*GPU memory"):
        rp.Store(signature(True), capacity=64, device="cuda")
    with pytest.raises(InvalidArgument, match=r"compressed fields cannot be on huge pages"):
        rp.Store(signature(True), capacity=64, huge_pages=True, directory="/dev/shm")
    with pytest.raises(InvalidArgument, match=r"observation or action: .*compress='gzip'"):
        rp.TransitionBuffer(100, FRAME, "uint8", compress="gzip")
    store = rp.Store(signature(True), capacity=64)
    try:
        with pytest.raises(InvalidArgument, match=r"selection_device.*\['obs'\].*compressed"):
            rp.Table("t", store, sampler=rp.selectors.Uniform(), remover=rp.selectors.Fifo(), max_size=10,
                     selection_device="cuda")
        assert store.table_names() == [] if hasattr(store, "table_names") else True
    finally:
        store.close()
    assert set(glob.glob("/dev/shm/reprise-*")) == before
    assert repr(rp.Field(FRAME, "uint8", compress="zstd", level=5)) == \
        "Field((32, 32), 'uint8', compress='zstd', level=5)"


def test_the_frame_benchmark_runs_on_a_small_file(tmp_path, capsys):
    """benchmarks/frames on synthetic frames (no ale-py): Reprise's three arms report
    bytes and samples, and frame stacks with zstd hold the least."""
    pytest.importorskip("torch")
    import json

    from benchmarks.frames import systems
    n = 400
    first = np.zeros(n + 1, bool)
    first[[0, 180]] = True
    big = np.zeros((n + 1, 84, 84), np.uint8)
    big[:, :32, :32] = frames(n + 1)
    np.savez(tmp_path / "f.npz", frames=big, first=first, action=np.arange(n + 1) % 6,
             reward=np.zeros(n + 1, np.float32), terminated=np.isin(np.arange(n + 1), [179]),
             truncated=np.zeros(n + 1, bool))
    out = {}
    for system in ("reprise-raw", "reprise-stack", "reprise-zstd"):
        assert systems.main([system, str(tmp_path / "f.npz"), "300"]) == 0
        r = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert r["size"] == 300 and r["sample_us"] > 0, r
        out[system] = r["bytes"]
    assert out["reprise-zstd"] < out["reprise-stack"] < out["reprise-raw"], out
