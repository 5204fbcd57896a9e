"""TransitionBuffer (reprise.transitions): n-step transitions over shared rows, against a
plain reference model and against Stable-Baselines3's NStepReplayBuffer; episodes ended
early; pickled copies; prioritized sampling statistics; exact capacity; bad inputs change
nothing."""

import os
import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import reprise as rp

torch = pytest.importorskip("torch")
rt = pytest.importorskip("reprise.torch")
from reprise.torch.collect import wait_released  # noqa: E402

HAS_CUDA = torch.cuda.is_available()
# Upper 0.1% points of the chi-square distribution, by degrees of freedom.
CHI2_999 = {5: 20.515, 7: 24.322}
CONTINUE, TERMINATED, TRUNCATED, BOTH, CUT = 0, 1, 2, 3, 4  # CUT: an add, then end_episode(env)


# --- helpers ----------------------------------------------------------------------------------------


def make_steps(codes, rng, obs_dim=3):
    """Per environment, the add() arguments of each step: ``codes[e][t]`` says how step t ends.
    Observations are random, so a transition is known by its first observation."""
    streams = []
    for env_codes in codes:
        steps, obs = [], rng.standard_normal(obs_dim).astype(np.float32)
        for code in env_codes:
            nxt = rng.standard_normal(obs_dim).astype(np.float32)
            steps.append(dict(obs=obs, action=int(rng.integers(0, 5)), reward=float(np.float32(rng.standard_normal())),
                              next_obs=nxt, terminated=code in (TERMINATED, BOTH), truncated=code in (TRUNCATED, BOTH),
                              cut=code == CUT))
            obs = rng.standard_normal(obs_dim).astype(np.float32) if code else nxt
        streams.append(steps)
    return streams


def feed(buf, streams):
    """Adds the streams side by side (one vector add per step, then end_episode for each CUT)."""
    for t in range(len(streams[0])):
        rows = [s[t] for s in streams]
        buf.add(np.stack([r["obs"] for r in rows]), np.array([r["action"] for r in rows]),
                np.array([r["reward"] for r in rows], np.float32), np.stack([r["next_obs"] for r in rows]),
                np.array([r["terminated"] for r in rows]), np.array([r["truncated"] for r in rows]))
        for e, r in enumerate(rows):
            if r["cut"]:
                buf.end_episode(e)


def reference(streams, n, gamma):
    """Every transition whose window is complete: {first obs: (action, return, next_obs, done, discount)}.
    An episode ended by end_episode (CUT) is a truncated one."""
    out = {}
    for steps in streams:
        episode = []
        for i, s in enumerate(steps):
            episode.append(s)
            ended = s["terminated"] or s["truncated"] or s["cut"]
            if not ended and i + 1 < len(steps):
                continue
            L = len(episode)
            for t in range(L):
                if not ended and t + n > L:
                    continue  # window not complete yet
                m = min(n, L - t)
                ret = sum(gamma ** k * episode[t + k]["reward"] for k in range(m))
                done = ended and t + m == L and episode[-1]["terminated"]
                out[episode[t]["obs"].tobytes()] = (episode[t]["action"], ret, episode[t + m - 1]["next_obs"],
                                                    float(done), 0.0 if done else gamma ** m)
            episode = []
    return out


def drawn(buf, per_item=60, **kw):
    """Every transition held, by first observation (a seeded draw of per_item x size covers each
    of them with probability 1 - e^-60)."""
    b = buf.sample(per_item * len(buf), **kw)
    out = {}
    for i in range(len(b.keys)):
        out[b.obs[i].cpu().numpy().tobytes()] = (int(b.action[i]), float(b.reward[i]), b.next_obs[i].cpu().numpy(),
                                                 float(b.done[i]), float(b.discount[i]))
    return out


def assert_match(got, expected):
    assert got.keys() == expected.keys()
    for k, (a, ret, nxt, done, disc) in expected.items():
        ga, gret, gnxt, gdone, gdisc = got[k]
        assert ga == a and gdone == done
        np.testing.assert_array_equal(gnxt, nxt)
        assert gret == pytest.approx(ret, rel=1e-6, abs=1e-6)
        assert gdisc == pytest.approx(disc, rel=1e-6, abs=1e-7)


def buffer(capacity=1000, n_envs=1, obs_shape=(3,), **kw):
    kw.setdefault("seed", 0)
    return rp.TransitionBuffer(capacity, obs_shape, n_envs=n_envs, **kw)


# --- behaviour --------------------------------------------------------------------------------------


CODES = st.sampled_from([CONTINUE] * 4 + [TERMINATED, TRUNCATED, BOTH, CUT])


@settings(max_examples=40, deadline=None)
@given(data=st.data(), n_envs=st.integers(1, 3), n=st.integers(1, 4), seed=st.integers(0, 2**16))
def test_transitions_match_a_reference_model_for_any_episode_ends(data, n_envs, n, seed):
    length = data.draw(st.integers(1, 14))
    env_codes = [data.draw(st.lists(CODES, min_size=length, max_size=length)) for _ in range(n_envs)]
    streams = make_steps(env_codes, np.random.default_rng(seed))
    with buffer(n_envs=n_envs, n_step=n, gamma=0.9, block_steps=4) as buf:
        feed(buf, streams)
        expected = reference(streams, n, 0.9)
        assert len(buf) == len(expected)
        if expected:
            assert_match(drawn(buf), expected)


