"""reprise.integrations.sb3: RepriseReplayBuffer inside Stable-Baselines3's off-policy
algorithms, held to SB3's own buffers (NStepReplayBuffer fed the same steps), and
PrioritizedDQN."""

import pickle
import time

import numpy as np
import pytest

pytest.importorskip("stable_baselines3", reason="stable-baselines3 is not installed (pip install 'reprise[sb3]')")

import gymnasium as gym  # noqa: E402
import torch  # noqa: E402
from gymnasium import spaces  # noqa: E402
from gymnasium.wrappers import TimeLimit  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from stable_baselines3 import DQN, SAC  # noqa: E402
from stable_baselines3.common.buffers import NStepReplayBuffer  # noqa: E402
from stable_baselines3.common.type_aliases import ReplayBufferSamples  # noqa: E402
from stable_baselines3.common.utils import set_random_seed  # noqa: E402
from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize  # noqa: E402

from reprise.errors import InvalidArgument  # noqa: E402
from reprise.integrations.sb3 import PrioritizedDQN, PrioritizedReplayBufferSamples, RepriseReplayBuffer  # noqa: E402

OBS3 = spaces.Box(-1e9, 1e9, (3,), np.float32)


@pytest.fixture
def closing():
    """``closing(x)``: x (a buffer, or a model with one) has its buffer closed at teardown."""
    held = []

    def close_later(x):
        held.append(x)
        return x

    yield close_later
    for x in held:
        (x.replay_buffer if hasattr(x, "replay_buffer") else x).close()


def buffer(closing, n_envs=1, **kw):
    kw.setdefault("seed", 0)
    return closing(RepriseReplayBuffer(1000, OBS3, spaces.Discrete(2), device="cpu", n_envs=n_envs, **kw))


# --- a VecEnv step stream, fed to SB3's buffers and ours alike ------------------------------------

def vec_steps(endings, rng):
    """The ``add`` calls of a VecEnv whose environment e plays the episodes ``endings[e]``
    (each (length, "term" | "trunc")) side by side; every environment plays the same
    number of steps. Observations are [env, episode, t]; ``next_obs`` of a finished
    environment is its final observation, as SB3's algorithms pass it."""
    n = len(endings)
    schedule = []  # per env: one (episode, t, ending at this step?) per step
    for e, episodes in enumerate(endings):
        steps = []
        for ep, (length, how) in enumerate(episodes):
            steps += [(ep, t, how if t == length - 1 else None) for t in range(length)]
        schedule.append(steps)
    assert len({len(s) for s in schedule}) == 1
    for k in range(len(schedule[0])):
        obs = np.array([[e, schedule[e][k][0], schedule[e][k][1]] for e in range(n)], np.float32)
        nxt = obs.copy()
        nxt[:, 2] += 1
        how = [schedule[e][k][2] for e in range(n)]
        done = np.array([h is not None for h in how])
        infos = [{"TimeLimit.truncated": h == "trunc", "terminal_observation": nxt[e].copy()} if h else {}
                 for e, h in enumerate(how)]
        yield obs, nxt, rng.integers(2, size=(n, 1)), rng.normal(size=n).astype(np.float32), done, infos


def all_transitions(buf, draws=4000):
    """Every transition the buffer holds, by its observation: sampled until each was seen."""
    s = buf.sample(draws)
    found = {}
    for i in range(draws):
        found[tuple(s.observations[i].tolist())] = dict(
            next_obs=s.next_observations[i].tolist(), action=s.actions[i].tolist(), reward=s.rewards[i, 0].item(),
            done=s.dones[i, 0].item(), discount=None if s.discounts is None else s.discounts[i, 0].item())
    assert len(found) == len(buf)
    return found


