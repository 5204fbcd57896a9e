"""Stacked fields (issue 36): ``Field(shape, dtype, stack=k)`` stores one frame per step
and samples each step as the last k frames of its episode, ``[n, T, k, *shape]``, padded
at an episode's start as gymnasium's ``FrameStackObservation`` pads (the first frame, or
zeros). Every path that reads steps (in-process, local and remote clients, checkpoints,
pickles, file stores, device samples, batch inserts) returns the same stacks."""

from __future__ import annotations

import os
import pickle

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import reprise as rp
from reprise.errors import InvalidArgument

FRAME = (6, 5)


def frame(i: int) -> np.ndarray:
    """A frame that names its step: every pixel i mod 251, plus a gradient."""
    return ((np.arange(30).reshape(FRAME) + i * 7) % 251).astype(np.uint8)


def reference(frames: list, k: int, padding: str) -> list:
    """The stack of each step of an episode, as FrameStackObservation gives it."""
    pad = frames[0] if padding == "reset" else np.zeros_like(frames[0])
    window = [pad] * (k - 1)
    out = []
    for f in frames:
        window = (window + [f])[-k:]
        out.append(np.stack(window))
    return out


def make(k=4, padding="reset", compress=False, block_steps=16, capacity=1024, **store):
    c = dict(compress="zstd") if compress else {}
    s = rp.Store({"obs": rp.Field(FRAME, "uint8", stack=k, padding=padding, **c), "step": rp.Field((), "int64")},
                 capacity=capacity, block_steps=block_steps, **store)
    t = rp.Table("t", s, sampler=rp.selectors.Uniform(), remover=rp.selectors.Fifo(), max_size=capacity // 2, seed=3)
    return s, t


def write(w, table: str, episodes, n: int, k: int, padding: str, start: int = 0) -> dict:
    """Episodes of the given lengths, an item of up to n + 1 steps at each step; returns
    ``{step id: expected stack}``."""
    expected = {}
    sid = start
    for length in episodes:
        ids = list(range(sid, sid + length))
        for j, i in enumerate(ids):
            w.append({"obs": frame(i), "step": i})
            w.create_item(table, min(j + 1, n + 1), 1.0)
        expected.update(zip(ids, reference([frame(i) for i in ids], k, padding)))
        w.end_episode()
        sid += length
    return expected


def check(sample, expected: dict, k: int):
    obs, steps = np.asarray(sample.data["obs"]), np.asarray(sample.data["step"])
    assert obs.shape[2:] == (k, *FRAME)
    for i in range(len(steps)):
        for t in range(int(sample.lengths[i])):
            np.testing.assert_array_equal(obs[i, t], expected[int(steps[i, t])], err_msg=f"item {i} step {t}")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(k=st.integers(2, 5), padding=st.sampled_from(["reset", "zero"]), compress=st.booleans(),
       block_steps=st.integers(5, 24), n=st.integers(0, 4), extend=st.booleans(),
       episodes=st.lists(st.integers(1, 40), min_size=1, max_size=6))
def test_stacks_equal_frame_stacking_of_each_episode(k, padding, compress, block_steps, n, extend, episodes):
    block_steps = max(block_steps, k)
    s, t = make(k, padding, compress, block_steps, capacity=4096)
    try:
        w = s.writer()
        if extend:
            # Whole episodes in one extend each, then one item per step.
            expected, sid = {}, 0
            for length in episodes:
                ids = np.arange(sid, sid + length)
                w.extend({"obs": np.stack([frame(i) for i in ids]), "step": ids})
                w.create_items("t", 1, np.ones(length))
                expected.update(zip(ids.tolist(), reference([frame(i) for i in ids], k, padding)))
                w.end_episode()
                sid += length
        else:
            expected = write(w, "t", episodes, n, k, padding)
        w.close()
        check(t.sample(64), expected, k)
    finally:
        s.close()


def test_stacks_are_what_gymnasiums_frame_stack_observation_gave_the_agent():
    gym = pytest.importorskip("gymnasium")

    class Frames(gym.Env):
        """Frames that name their step; episodes of 7 to 30 steps."""
        observation_space = gym.spaces.Box(0, 255, FRAME, np.uint8)
        action_space = gym.spaces.Discrete(2)

        def reset(self, seed=None, options=None):
            super().reset(seed=seed)
            self.i = int(self.np_random.integers(0, 10_000))
            self.left = int(self.np_random.integers(7, 30))
            return frame(self.i), {}

        def step(self, action):
            self.i += 1
            self.left -= 1
            return frame(self.i), 0.0, self.left == 0, False, {}

    for padding in ("reset", "zero"):
        env = gym.wrappers.FrameStackObservation(Frames(), 4, padding_type=padding)
        s = rp.Store({"obs": rp.Field(FRAME, "uint8", stack=4, padding=padding, compress="zstd"),
                      "seen": rp.Field((), "int64")}, capacity=2048, block_steps=32)
        t = rp.Table("t", s, sampler=rp.selectors.Uniform(), remover=rp.selectors.Fifo(), max_size=1024)
        seen = []   # every stack the agent saw, by its index
        w = s.writer()
        obs, _ = env.reset(seed=5)
        for _ in range(600):
            w.append({"obs": obs[-1], "seen": len(seen)})   # the newest frame only
            seen.append(obs)
            w.create_item("t", min(4, w.episode_steps), 1.0)   # n-step items: obs and next obs
            obs, _, terminated, truncated, _ = env.step(0)
            if terminated or truncated:
                w.append({"obs": obs[-1], "seen": len(seen)})
                seen.append(obs)
                w.create_item("t", min(4, w.episode_steps), 1.0)
                w.end_episode()
                obs, _ = env.reset()
        w.close()
        sample = t.sample(200)
        for i in range(200):
            for j in range(int(sample.lengths[i])):
                np.testing.assert_array_equal(sample.data["obs"][i, j], seen[sample.data["seen"][i, j]])
        s.close()


def test_each_frame_is_stored_once_and_compressed():
    s, t = make(k=4, compress=True, block_steps=64, capacity=4096)
    try:
        write(s.writer(), "t", [500, 500, 500], n=3, k=4, padding="reset")
        m = s.memory()
        assert m["raw_bytes"] == 4096 * (30 + 8)   # one 30-byte frame a step, not 120
        assert s.signature["obs"].sample_shape == (4, *FRAME)
        assert t.sample(5).data["obs"].shape == (5, 4, 4, *FRAME)
    finally:
        s.close()


def test_batch_inserts_are_episodes_of_their_own():
    s, t = make(k=3, padding="zero", block_steps=8)
    try:
        frames = np.stack([frame(i) for i in range(12)]).reshape(4, 3, *FRAME)
        t.insert({"obs": frames, "step": np.arange(12).reshape(4, 3)}, priorities=np.ones(4))
        expected = {}
        for item in range(4):
            ids = list(range(3 * item, 3 * item + 3))
            expected.update(zip(ids, reference([frame(i) for i in ids], 3, "zero")))
        check(t.sample(32), expected, 3)
    finally:
        s.close()


def test_checkpoints_pickles_and_file_stores_keep_the_stacks(tmp_path):
    s, t = make(k=4, compress=True, block_steps=16)
    try:
        expected = write(s.writer(), "t", [40, 3, 70], n=3, k=4, padding="reset")
        path = rp.checkpoint.save(tmp_path / "ckpt", [t])
        t2 = rp.checkpoint.load(path)["t"]
        assert t2.store.signature == s.signature
        check(t2.sample(100), expected, 4)
        t3 = pickle.loads(pickle.dumps(t))
        check(t3.sample(100), expected, 4)
        for x in (t2, t3):
            x.store.close()
    finally:
        s.close()
    d = tmp_path / "fs"
    fs, ft = make(k=4, padding="zero", compress=True, block_steps=16, directory=d, backing="file")
    expected = write(fs.writer(), "t", [40, 3, 70], n=3, k=4, padding="zero")
    fs.close()
    opened = rp.Store.open(d)
    try:
        assert opened.signature["obs"] == rp.Field(FRAME, "uint8", compress="zstd", stack=4, padding="zero")
        check(opened.tables["t"].sample(100), expected, 4)
    finally:
        opened.close()


def test_local_and_remote_clients_write_and_read_stacks():
    s, t = make(k=4, padding="zero", block_steps=16, capacity=4096)
    server = rp.Server([t], address="127.0.0.1:0")
    try:
        expected, start = {}, 0
        for address in (server.local_address, server.address):
            with rp.Client(address) as c:
                # Local clients pad and copy frames in the shared columns; remote ones
                # through the server's writer.
                with c.writer("t") as w:
                    expected.update(write(w, "t", [30, 2, 25], n=2, k=4, padding="zero", start=start))
                    w.flush()
                start += 100
                check(c.sample("t", 100), expected, 4)
                for batch in c.iterate("t", 16, num_batches=2):
                    check(batch, expected, 4)
                # Every way to ask reports the store's bytes, as Store.memory() does.
                assert c.info()["t"]["store"]["raw_bytes"] == s.memory()["raw_bytes"] == 4096 * (30 + 8)
        check(t.sample(100), expected, 4)
    finally:
        server.stop()
        s.close()


def test_device_samples_are_assembled_on_the_host():
    torch = pytest.importorskip("torch")
    import reprise.torch as rt
    s, t = make(k=2, compress=False, block_steps=16)
    try:
        expected = write(s.writer(), "t", [50], n=1, k=2, padding="reset")
        assert s._staged and "stacked" in s._staged
        rt.emulate_cuda(True)
        try:
            for device in ("cpu", "cuda"):
                sample = t.sample(20, device=device)
                assert isinstance(sample.data["obs"], torch.Tensor) and sample.data["obs"].shape[2] == 2
                check(rp.Sample(keys=sample.keys, probabilities=sample.probabilities, table_size=sample.table_size,
                                priorities=sample.priorities, times_sampled=sample.times_sampled,
                                lengths=np.asarray(sample.lengths),
                                data={k: v.cpu().numpy() for k, v in sample.data.items()}), expected, 2)
        finally:
            rt.emulate_cuda(False)
    finally:
        s.close()


def shm_files() -> set:
    return {f for f in os.listdir("/dev/shm") if f.startswith(f"reprise-{os.getpid()}-")}


def test_bad_stacks_are_refused_and_nothing_is_made():
    before = shm_files()
    for kwargs, words in [
        (dict(stack=0), ["stack=0", "1 (no stack) to 64"]),
        (dict(stack=65), ["stack=65", "1 (no stack) to 64"]),
        (dict(stack=2.0), ["stack=2.0"]),
        (dict(stack=4, padding="edge"), ["padding='edge'", "'reset'", "'zero'"]),
        (dict(padding="zero"), ["padding='zero'", "needs stack > 1"]),
    ]:
        with pytest.raises(InvalidArgument) as e:
            rp.Field(FRAME, "uint8", **kwargs)
        assert all(w in str(e.value) for w in words), str(e.value)
    with pytest.raises(InvalidArgument) as e:
        make(k=8, block_steps=4)
    assert "stacks 8 frames" in str(e.value) and "block_steps must be at least" in str(e.value)
    with pytest.raises(InvalidArgument) as e:
        rp.Store({"obs": rp.Field(FRAME, "uint8", stack=4)}, capacity=64, device="cuda")
    assert "'obs' is stacked" in str(e.value) and "device=None" in str(e.value)
    assert shm_files() == before
    s, t = make(k=4)
    try:
        w = s.writer()
        with pytest.raises(InvalidArgument) as e:
            w.append({"obs": np.zeros((4, *FRAME), np.uint8), "step": 0})   # a whole stack
        assert "'obs'" in str(e.value) and "uint8[6,5]" in str(e.value)
        assert w.episode_steps == 0 and len(t) == 0
    finally:
        s.close()


def test_field_reprs_and_sample_shapes():
    f = rp.Field((84, 84), "uint8", compress="zstd", stack=4, padding="zero")
    assert repr(f) == "Field((84, 84), 'uint8', compress='zstd', level=3, stack=4, padding='zero')"
    assert f.sample_shape == (4, 84, 84) and f.nbytes == 84 * 84
    assert rp.Field((3,), "float32").sample_shape == (3,)


def test_the_sizing_warning_counts_the_frames_copied_into_each_block():
    from reprise.errors import CapacityWarning
    s = rp.Store({"obs": rp.Field(FRAME, "uint8", stack=4)}, capacity=1024 + 2 * 16, block_steps=16)
    try:
        # 1000 steps need 1001 x 16/13 + 32 = 1264 rows: 3 of every 16 are copies.
        with pytest.warns(CapacityWarning, match=r"max_size=1000 needs a store of at least 1264 steps.*16/13"):
            rp.Table("t", s, sampler=rp.selectors.Uniform(), remover=rp.selectors.Fifo(), max_size=1000)
    finally:
        s.close()