def test_a_window_stops_at_truncation_and_keeps_bootstrapping():
    with buffer(n_step=3, gamma=0.5) as buf:
        o = [np.full(3, i, np.float32) for i in range(4)]
        buf.add(o[0], 1, 1.0, o[1], False, False)
        buf.add(o[1], 2, 2.0, o[2], False, True)   # truncated: s_2 is not terminal
        got = drawn(buf)
        assert got[o[0].tobytes()][1:2] == (1.0 + 0.5 * 2.0,)
        assert got[o[0].tobytes()][3:] == (0.0, 0.25)   # done 0, discount gamma^2
        assert got[o[1].tobytes()][3:] == (0.0, 0.5)
        buf.add(o[2], 3, 4.0, o[3], True, True)    # both: terminated
        t = drawn(buf)[o[2].tobytes()]
        assert (t[1], t[3], t[4]) == (4.0, 1.0, 0.0)
        np.testing.assert_array_equal(t[2], o[3])


def test_a_transition_is_held_once_its_window_is_complete():
    with buffer(n_step=3) as buf:
        o = np.zeros(3, np.float32)
        sizes = []
        for t in range(4):
            buf.add(o + t, 0, 1.0, o + t + 1, False, False)
            sizes.append(len(buf))
        buf.add(o + 4, 0, 1.0, o + 5, True, False)
        assert sizes == [0, 0, 1, 2] and len(buf) == 5
    with buffer(n_step=1) as buf:
        buf.add(np.zeros(3, np.float32), 0, 1.0, np.ones(3, np.float32), False, False)
        assert len(buf) == 1


def test_each_observation_is_stored_once():
    """An episode of L steps takes L + 1 rows of one block, however long the windows."""
    with buffer(capacity=100, n_step=4, block_steps=64) as buf:
        free = buf.store.free_blocks
        streams = make_steps([[CONTINUE] * 9 + [TERMINATED]], np.random.default_rng(0))
        feed(buf, streams)
        assert len(buf) == 10 and buf.store.free_blocks == free - 1
        assert sorted(length for *_, length in buf.table.items()) == [2, 3, 4, 5] + [5] * 6


def test_vector_envs_keep_their_own_episodes():
    """Three environments ending at different steps: no window crosses an episode or an environment."""
    ends = [[CONTINUE, TERMINATED, CONTINUE, CONTINUE, CONTINUE, TRUNCATED],
            [CONTINUE] * 5 + [TERMINATED],
            [TRUNCATED, CONTINUE, BOTH, CONTINUE, CONTINUE, CONTINUE]]
    streams = make_steps(ends, np.random.default_rng(3))
    with buffer(n_envs=3, n_step=2, gamma=0.8) as buf:
        feed(buf, streams)
        expected = reference(streams, 2, 0.8)
        assert len(buf) == len(expected) == 6 + 6 + 5
        assert_match(drawn(buf), expected)


def test_batch_dtypes_and_shapes():
    with buffer(obs_shape=(4, 6, 6), obs_dtype="uint8", action_shape=(2,), action_dtype="float32",
                alpha=0.6, n_step=2) as buf:
        rng = np.random.default_rng(0)
        for t in range(5):
            buf.add(rng.integers(0, 255, (4, 6, 6), dtype=np.uint8), rng.standard_normal(2).astype(np.float32), 1,
                    rng.integers(0, 255, (4, 6, 6), dtype=np.uint8), t == 4, False)
        for device in (None, "cpu"):
            b = buf.sample(7, device=device)
            assert isinstance(b, rp.TransitionBatch)
            assert (b.obs.dtype, b.next_obs.dtype, b.action.dtype) == (torch.uint8, torch.uint8, torch.float32)
            assert tuple(b.obs.shape) == tuple(b.next_obs.shape) == (7, 4, 6, 6) and tuple(b.action.shape) == (7, 2)
            for x in (b.reward, b.done, b.discount, b.weights):
                assert x.dtype == torch.float32 and tuple(x.shape) == (7,)
            assert b.keys.dtype == torch.int64 and all(x.device.type == "cpu" for x in b)