def sb3_transitions(endings, steps, n_steps, gamma):
    """The same transitions from SB3's NStepReplayBuffer, one buffer per environment
    (SB3's n-step windows never mix environments)."""
    n = len(endings)
    out = {}
    for e in range(n):
        ref = NStepReplayBuffer(10_000, OBS3, spaces.Discrete(2), device="cpu", n_steps=n_steps, gamma=gamma)
        for obs, nxt, action, reward, done, infos in steps:
            ref.add(obs[e:e + 1], nxt[e:e + 1], action[e:e + 1], reward[e:e + 1], done[e:e + 1], infos[e:e + 1])
        s = ref._get_samples(np.arange(ref.pos))
        for i in range(ref.pos):
            out[tuple(s.observations[i].tolist())] = dict(
                next_obs=s.next_observations[i].tolist(), action=s.actions[i].tolist(),
                reward=s.rewards[i, 0].item(), done=s.dones[i, 0].item(), discount=s.discounts[i, 0].item())
    return out


episode = st.tuples(st.integers(1, 6), st.sampled_from(["term", "trunc"]))


@settings(max_examples=25, deadline=None)
@given(st.data(), st.integers(1, 2), st.integers(1, 4), st.sampled_from([0.0, 0.5, 0.99]))
def test_n_step_values_equal_sb3_nstep_buffer(data, n_envs, n_steps, gamma):
    # Every environment plays whole episodes (terminated or truncated through infos), the
    # same number of steps each: then every window is complete and both buffers hold the
    # same transitions.
    first = data.draw(st.lists(episode, min_size=1, max_size=4))
    total = sum(length for length, _ in first)
    endings = [first]
    for _ in range(n_envs - 1):
        lengths = data.draw(st.lists(st.integers(1, total), min_size=1, max_size=4)
                            .map(lambda xs: _compositions(xs, total)))
        endings.append([(length, data.draw(st.sampled_from(["term", "trunc"]))) for length in lengths])
    steps = list(vec_steps(endings, np.random.default_rng(0)))
    buf = RepriseReplayBuffer(10_000, OBS3, spaces.Discrete(2), device="cpu", n_envs=n_envs, n_steps=n_steps,
                              gamma=gamma, seed=1)
    try:
        for step in steps:
            buf.add(*step)
        ours = all_transitions(buf)
    finally:
        buf.close()
    theirs = sb3_transitions(endings, steps, n_steps, gamma)
    assert ours.keys() == theirs.keys()
    for key, t in theirs.items():
        o = ours[key]
        assert o["next_obs"] == t["next_obs"] and o["action"] == t["action"] and o["done"] == t["done"], key
        assert o["reward"] == pytest.approx(t["reward"], rel=1e-6, abs=1e-6), key
        # SB3's discounts is gamma^m with dones apart; ours is gamma^m times (1 - dones).
        expected = t["discount"] * (1.0 - t["done"])
        assert (o["discount"] if n_steps > 1 else expected) == pytest.approx(expected, rel=1e-6), key


def _compositions(cuts, total):
    """Episode lengths that sum to ``total``, from cut points."""
    points = sorted({c for c in cuts if 0 < c < total}) + [total]
    return [b - a for a, b in zip([0] + points[:-1], points)]


def test_one_step_samples_are_sb3s_replay_buffer_samples(closing):
    buf = buffer(closing, handle_timeout_termination=False)
    steps = list(vec_steps([[(3, "term"), (4, "trunc")]], np.random.default_rng(0)))
    for step in steps:
        buf.add(*step)
    s = buf.sample(5)
    assert type(s) is ReplayBufferSamples and s.discounts is None
    assert s.observations.shape == (5, 3) and s.actions.shape == (5, 1) and s.actions.dtype == torch.int64
    assert s.rewards.shape == s.dones.shape == (5, 1) and s.rewards.dtype == s.dones.dtype == torch.float32
    # Without handle_timeout_termination a timeout is a termination, as in SB3.
    found = all_transitions(buf)
    assert found[(0.0, 1.0, 3.0)]["done"] == 1.0 and found[(0.0, 0.0, 2.0)]["done"] == 1.0
    assert len(buf) == buf.size() == 7 and not buf.full
    # One environment's step may come without the leading dimension, as to TransitionBuffer.
    buf.add(np.zeros(3, np.float32), np.ones(3, np.float32), np.array([1]), np.array([0.5], np.float32),
            np.array([True]), [{}])
    assert len(buf) == 8


# --- SB3's algorithms ----------------------------------------------------------------------------

class CounterEnv(gym.Env):
    """Observations [tag, episode, t]; reward t after the step; terminates at t == ``end``
    (never when None: a TimeLimit truncates it)."""

    observation_space = OBS3
    action_space = spaces.Discrete(2)

    def __init__(self, tag, end=None):
        self.tag, self.end, self.episode, self.t, self.steps = tag, end, -1, 0, 0

    def _obs(self):
        return np.array([self.tag, self.episode, self.t], np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.episode, self.t = self.episode + 1, 0
        return self._obs(), {}

    def step(self, action):
        self.t, self.steps = self.t + 1, self.steps + 1
        return self._obs(), float(self.t), self.end is not None and self.t == self.end, False, {}


def test_dqn_with_two_envs_handles_terminations_timeouts_and_restarts(closing):
    # Env 0 terminates every 5 steps, env 1 is truncated by its TimeLimit every 7; the
    # second learn() resets both mid-episode. No training: only what the buffer holds.
    venv = DummyVecEnv([lambda: TimeLimit(CounterEnv(0, end=5), 100), lambda: TimeLimit(CounterEnv(1), 7)])
    n, gamma = 3, 0.5
    model = closing(DQN("MlpPolicy", venv, learning_starts=10**9, buffer_size=1000, seed=0, device="cpu",
                        replay_buffer_class=RepriseReplayBuffer, replay_buffer_kwargs=dict(n_steps=n, gamma=gamma)))
    model.learn(60)
    envs = [e.unwrapped for e in venv.envs]
    cut = {(e.tag, e.episode) for e in envs}  # running when the second learn() resets them
    model.learn(20)
    buf = model.replay_buffer
    assert isinstance(buf, RepriseReplayBuffer) and buf.n_envs == 2 and buf.handle_timeout_termination
    found = all_transitions(buf)
    pending = sum(min(n - 1, e.t) for e in envs)  # windows of the running episodes not complete yet
    assert len(buf) == sum(e.steps for e in envs) - pending
    ends = {0: 5, 1: 7}
    seen_timeout = False
    for (tag, ep, t), tr in found.items():
        tag2, ep2, t2 = tr["next_obs"]
        m = int(t2 - t)
        assert (tag2, ep2) == (tag, ep) and 1 <= m <= n, (tag, ep, t, tr)
        assert tr["reward"] == pytest.approx(sum(gamma ** k * (t + k + 1) for k in range(m)))
        terminal = tag == 0 and t2 == 5
        assert tr["done"] == float(terminal)
        assert tr["discount"] == pytest.approx(0.0 if terminal else gamma ** m)
        if m < n:  # a window cut short ends where its episode did
            assert t2 == ends[tag] or (tag, ep) in cut, (tag, ep, t, tr)
        seen_timeout |= tag == 1 and t2 == 7  # the final observation, not the next episode's first
    assert seen_timeout


def evaluate(model, episodes=5):
    """Mean return of the greedy policy on CartPole, over fixed reset seeds."""
    env = gym.make("CartPole-v1")
    returns = []
    for k in range(episodes):
        obs, _ = env.reset(seed=1000 + k)
        done, total = False, 0.0
        while not done:
            action, _ = model.predict(obs, deterministic=True)
            obs, reward, terminated, truncated, _ = env.step(int(action))
            total += reward
            done = terminated or truncated
        returns.append(total)
    env.close()
    return float(np.mean(returns))


def test_dqn_learns_cartpole(closing):
    # SB3 zoo's CartPole DQN settings (smaller network, 12k of its 50k steps): 10-20 s of CPU.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model = closing(DQN("MlpPolicy", "CartPole-v1", learning_rate=2.3e-3, batch_size=64, buffer_size=100_000,
                            learning_starts=1000, gamma=0.99, target_update_interval=10, train_freq=256,
                            gradient_steps=128, exploration_fraction=0.16, exploration_final_eps=0.04,
                            policy_kwargs=dict(net_arch=[64, 64]), seed=0, device="cpu",
                            replay_buffer_class=RepriseReplayBuffer,
                            replay_buffer_kwargs=dict(min_episode_length=8)))
        untrained = evaluate(model)
        start = time.process_time()
        model.learn(12_000)
        learned = evaluate(model)
    finally:
        torch.set_num_threads(threads)
    assert isinstance(model.replay_buffer, RepriseReplayBuffer)
    assert learned >= max(2 * untrained, 50), (untrained, learned, time.process_time() - start)