@pytest.fixture(params=["emulated",
                        pytest.param("cuda", marks=pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device"))])
def backend(request):
    rt.emulate_cuda(request.param == "emulated")
    yield request.param
    wait_released(10)
    rt.emulate_cuda(False)


def test_cuda_samples_equal_host_samples(backend):
    streams = make_steps([[CONTINUE, CONTINUE, TERMINATED, CONTINUE, TRUNCATED, CONTINUE, CONTINUE]] * 2,
                         np.random.default_rng(1))
    with buffer(n_envs=2, n_step=3, gamma=0.7, alpha=0.5) as buf:
        feed(buf, streams)
        b = buf.sample(4, device="cuda")
        expect = "cuda" if backend == "cuda" else "cpu"
        assert all(x.device.type == expect for x in b[:-1]) and b.keys.device.type == "cpu"
        assert b.weights.dtype == torch.float32
        assert_match(drawn(buf, device="cuda"), reference(streams, 3, 0.7))


def make_stacked_steps(codes, rng, k, frame=(2,)):
    """As ``make_steps``, with observations of k frames stacked along their first axis, the
    newest last, as SB3's VecFrameStack gives them: zeros before an episode's first frame."""
    streams = []
    for env_codes in codes:
        steps = []
        stack = np.concatenate([np.zeros((k - 1, *frame), np.float32), rng.standard_normal((1, *frame), np.float32)])
        for code in env_codes:
            nxt = np.concatenate([stack[1:], rng.standard_normal((1, *frame), np.float32)])
            steps.append(dict(obs=stack, action=int(rng.integers(0, 5)), reward=float(np.float32(rng.standard_normal())),
                              next_obs=nxt, terminated=code in (TERMINATED, BOTH), truncated=code in (TRUNCATED, BOTH),
                              cut=code == CUT))
            stack = nxt if code == CONTINUE else np.concatenate(
                [np.zeros((k - 1, *frame), np.float32), rng.standard_normal((1, *frame), np.float32)])
        streams.append(steps)
    return streams


@settings(max_examples=40, deadline=None)
@given(data=st.data(), n_envs=st.integers(1, 3), n=st.integers(1, 4), k=st.integers(2, 4), seed=st.integers(0, 2**16))
def test_frame_stacks_are_stored_a_frame_a_row_and_come_back_whole(data, n_envs, n, k, seed):
    """frame_stack=k: each step stores one frame (an episode's first also the k - 1 before
    it), and the transitions drawn, on the host and by the GPU path (emulated), equal the
    reference model's whole stacks."""
    length = data.draw(st.integers(1, 12))
    env_codes = [data.draw(st.lists(CODES, min_size=length, max_size=length)) for _ in range(n_envs)]
    streams = make_stacked_steps(env_codes, np.random.default_rng(seed), k)
    with buffer(n_envs=n_envs, n_step=n, gamma=0.9, block_steps=4, obs_shape=(k, 2), frame_stack=k) as buf:
        assert buf.store.signature["obs"].shape == (2,)
        feed(buf, streams)
        expected = reference(streams, n, 0.9)
        assert len(buf) == len(expected)
        episodes = sum(1 + sum(s["terminated"] or s["truncated"] or s["cut"] for s in st_[:-1]) for st_ in streams)
        written = sum(len(st_) for st_ in streams) + k * episodes  # a row a step, k more an episode
        assert buf.store.capacity - buf.store.free_blocks * 4 >= written
        if expected:
            assert_match(drawn(buf), expected)
            rt.emulate_cuda(True)
            try:
                assert_match(drawn(buf, device="cuda"), expected)
            finally:
                wait_released(10)
                rt.emulate_cuda(False)


def test_frame_stacks_refuse_observations_that_are_not_stacks_and_change_nothing():
    with buffer(obs_shape=(3, 2), frame_stack=3) as buf:
        obs = np.arange(6, dtype=np.float32).reshape(3, 2)
        good = np.concatenate([obs[1:], np.full((1, 2), 9, np.float32)])
        buf.add(obs, 0, 1.0, good, False, False)
        free, size = buf.store.free_blocks, len(buf)
        with pytest.raises(rp.errors.InvalidArgument,
                           match=r"frame_stack=3, next_obs's frames 0..1 must be obs's frames 1..2 .*environment 0"):
            buf.add(good, 0, 1.0, good + 1, False, False)
        assert (buf.store.free_blocks, len(buf)) == (free, size)
        with pytest.raises(rp.errors.InvalidArgument, match=r"add: obs expects float32\[3,2\]"):
            buf.add(obs[:2], 0, 1.0, good[:2], False, False)
    for shape in ((3,), (2, 5)):
        with pytest.raises(rp.errors.InvalidArgument, match=r"frame_stack=3 needs observations of 3 frames stacked"):
            rp.TransitionBuffer(10, shape, frame_stack=3)
    with pytest.raises(rp.errors.InvalidArgument, match="frame_stack"):
        rp.TransitionBuffer(10, (3, 2), frame_stack=0)


def test_frame_stacks_survive_pickling_with_running_episodes():
    streams = make_stacked_steps([[CONTINUE] * 6 + [TERMINATED, CONTINUE, CONTINUE, CUT]], np.random.default_rng(4), 4)
    with buffer(n_step=3, gamma=0.5, obs_shape=(4, 2), frame_stack=4, block_steps=8) as buf:
        first, rest = [streams[0][:8]], [streams[0][8:]]
        feed(buf, first)
        copy = pickle.loads(pickle.dumps(buf))
        try:
            for b in (buf, copy):
                feed(b, rest)
            expected = reference(streams, 3, 0.5)
            assert_match(drawn(buf), expected)
            assert_match(drawn(copy), expected)
        finally:
            copy.close()


# --- ending episodes early -------------------------------------------------------------------------


def same_draws(a, b, n=200):
    """Two buffers whose tables are in the same state draw the same batches, field for field."""
    x, y = a.sample(n, beta=0.5), b.sample(n, beta=0.5)
    for name, u, v in zip(x._fields, x, y):
        assert torch.equal(u, v), name


@pytest.mark.parametrize("n_step,n_envs", [(1, 1), (3, 1), (4, 1), (3, 2), (4, 3)])
def test_end_episode_makes_the_items_a_truncated_add_would(n_step, n_envs):
    """The same random streams, one ending episodes with truncated=True, the other with an add
    and then end_episode(env): the same transitions. With one environment also the same items
    (keys, priorities, lengths) and draws; with several, an env's items from end_episode come
    after those the add made for the environments after it, so keys differ."""
    codes = np.random.default_rng(n_step).choice([CONTINUE] * 4 + [TERMINATED, TRUNCATED], size=(n_envs, 60))
    cut = np.where(codes == TRUNCATED, CUT, codes)
    with buffer(n_envs=n_envs, n_step=n_step, gamma=0.8, alpha=0.6, block_steps=8) as a, \
            buffer(n_envs=n_envs, n_step=n_step, gamma=0.8, alpha=0.6, block_steps=8, name="cut") as b:
        feed(a, make_steps(codes.tolist(), np.random.default_rng(1)))
        streams = make_steps(cut.tolist(), np.random.default_rng(1))
        feed(b, streams)
        assert (cut == CUT).any() and len(a) == len(b)
        if n_envs == 1:
            assert a.table.items() == b.table.items()
            same_draws(a, b)
        expected = drawn(a)
        assert_match(expected, reference(streams, n_step, 0.8))
        assert_match(drawn(b), expected)


def test_end_episode_of_every_environment_and_of_none_running():
    o = np.zeros((2, 3), np.float32)
    with buffer(n_envs=2, n_step=3, gamma=0.5) as buf:
        buf.add(o, [1, 2], [1.0, 10.0], o + 1, [False, False], [False, False])
        buf.add(o + 1, [3, 4], [2.0, 20.0], o + 2, [False, True], [False, False])  # env 1 terminates
        assert len(buf) == 2
        buf.end_episode()  # env 0's two steps become items; env 1 has no episode running
        assert sorted(length for *_, length in buf.table.items()) == [2, 2, 3, 3]
        items = buf.table.items()
        buf.end_episode(0)
        buf.end_episode(np.int64(1))
        assert buf.table.items() == items
        b = buf.sample(400)
        by_action = {int(a): (float(r), float(d), float(k)) for a, r, d, k in zip(b.action, b.reward, b.done,
                                                                                   b.discount)}
        assert by_action[1] == (1.0 + 0.5 * 2.0, 0.0, 0.25) and by_action[3] == (2.0, 0.0, 0.5)
        assert by_action[2] == (10.0 + 0.5 * 20.0, 1.0, 0.0) and by_action[4] == (20.0, 1.0, 0.0)
        buf.add(o + 5, [5, 6], [0.0, 0.0], o + 6, [False, False], [False, False])  # new episodes: obs stored
        buf.end_episode()
        b = buf.sample(400)
        assert len(buf) == 6 and (b.obs[b.action >= 5] == 5).all() and (b.next_obs[b.action >= 5] == 6).all()


@pytest.mark.parametrize("env", [2, -1, True, 1.0, "0"])
def test_end_episode_refuses_a_bad_env_and_changes_nothing(env):
    with buffer(n_envs=2, n_step=3) as buf:
        o = np.zeros((2, 3), np.float32)
        buf.add(o, [0, 0], [1.0, 1.0], o + 1, [False, False], [False, False])
        before = (buf.table.items(), [w.episode_steps for w in buf._writers], list(buf._episode_steps))
        with pytest.raises(rp.errors.InvalidArgument) as e:
            buf.end_episode(env)
        assert f"end_episode: env must be None (every environment) or an environment index in [0, 2), got {env!r}" \
            in str(e.value)
        assert before == (buf.table.items(), [w.episode_steps for w in buf._writers], list(buf._episode_steps))


# --- pickling ---------------------------------------------------------------------------------------


def by_key(buf, n=4000):
    """{key: transition} of a draw (a draw advances the table's generator)."""
    b = buf.sample(n, beta=0.5)
    return {int(k): tuple(np.asarray(x[i]).tobytes() for x in b[:-2]) for i, k in enumerate(b.keys)}


@pytest.mark.parametrize("n_step,n_envs,alpha", [(1, 1, None), (3, 3, 0.6), (4, 3, None)])
def test_pickle_round_trip_copies_items_priorities_running_episodes_and_draws(n_step, n_envs, alpha):
    """Pickled mid-stream (the environments' running episodes have 2, 0 and 6 steps: fewer
    than n, none, and n or more), the copy holds the same items and priorities, draws the same
    batches, and fed the rest of the streams goes on exactly as the original."""
    rng = np.random.default_rng(n_step)
    at, steps = 40, 70
    codes = rng.choice([CONTINUE] * 5 + [TERMINATED, TRUNCATED], size=(n_envs, steps))
    for e, running in zip(range(n_envs), (2, 0, 6)):
        codes[e, at - 1 - running] = TERMINATED
        codes[e, at - running:at + 3] = CONTINUE
    streams = make_steps(codes.tolist(), rng)
    with buffer(n_envs=n_envs, n_step=n_step, gamma=0.9, alpha=alpha, block_steps=8) as buf:
        feed(buf, [s[:at] for s in streams])
        keys = buf.sample(10).keys
        buf.update_priorities(keys, np.linspace(0.5, 3.0, 10))
        before = by_key(buf)
        items = buf.table.items()
        blob = pickle.dumps(buf)
        assert buf.table.items() == items  # the original is not changed
        with pickle.loads(blob) as copy:
            assert type(copy) is rp.TransitionBuffer and copy.store.path != buf.store.path
            assert len(copy) == len(buf) and copy.table.items() == items
            assert copy.max_priority == buf.max_priority == 3.0 + 1e-6
            assert repr(copy) == repr(buf)
            assert by_key(copy) == by_key(buf) and set(before) == {k for k, *_ in items}
            same_draws(copy, buf)
            rest = [s[at:] for s in streams]
            feed(buf, rest)
            feed(copy, rest)  # completes the windows pending at the pickle
            assert copy.table.items() == buf.table.items()
            got = drawn(copy)
            assert_match(got, reference(streams, n_step, 0.9))
            assert_match(drawn(buf), got)  # the same draw: both generators stay in step
            buf.end_episode()
            copy.end_episode()
            assert copy.table.items() == buf.table.items()
            same_draws(copy, buf)
        assert not os.path.exists(copy.store.path)


def test_a_pickled_table_beside_its_buffer_comes_back_as_the_copys_table():
    with buffer(n_step=2) as buf:
        feed(buf, make_steps([[CONTINUE] * 5], np.random.default_rng(0)))
        copy, table = pickle.loads(pickle.dumps((buf, buf.table)))
        with copy:
            assert table is copy.table and len(copy) == 4


def test_a_copy_of_a_full_tightly_sized_buffer_holds_capacity_exactly():
    capacity, n_envs = 300, 2
    kw = dict(capacity=capacity, n_envs=n_envs, n_step=3, block_steps=16, min_episode_length=20, alpha=0.6)

    def steps(buf, start, stop):
        for t in range(start, stop):
            o = np.full((n_envs, 3), t, np.float32)
            end = np.array([(t + 7 * e) % 20 == 19 for e in range(n_envs)])
            buf.add(o, np.zeros(n_envs, np.int64), np.ones(n_envs, np.float32), o + 1, end, np.zeros(n_envs, bool))

    for at in (3 * capacity // n_envs, 3 * capacity // n_envs + 9):  # two positions in the writers' blocks
        with buffer(**kw) as buf:
            steps(buf, 0, at)
            with pickle.loads(pickle.dumps(buf)) as copy:
                steps(buf, at, at + 2 * capacity)
                steps(copy, at, at + 2 * capacity)
                assert len(copy) == capacity and copy.table.info()["num_store_evictions"] == 0
                assert copy.table.items() == buf.table.items()


def test_a_closed_buffer_refuses_to_pickle():
    buf = buffer()
    buf.close()
    with pytest.raises(rp.errors.InvalidArgument, match="cannot pickle a closed TransitionBuffer"):
        pickle.dumps(buf)


# --- priorities -------------------------------------------------------------------------------------


def keys_by_action(buf):
    """{action: key} of a buffer whose transitions have distinct actions."""
    b = buf.sample(60 * len(buf))
    return {int(a): int(k) for a, k in zip(b.action, b.keys)}


@pytest.mark.parametrize("seed", [0, 1])
def test_prioritized_frequencies_follow_priorities_to_the_alpha(seed):
    alpha, td = 0.7, np.array([0.5, -1.0, 2.0, 3.0, -4.0, 8.0])
    with buffer(alpha=alpha, seed=seed) as buf:
        for a in range(6):
            buf.add(np.full(3, a, np.float32), a, 0.0, np.full(3, a + 1, np.float32), False, False)
        keys = keys_by_action(buf)
        assert buf.update_priorities([keys[a] for a in range(6)], td) == 6
        b = [buf.sample(500) for _ in range(40)]
        counts = np.bincount(np.concatenate([x.action.numpy() for x in b]), minlength=6)
        p = (np.abs(td) + 1e-6) ** alpha
        expected = counts.sum() * p / p.sum()
        stat = float(((counts - expected) ** 2 / expected).sum())
        assert stat < CHI2_999[5], f"chi-square {stat:.2f}; counts {counts.tolist()}"
        # The weights are the table's (N P(i))^-beta over the batch's largest, in float32.
        y = buf.sample(300, beta=0.4)
        prob = p[y.action.numpy()] / p.sum()
        w = (6 * prob) ** -0.4
        assert y.weights.dtype == torch.float32
        np.testing.assert_allclose(y.weights.numpy(), w / w.max(), rtol=1e-6)
        assert (buf.sample(50, beta=0.0).weights == 1).all()


def test_new_transitions_get_the_largest_priority_set_so_far():
    with buffer(alpha=0.6) as buf:
        o = np.zeros(3, np.float32)
        buf.add(o, 0, 0.0, o + 1, False, False)
        assert buf.max_priority == 1.0 and [p for _, p, _, _ in buf.table.items()] == [1.0]
        key = int(buf.sample(1).keys[0])
        buf.update_priorities(torch.tensor([key]), torch.tensor([-4.0]))
        buf.update_priorities(np.array([key], np.uint64), [0.5])   # a smaller one does not lower it
        assert buf.max_priority == 4.0 + 1e-6
        buf.add(o + 1, 1, 0.0, o + 2, False, False)
        assert [p for _, p, _, _ in buf.table.items()] == [0.5 + 1e-6, 4.0 + 1e-6]


def test_uniform_buffers_weigh_every_sample_one_and_accept_priority_updates():
    with buffer() as buf:
        for a in range(4):
            buf.add(np.full(3, a, np.float32), a, 0.0, np.full(3, a + 1, np.float32), a == 3, False)
        b = buf.sample(2000)
        assert (b.weights == 1).all()
        assert np.bincount(b.action.numpy()).min() > 400
        assert buf.update_priorities(b.keys[:3], [1.0, 2.0, 3.0]) == 3


def test_stale_keys_are_skipped():
    with buffer(capacity=2) as buf:
        o = np.zeros(3, np.float32)
        buf.add(o, 0, 0.0, o, False, False)
        old = buf.sample(1).keys
        for t in range(3):
            buf.add(o, 0, 0.0, o, False, False)
        assert buf.update_priorities(old, [5.0]) == 0
        assert buf.update_priorities([], []) == 0


def test_the_seed_makes_draws_reproducible():
    def draws(seed):
        with buffer(alpha=0.6, seed=seed, name=f"t{seed}") as buf:
            feed(buf, make_steps([[CONTINUE] * 7 + [TERMINATED]], np.random.default_rng(0)))
            return [buf.sample(16).action.tolist() for _ in range(3)]
    assert draws(5) == draws(5) != draws(6)


# --- capacity ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("block_steps", [1, 4, 16, 64])
@pytest.mark.parametrize("n_step,n_envs", [(1, 1), (3, 1), (1, 4), (3, 3)])
def test_capacity_is_exact_once_full_whatever_the_episode_lengths(block_steps, n_step, n_envs):
    rng = np.random.default_rng(block_steps * 10 + n_step)
    capacity = 50
    with buffer(capacity=capacity, n_envs=n_envs, n_step=n_step, block_steps=block_steps, alpha=0.6) as buf:
        ends = rng.random((12 * capacity // n_envs + 30, n_envs)) < 0.45  # episodes of 1 step and more
        created = 0
        for t, end in enumerate(ends):
            o = np.full((n_envs, 3), t, np.float32)
            buf.add(o, np.zeros(n_envs, np.int64), np.ones(n_envs, np.float32), o + 1, end, np.zeros(n_envs, bool))
            created = buf.table.info()["num_inserts"]
            assert len(buf) == min(created, capacity)
        info = buf.table.info()
        assert created > 3 * capacity and len(buf) == capacity
        assert info["num_store_evictions"] == 0 and info["num_evictions"] == created - capacity


def test_min_episode_length_sizes_the_store_for_long_episodes():
    small = buffer(capacity=1000, min_episode_length=100, block_steps=16)
    full = buffer(capacity=1000, block_steps=16, name="other")
    try:
        assert small.store.capacity < 1.2 * 1000 < 2 * 1000 < full.store.capacity
        o = np.zeros(3, np.float32)
        for t in range(3000):
            small.add(o + t, 0, 1.0, o + t + 1, t % 100 == 99, False)
        assert len(small) == 1000 and small.table.info()["num_store_evictions"] == 0
    finally:
        small.close()
        full.close()


# --- Stable-Baselines3 ------------------------------------------------------------------------------


@pytest.mark.parametrize("n_step,n_envs", [(1, 1), (3, 1), (3, 4), (5, 2)])
def test_n_step_targets_equal_stable_baselines3(monkeypatch, n_step, n_envs):
    """The same random episodes (terminations, truncations, both) into SB3's NStepReplayBuffer
    and a TransitionBuffer: every transition whose window is complete is in ours, with SB3's
    return, next observation, done flag and discount (gamma^m, times 1 - done in ours)."""
    sb3 = pytest.importorskip("stable_baselines3.common.buffers")
    spaces = pytest.importorskip("gymnasium.spaces")
    gamma, steps = 0.9, 120
    rng = np.random.default_rng(n_step * 7 + n_envs)
    codes = rng.choice([CONTINUE] * 8 + [TERMINATED, TRUNCATED, BOTH], size=(n_envs, steps))
    streams = make_steps(codes.tolist(), rng)
    theirs = sb3.NStepReplayBuffer(steps * n_envs, spaces.Box(-np.inf, np.inf, (3,), np.float32), spaces.Discrete(5),
                                   device="cpu", n_envs=n_envs, handle_timeout_termination=True,
                                   n_steps=n_step, gamma=gamma)
    for t in range(steps):
        rows = [s[t] for s in streams]
        theirs.add(np.stack([r["obs"] for r in rows]), np.stack([r["next_obs"] for r in rows]),
                   np.array([r["action"] for r in rows]), np.array([r["reward"] for r in rows], np.float32),
                   np.array([r["terminated"] or r["truncated"] for r in rows]),
                   [{"TimeLimit.truncated": r["truncated"] and not r["terminated"]} for r in rows])
    with buffer(n_envs=n_envs, n_step=n_step, gamma=gamma, block_steps=8) as ours:
        feed(ours, streams)
        got = drawn(ours)
    compared = 0
    for e in range(n_envs):
        monkeypatch.setattr(np.random, "randint", lambda lo, hi, size: np.full(size, e))
        s = theirs._get_samples(np.arange(steps))
        monkeypatch.undo()
        dones = theirs.dones[:, e].astype(bool)
        for i in range(steps):
            if not (i + n_step <= steps or dones[i:].any()):
                continue  # window not complete: SB3 cuts it at the newest step, ours waits
            a, ret, nxt, done, disc = got[s.observations[i].numpy().tobytes()]
            assert a == int(s.actions[i, 0])
            assert ret == pytest.approx(float(s.rewards[i, 0]), rel=1e-6, abs=1e-6)
            np.testing.assert_array_equal(nxt, s.next_observations[i].numpy())
            assert done == float(s.dones[i, 0])
            assert disc == pytest.approx(float(s.discounts[i, 0]) * (1.0 - float(s.dones[i, 0])), rel=1e-6)
            compared += 1
    assert compared == len(got) == len(reference(streams, n_step, gamma))


# --- bad inputs -------------------------------------------------------------------------------------


@pytest.mark.parametrize("kwargs,message", [
    (dict(n_step=0), "n_step must be >= 1, got 0"),
    (dict(n_step=1.5), "n_step must be an integer"),
    (dict(gamma=-0.1), "gamma must be a number in [0, 1], got -0.1"),
    (dict(gamma=1.5), "gamma must be a number in [0, 1], got 1.5"),
    (dict(gamma=float("nan")), "gamma must be a number in [0, 1]"),
    (dict(gamma="0.9"), "gamma must be a number in [0, 1]"),
    (dict(capacity=0), "capacity must be >= 1, got 0"),
    (dict(n_envs=0), "n_envs must be >= 1, got 0"),
    (dict(alpha=-1.0), "alpha must be None (uniform) or a finite number >= 0, got -1.0"),
    (dict(epsilon=-1e-3), "epsilon must be a finite number >= 0"),
    (dict(min_episode_length=0), "min_episode_length must be >= 1"),
    (dict(obs_dtype="complex64"), "unknown dtype 'complex64'"),
    (dict(obs_shape=(0, 3)), "every dimension must be an int >= 1"),
])
def test_bad_construction_names_the_argument(kwargs, message):
    kw = dict(capacity=10, obs_shape=(3,)) | kwargs
    with pytest.raises(rp.errors.InvalidArgument) as e:
        rp.TransitionBuffer(kw.pop("capacity"), kw.pop("obs_shape"), **kw)
    assert message in str(e.value)


GOOD = dict(obs=np.zeros((2, 4, 4), np.uint8), action=np.array([1, 2]), reward=np.array([1.0, 0.5]),
            next_obs=np.ones((2, 4, 4), np.uint8), terminated=np.array([False, True]),
            truncated=np.array([False, False]))


@pytest.mark.parametrize("change,message", [
    (dict(obs=np.zeros((4, 4), np.uint8)), "obs expects uint8[2,4,4] (n_envs=2), got uint8[4,4]"),
    (dict(obs=np.zeros((3, 4, 4), np.uint8)), "obs expects uint8[2,4,4] (n_envs=2), got uint8[3,4,4]"),
    (dict(obs=np.zeros((2, 4, 4), np.float32)), "obs expects uint8[2,4,4] (n_envs=2), got float32[2,4,4]: "
                                               "converting float32 to uint8 would lose information"),
    (dict(next_obs=np.full((2, 4, 4), 300)), "next_obs expects uint8[2,4,4] (n_envs=2), got int64[2,4,4] holding "
                                             "300, which uint8 cannot hold"),
    (dict(next_obs=np.zeros((2, 4), np.uint8)), "next_obs expects uint8[2,4,4] (as for obs of 2 environments), "
                                                "got uint8[2,4]"),
    (dict(action=np.array([1.0, 2.0])), "action expects int64[2] (n_envs=2), got float64[2]: converting float64 "
                                        "to int64 would lose information"),
    (dict(action=np.array([1])), "action expects int64[2] (as for obs of 2 environments), got int64[1]"),
    (dict(reward=np.array([1.0, 2.0, 3.0])),
     "reward expects float32[2] (as for obs of 2 environments), got float64[3]"),
    (dict(reward=np.array([1.0, np.nan])), "reward must be finite, got [1.0, nan]"),
    (dict(reward=["a", "b"]), "reward expects float32[2] (n_envs=2), got list of <U1 (not numbers)"),
    (dict(terminated=np.array([0.0, 1.0])), "terminated expects bool[2] (n_envs=2), got float64[2]: converting "
                                           "float64 to bool would lose information"),
    (dict(truncated=np.array([0, 2])), "truncated expects bool[2] (n_envs=2), got int64[2] holding 2, which bool "
                                       "cannot hold"),
    (dict(terminated=True), "terminated expects bool[2] (as for obs of 2 environments), got bool[]"),
])
def test_bad_adds_name_the_argument_and_change_nothing(change, message):
    with buffer(n_envs=2, obs_shape=(4, 4), obs_dtype="uint8", n_step=2) as buf:
        buf.add(**GOOD)   # env 1's episode ended: one transition; env 0's window is open
        before = (len(buf), buf.table.info()["num_inserts"], [w.episode_steps for w in buf._writers],
                  list(buf._episode_steps))
        with pytest.raises(rp.errors.InvalidArgument) as e:
            buf.add(**(GOOD | change))
        assert message in str(e.value)
        assert before == (len(buf), buf.table.info()["num_inserts"], [w.episode_steps for w in buf._writers],
                          list(buf._episode_steps))
        buf.add(**GOOD)   # the stream goes on as if the bad call had not been made
        assert len(buf) == 1 + 2   # env 0: t=0's 2-step window is complete; env 1: two 1-step episodes


def test_lossless_conversions_are_accepted():
    with buffer(obs_shape=(2,), obs_dtype="float32", action_dtype="uint8") as buf:
        buf.add([1, 2], True, 1, np.array([0.5, 1.5], np.float64), 0, np.int8(0))
        buf.add(torch.tensor([0.5, 1.5], dtype=torch.float64), np.int64(255), np.float16(2.0), [3, 4], 1, False)
        b = buf.sample(20)
        assert sorted(set(b.action.tolist())) == [1, 255] and b.action.dtype == torch.uint8


def test_bad_samples_and_updates_name_the_argument_and_change_nothing():
    with buffer(alpha=0.5) as buf:
        with pytest.raises(rp.errors.InvalidArgument, match="cannot sample from an empty TransitionBuffer"):
            buf.sample(1)
        o = np.zeros(3, np.float32)
        buf.add(o, 0, 0.0, o, False, False)
        for bad, message in [(0, "batch_size must be >= 1, got 0"), (2.0, "batch_size must be an integer")]:
            with pytest.raises(rp.errors.InvalidArgument, match=message):
                buf.sample(bad)
        for beta in (-1.0, float("nan"), None):
            with pytest.raises(rp.errors.InvalidArgument, match="beta must be a finite number >= 0"):
                buf.sample(1, beta=beta)
        with pytest.raises(rp.errors.InvalidArgument, match="not a device"):
            buf.sample(1, device="tpu")
        assert buf.table.info()["num_samples"] == 0
        key = buf.sample(1).keys
        items = buf.table.items()
        for keys, td, message in [
            (key, [1.0, 2.0], "td_errors must be 1 numbers (one per key), got float64[2]"),
            (key, [float("nan")], f"td_errors must be finite, got nan for key {int(key[0])}"),
            (key.reshape(1, 1), [1.0], "keys must be a 1-D integer array"),
            (np.array([1.5]), [1.0], "keys must be a 1-D integer array (batch.keys), got float64[1]"),
            (key, ["x"], "td_errors must be 1 numbers"),
        ]:
            with pytest.raises(rp.errors.InvalidArgument) as e:
                buf.update_priorities(keys, td)
            assert message in str(e.value)
        assert buf.table.items() == items and buf.max_priority == 1.0


def test_close_removes_the_store_and_is_idempotent():
    buf = buffer()
    path = buf.store.path
    buf.add(np.zeros(3, np.float32), 0, 0.0, np.zeros(3, np.float32), False, False)
    buf.close()
    buf.close()
    assert buf.store.closed and not os.path.exists(path)
    assert repr(buf) == "TransitionBuffer(size=1, capacity=1000, n_envs=1, n_step=1, gamma=0.99, uniform)"


def test_large_batches_reuse_memory_only_after_every_tensor_on_it_is_gone():
    """Observations of over a megabyte a batch come from a pool (no page faults per sample):
    a batch that is still referenced, or a view of it, never sees a later batch's rows."""
    import gc

    from reprise._pool import POOL as _POOL
    buf = rp.TransitionBuffer(512, (64, 64), "uint8", (), "int64", seed=3)
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 255, (400, 64, 64), dtype=np.uint8)
    for t in range(399):
        buf.add(frames[t][None], np.array([0]), np.array([1.0]), frames[t + 1][None], np.array([False]),
                np.array([t % 50 == 49]))
    nbytes = 300 * 64 * 64
    assert nbytes >= _POOL.MIN_BYTES
    first = buf.sample(300)
    view = first.obs[10:20, 5]            # a torch view
    numpy_view = first.next_obs.numpy()[3:]  # and a numpy view of the tensor
    kept = (first.obs.clone(), view.clone(), numpy_view.copy())
    del first
    gc.collect()
    for _ in range(6):   # later batches: none may write into the memory the views still use
        buf.sample(300)
    assert torch.equal(view, kept[1]) and np.array_equal(numpy_view, kept[2])
    del view, numpy_view
    gc.collect()
    free = _POOL._free.get(nbytes, [])
    assert 1 <= len(free) <= _POOL.KEEP
    before = len(free)
    batch = buf.sample(300)  # takes two blocks from the pool (obs, next_obs)
    assert len(free) == before - 2
    obs_bytes = {tuple(f.reshape(-1)[:16]) for f in frames}
    assert all(tuple(o.reshape(-1)[:16].tolist()) in obs_bytes for o in batch.obs.numpy())
    buf.close()