def test_prioritized_dqn_trains_and_changes_priorities(closing, tmp_path):
    model = closing(PrioritizedDQN("MlpPolicy", "CartPole-v1", learning_starts=100, buffer_size=5000, batch_size=32,
                                   train_freq=4, alpha=0.6, beta=0.4, n_steps=3, seed=0, device="cpu",
                                   policy_kwargs=dict(net_arch=[32])))
    buf = model.replay_buffer
    assert isinstance(buf, RepriseReplayBuffer) and buf.transitions.alpha == 0.6 and buf.n_steps == 3
    assert buf.gamma == model.gamma and model.n_steps == 1
    model.learn(600)
    priorities = np.array([p for _, p, *_ in buf.transitions.table.items()])
    assert len(np.unique(priorities)) > 50 and priorities.max() == buf.transitions.max_priority
    s = buf.sample(64, beta=0.4)
    assert isinstance(s, PrioritizedReplayBufferSamples) and s.weights.shape == (64, 1) and s.discounts is not None
    assert s.weights.max().item() == 1.0 and s.weights.min().item() < 1.0
    assert model.beta_schedule(1.0) == pytest.approx(0.4) and model.beta_schedule(0.0) == pytest.approx(1.0)
    model.save(tmp_path / "model.zip")  # the model (not its buffer) saves and loads as DQN's does
    loaded = closing(PrioritizedDQN.load(tmp_path / "model.zip", device="cpu"))
    assert loaded.beta_schedule(0.5) == pytest.approx(0.7) and loaded.replay_buffer.transitions.alpha == 0.6
    assert loaded.replay_buffer.n_steps == 3


def test_sac_runs_on_a_box_action_space(closing):
    model = closing(SAC("MlpPolicy", "Pendulum-v1", learning_starts=50, buffer_size=1000, batch_size=16, seed=0,
                        device="cpu", policy_kwargs=dict(net_arch=[16]), replay_buffer_class=RepriseReplayBuffer))
    model.learn(120)
    s = model.replay_buffer.sample(4)
    assert s.actions.shape == (4, 1) and s.actions.dtype == torch.float32 and len(model.replay_buffer) == 120


# --- pickling, seeds, reset ----------------------------------------------------------------------

def test_save_and_load_replay_buffer_round_trip(closing, tmp_path):
    kw = dict(learning_starts=100, buffer_size=5000, batch_size=32, n_steps=3, seed=0, device="cpu",
              policy_kwargs=dict(net_arch=[32]))
    model = closing(PrioritizedDQN("MlpPolicy", "CartPole-v1", **kw))
    model.learn(400)
    model.save_replay_buffer(tmp_path / "rb.pkl")
    other = closing(PrioritizedDQN("MlpPolicy", "CartPole-v1", **kw))
    other.replay_buffer.close()
    other.load_replay_buffer(tmp_path / "rb.pkl")
    a, b = model.replay_buffer, other.replay_buffer
    assert a is not b and len(a) == len(b) > 300
    assert a.transitions.table.items() == b.transitions.table.items()  # keys and priorities
    assert a.transitions.max_priority == b.transitions.max_priority
    for _ in range(3):  # the table's random generator comes along: the same draws
        sa, sb = a.sample(64, beta=0.5), b.sample(64, beta=0.5)
        for name, x in sa._asdict().items():
            assert torch.equal(x, getattr(sb, name)), name
    other.learn(200, reset_num_timesteps=False)  # the copy goes on, and the original is untouched
    assert len(b) > len(a)
    assert a.sample(1).observations.shape == (1, 4)


def test_pickle_carries_running_episodes_and_their_pending_windows(closing):
    buf = buffer(closing, n_envs=2, n_steps=2)
    steps = list(vec_steps([[(3, "term"), (5, "trunc")], [(8, "trunc")]], np.random.default_rng(0)))
    for step in steps[:-1]:  # both environments stop one step before their episode ends
        buf.add(*step)
    held = len(buf)
    assert held == (3 + 4 - 1) + (7 - 1)  # one window of each running episode is pending
    copy = closing(pickle.loads(pickle.dumps(buf)))
    assert len(copy) == held and copy.full == buf.full and copy.pos == buf.pos
    assert copy.transitions.table.items() == buf.transitions.table.items()
    # The last step ends both episodes: the copy completes the pending windows (two per
    # environment) as the original does.
    buf.add(*steps[-1])
    copy.add(*steps[-1])
    assert len(buf) == len(copy) == held + 4
    assert copy.transitions.table.items() == buf.transitions.table.items()
    assert all_transitions(copy) == all_transitions(buf)


def test_an_unpickled_buffer_fed_reset_environments_ends_their_episodes_as_truncations(closing):
    buf = buffer(closing, n_steps=3, gamma=0.5)
    steps = list(vec_steps([[(10, "term")]], np.random.default_rng(0)))
    for step in steps[:5]:  # transitions 0-2 are held, 3 and 4 wait for later steps
        buf.add(*step)
    copy = closing(pickle.loads(pickle.dumps(buf)))
    obs, nxt, *rest = next(vec_steps([[(2, "term")]], np.random.default_rng(1)))
    obs[:, 1] = nxt[:, 1] = 9  # a reset environment: its first observation is not the last next_obs
    for b in (buf, copy):
        b.add(obs, nxt, *rest)
    assert len(copy) == len(buf) == 5
    found = all_transitions(copy)
    assert found == all_transitions(buf)
    rewards = [float(step[3][0]) for step in steps]
    for t, m in ((3, 2), (4, 1)):  # cut at the last step before the reset, bootstrapping from it
        tr = found[(0.0, 0.0, float(t))]
        assert tr["next_obs"] == [0.0, 0.0, 5.0] and tr["done"] == 0.0 and tr["discount"] == 0.5 ** m
        assert tr["reward"] == pytest.approx(sum(0.5 ** k * rewards[t + k] for k in range(m)))


def test_seed_comes_from_torch_initial_seed_without_drawing(closing):
    set_random_seed(7)
    np_state, torch_state = np.random.get_state()[1].copy(), torch.get_rng_state().clone()
    a = buffer(closing, seed=None)
    assert (np.random.get_state()[1] == np_state).all() and torch.equal(torch.get_rng_state(), torch_state)
    set_random_seed(7)
    b = buffer(closing, seed=None)
    c = buffer(closing, seed=8)
    for buf in (a, b, c):
        for step in vec_steps([[(50, "term")]], np.random.default_rng(0)):
            buf.add(*step)
    assert torch.equal(a.sample(32).observations, b.sample(32).observations)
    assert not torch.equal(a.sample(32).observations, c.sample(32).observations)


def test_reset_empties_the_buffer(closing):
    buf = buffer(closing)
    steps = list(vec_steps([[(4, "term")]], np.random.default_rng(0)))
    for step in steps:
        buf.add(*step)
    buf.reset()
    assert len(buf) == 0 and buf.pos == 0 and not buf.full
    for step in steps:
        buf.add(*step)
    assert len(buf) == 4


def test_full_after_buffer_size_transitions(closing):
    buf = closing(RepriseReplayBuffer(10, OBS3, spaces.Discrete(2), device="cpu", n_envs=2, seed=0))
    assert buf.buffer_size == 5  # per environment, as SB3
    for step in vec_steps([[(12, "trunc")], [(12, "term")]], np.random.default_rng(0)):
        buf.add(*step)
    assert buf.full and len(buf) == buf.size() == 10


def test_sample_normalizes_with_vec_normalize(closing):
    venv = VecNormalize(DummyVecEnv([lambda: gym.make("CartPole-v1")]), gamma=0.9)
    venv.seed(0)
    venv.reset()
    for _ in range(30):
        venv.step(np.array([venv.action_space.sample()]))
    space = venv.observation_space
    bufs = [closing(RepriseReplayBuffer(100, space, venv.action_space, device="cpu", seed=3)) for _ in range(2)]
    rng = np.random.default_rng(0)
    obs = rng.normal(size=(1, 4)).astype(np.float32)
    for t in range(20):
        nxt = rng.normal(size=(1, 4)).astype(np.float32)
        for b in bufs:
            b.add(obs, nxt, np.array([1]), np.array([t], np.float32), np.array([False]), [{}])
        obs = nxt
    raw, normed = bufs[0].sample(8), bufs[1].sample(8, env=venv)
    assert torch.allclose(normed.observations, torch.as_tensor(venv.normalize_obs(raw.observations.numpy())))
    assert torch.allclose(normed.next_observations, torch.as_tensor(venv.normalize_obs(raw.next_observations.numpy())))
    assert torch.allclose(normed.rewards, torch.as_tensor(venv.normalize_reward(raw.rewards.numpy())))
    assert normed.rewards.dtype == torch.float32


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device (the CPU path runs in every other test)")
def test_samples_gathered_on_the_gpu_equal_the_cpu_ones(closing):
    bufs = [closing(RepriseReplayBuffer(100, OBS3, spaces.Discrete(2), device=d, n_steps=2, seed=5))
            for d in ("cpu", "cuda")]
    for step in vec_steps([[(6, "term"), (5, "trunc")]], np.random.default_rng(0)):
        for b in bufs:
            b.add(*step)
    cpu, gpu = bufs[0].sample(16), bufs[1].sample(16)
    for name, x in cpu._asdict().items():
        assert getattr(gpu, name).device.type == "cuda" and torch.equal(x, getattr(gpu, name).cpu()), name


# --- bad inputs ----------------------------------------------------------------------------------

def test_bad_construction_is_refused_with_clear_messages():
    with pytest.raises(InvalidArgument, match="observation space must be a Box.*got Dict"):
        RepriseReplayBuffer(10, spaces.Dict({"a": OBS3}), spaces.Discrete(2))
    with pytest.raises(InvalidArgument, match="optimize_memory_usage=True is not needed"):
        RepriseReplayBuffer(10, OBS3, spaces.Discrete(2), optimize_memory_usage=True,
                            handle_timeout_termination=False)
    with pytest.raises(InvalidArgument, match="n_steps must be >= 1, got 0"):
        RepriseReplayBuffer(10, OBS3, spaces.Discrete(2), n_steps=0)
    with pytest.raises(InvalidArgument, match="RepriseReplayBuffer: gamma must be a number in \\[0, 1\\], got 1.5"):
        RepriseReplayBuffer(10, OBS3, spaces.Discrete(2), n_steps=2, gamma=1.5)
    with pytest.raises(InvalidArgument, match="replay_buffer_class must be RepriseReplayBuffer"):
        PrioritizedDQN("MlpPolicy", "CartPole-v1", replay_buffer_class=NStepReplayBuffer)
    with pytest.raises(InvalidArgument, match="alpha=None would sample uniformly"):
        PrioritizedDQN("MlpPolicy", "CartPole-v1", replay_buffer_kwargs=dict(alpha=None))
    with pytest.raises(InvalidArgument, match="beta must be a number in \\[0, 1\\], got 2"):
        PrioritizedDQN("MlpPolicy", "CartPole-v1", beta=2)


def test_bad_adds_are_refused_and_change_nothing(closing):
    buf = buffer(closing, n_envs=2)
    steps = list(vec_steps([[(4, "term")], [(4, "trunc")]], np.random.default_rng(0)))
    buf.add(*steps[0])
    before = buf.transitions.table.items()
    obs, nxt, action, reward, done, infos = steps[1]
    bad = [
        (dict(obs=obs[:1]), "obs expects shape \\(2, 3\\) \\(n_envs=2, observation \\(3,\\)\\), got \\(1, 3\\)"),
        (dict(action=np.zeros(3, np.int64)), "action expects 2 values"),
        (dict(action=np.array([[0.5], [1.0]])), "action expects int64.*would lose information"),
        (dict(reward=np.array([np.nan, 0], np.float32)), "reward must be finite"),
        (dict(done=np.array([0.5, 0.0])), "done expects 2 bools"),
        (dict(infos=[{}]), "infos expects a list of 2 dicts"),
    ]
    for change, message in bad:
        args = dict(obs=obs, next_obs=nxt, action=action, reward=reward, done=done, infos=infos)
        args.update(change)
        with pytest.raises(InvalidArgument, match=message):
            buf.add(**args)
        assert buf.transitions.table.items() == before and buf.pos == 1, change
    buf.add(obs, nxt, action, reward, done, infos)  # the good step still goes in
    assert buf.pos == 2


def test_sampling_an_empty_buffer_says_why(closing):
    buf = buffer(closing, n_steps=3)
    with pytest.raises(InvalidArgument, match="empty TransitionBuffer.*n_step=3"):
        buf.sample(4)
    with pytest.raises(NotImplementedError, match="call sample"):
        buf._get_samples(np.arange(3))


class _Frames(gym.Env):
    """8x8 grayscale frames of random bytes, episodes of random length (terminated), for
    VecFrameStack."""
    observation_space = spaces.Box(0, 255, (8, 8, 1), np.uint8)
    action_space = spaces.Discrete(3)

    def __init__(self, seed):
        self._rng = np.random.default_rng(seed)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self._rng.integers(0, 256, (8, 8, 1), dtype=np.uint8), {}

    def step(self, action):
        frame = self._rng.integers(0, 256, (8, 8, 1), dtype=np.uint8)
        return frame, float(self._rng.normal()), bool(self._rng.random() < 0.08), False, {}


@pytest.mark.parametrize("compress", [None, "zstd"])
def test_frame_stack_stores_a_frame_a_step_and_samples_sb3s_transitions(closing, compress):
    """VecFrameStack(4) + VecTransposeImage over two environments with terminations and
    time limits, fed to SB3's ReplayBuffer and to RepriseReplayBuffer(frame_stack=4): the
    same transitions, with one 8x8 frame stored per row."""
    from stable_baselines3.common.buffers import ReplayBuffer
    from stable_baselines3.common.vec_env import VecFrameStack, VecTransposeImage
    venv = VecTransposeImage(VecFrameStack(DummyVecEnv([lambda s=s: TimeLimit(_Frames(s), 15) for s in (1, 2)]), 4))
    space = venv.observation_space
    assert space.shape == (4, 8, 8)
    ours = closing(RepriseReplayBuffer(2000, space, venv.action_space, device="cpu", n_envs=2, frame_stack=4, seed=0,
                                       compress=compress))
    ref = ReplayBuffer(2000, space, venv.action_space, device="cpu", n_envs=2)
    rng = np.random.default_rng(0)
    obs = venv.reset()
    for _ in range(150):
        actions = rng.integers(0, 3, size=2)
        nxt, rewards, dones, infos = venv.step(actions)
        real = nxt.copy()
        for e, d in enumerate(dones):
            if d:
                real[e] = infos[e]["terminal_observation"]
        for buf in (ours, ref):
            buf.add(obs, real, actions.reshape(2, 1), rewards, dones, infos)
        obs = nxt
    venv.close()
    assert ours._transitions.store.signature["obs"].shape == (8, 8)
    assert ours._transitions.store.signature["obs"].compress == compress
    s = ref._get_samples(np.arange(ref.pos))
    expected = {}
    for i in range(ref.pos * 2):  # _get_samples draws a random env per index: read both envs directly
        e, t = i % 2, i // 2
        expected[ref.observations[t, e].tobytes()] = (
            ref.next_observations[t, e].tobytes(), int(ref.actions[t, e, 0]), float(ref.rewards[t, e]),
            float(ref.dones[t, e] * (1 - ref.timeouts[t, e])))
    assert s.observations.shape[1:] == (4, 8, 8)
    got = {}
    draws = ours.sample(6000)
    for i in range(6000):
        got[draws.observations[i].numpy().astype(np.uint8).tobytes()] = (
            draws.next_observations[i].numpy().astype(np.uint8).tobytes(), int(draws.actions[i, 0]),
            float(draws.rewards[i, 0]), float(draws.dones[i, 0]))
    assert len(ours) == 300 and got.keys() == expected.keys()
    for k, (nxt_b, a, r, d) in expected.items():
        assert got[k][0] == nxt_b and got[k][1] == a and got[k][3] == d
        assert got[k][2] == pytest.approx(r, rel=1e-6)
