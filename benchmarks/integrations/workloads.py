"""What the integrations comparison's parts share (``benchmarks.integrations.compare``):
sizes, the replay arms, recorded transitions and how memory is read.

Recorded transitions. Every replay arm replays the same steps of real environments, recorded
once by the driver through Stable-Baselines3's own wrappers with random actions (seed 0):
``CartPole-v1`` (float32[4]) and, when ``ale-py`` is installed, ``PongNoFrameskip-v4``
through ``make_atari_env`` (``AtariWrapper``) + ``VecFrameStack(4)`` + ``VecTransposeImage``,
the uint8[4,84,84] stacks SB3's DQN stores (without ``ale-py``: random frames, and the
report says so). Stored as SB3's ``_store_transition`` hands them to ``add``: ``next_obs``
is the real final observation of a finished episode; a time limit is a truncation
(``TimeLimit.truncated``). The last recorded step is marked truncated, so replaying the
recording in a loop never joins two episodes.

Replay arms (``ARMS``): SB3's ``ReplayBuffer`` as DQN builds it (``sb3``), with
``optimize_memory_usage=True`` (``sb3_opt``; SB3 then requires
``handle_timeout_termination=False``, so time limits count as terminations), and Reprise's
``reprise.integrations.sb3.RepriseReplayBuffer`` with its default sizing (``reprise``:
``min_episode_length=1``, room for episodes of one step, up to 2 rows per transition) and
told the shortest episode to expect (``reprise_mel``: ``min_episode_length`` = the
recording's shortest episode, the best a user who knows their environment can do), and for
Atari with ``frame_stack=4`` as well (``reprise_fs``: a row holds one 84x84 frame, the stacks
are put back together at sample time). Every arm is built with n_envs=1 on the CPU.

Memory. "Reserved" is what a buffer allocates for its data: SB3 the ``nbytes`` of its
arrays, Reprise its store's file (capacity x row bytes, all fields). "RSS" is the growth of
the process's anonymous + shared-memory resident set (``RssAnon + RssShmem``) from before
the buffer was built to after it was filled twice over, so every page it will ever touch is
touched, and it counts what reserved does not (the table's per-item metadata). Both are
divided by the buffer's capacity in transitions.

numpy and the standard library at import time; torch, gymnasium and SB3 inside functions.
"""

from __future__ import annotations

import os

import numpy as np

from benchmarks.common.config import Config

OBS_KINDS = ["cartpole", "atari"]
ARMS = ["sb3", "sb3_opt", "reprise", "reprise_mel", "reprise_fs"]
# Arms that apply to some observation kinds only (the others skip them).
ARM_KINDS = {"reprise_fs": ("atari",)}
DQN_ARMS = ["sb3", "reprise"]
BATCH = 256
# Where Reprise's reserved bytes per transition are also read (an empty buffer): Atari DQN's
# usual buffer (RL Zoo), where the store's fixed slack is small.
LARGE_CAPACITY = 100_000
ENV_IDS = {"cartpole": "CartPole-v1", "atari": "PongNoFrameskip-v4"}
# The core suite's TorchRL workloads this suite runs on both storages (keys of core/workloads.py).
TORCHRL_ONLY = "insert_batched[400B],insert_batched[4KB],sample_uniform[400B],sample_uniform[4KB],prioritized_round"

FULL = dict(rounds=5, round_seconds=0.3, warmup_seconds=0.3, budget_seconds=240.0,
            capacity={"cartpole": 100_000, "atari": 4_096},
            record_steps={"cartpole": 20_000, "atari": 6_000},
            fill_factor=2, replay_repeats=3,
            dqn_steps=20_000, dqn_repeats=3, torchrl_passes=2, torch_threads=1)
QUICK = dict(rounds=2, round_seconds=0.05, warmup_seconds=0.02, budget_seconds=90.0,
             capacity={"cartpole": 1_000, "atari": 256},
             record_steps={"cartpole": 1_500, "atari": 400},
             replay_repeats=1, dqn_steps=1_500, dqn_repeats=1, torchrl_passes=1)

# DQN on CartPole-v1: RL Zoo's tuned hyperparameters (rl-baselines3-zoo hyperparams/dqn.yml).
DQN_KWARGS = dict(learning_rate=2.3e-3, batch_size=64, buffer_size=100_000, learning_starts=1_000,
                  gamma=0.99, target_update_interval=10, train_freq=256, gradient_steps=128,
                  exploration_fraction=0.16, exploration_final_eps=0.04,
                  policy_kwargs=dict(net_arch=[256, 256]))


def make_config(quick: bool, budget: float | None) -> Config:
    return Config.choose(quick, budget, FULL, QUICK)


# --- memory -----------------------------------------------------------------------------------
def resident_bytes() -> int:
    """This process's anonymous + shared-memory resident bytes (not mapped files)."""
    out = 0
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("RssAnon:", "RssShmem:")):
                out += int(line.split()[1]) * 1024
    return out


# --- recorded transitions ------------------------------------------------------------------------
def _vec_env(kind: str, seed: int):
    if kind == "cartpole":
        from stable_baselines3.common.env_util import make_vec_env
        return make_vec_env(ENV_IDS[kind], n_envs=1, seed=seed)
    import ale_py
    import gymnasium as gym
    from stable_baselines3.common.env_util import make_atari_env
    from stable_baselines3.common.vec_env import VecFrameStack, VecTransposeImage
    gym.register_envs(ale_py)
    return VecTransposeImage(VecFrameStack(make_atari_env(ENV_IDS[kind], n_envs=1, seed=seed), 4))


def atari_available() -> bool:
    import importlib.util
    return importlib.util.find_spec("ale_py") is not None


def record(kind: str, steps: int, seed: int = 0, synthetic: bool = False) -> dict:
    """``steps`` transitions of random actions as arrays: ``obs`` [steps + 1, ...] (obs[t] is
    step t's observation; obs[t + 1] the next step's, a reset's after an episode ended),
    ``final`` [episodes, ...] with ``final_at`` (the steps whose next_obs is a final
    observation), ``action`` int64 [steps], ``reward`` float32, ``done``, ``truncated`` bool.
    ``synthetic``: stacks of 4 random uint8[84,84] frames as VecFrameStack makes them (each
    step's stack is the last one shifted by a new frame), episodes of 500 steps (no emulator)."""
    if synthetic:
        rng = np.random.default_rng(seed)
        frames = rng.integers(0, 256, (steps + 4, 84, 84), dtype=np.uint8)
        obs = np.stack([frames[t:t + 4] for t in range(steps + 1)])
        done = (np.arange(steps) % 500) == 499
        done[-1] = True
        truncated = done.copy()
        final_at = np.flatnonzero(done)
        final = np.stack([np.concatenate([obs[t, 1:], rng.integers(0, 256, (1, 84, 84), dtype=np.uint8)])
                          for t in final_at])
        return dict(obs=obs, final=final,
                    final_at=final_at, action=rng.integers(0, 6, steps), reward=np.zeros(steps, np.float32),
                    done=done, truncated=truncated, synthetic=np.array(True))
    env = _vec_env(kind, seed)
    env.action_space.seed(seed)
    first = env.reset()
    obs = np.empty((steps + 1, *first.shape[1:]), first.dtype)
    obs[0] = first[0]
    action = np.empty(steps, np.int64)
    reward = np.empty(steps, np.float32)
    done = np.empty(steps, bool)
    truncated = np.zeros(steps, bool)
    final, final_at = [], []
    for t in range(steps):
        a = env.action_space.sample()
        o, r, d, infos = env.step(np.array([a]))
        obs[t + 1], action[t], reward[t], done[t] = o[0], a, r[0], d[0]
        if d[0]:
            truncated[t] = bool(infos[0].get("TimeLimit.truncated", False))
            final.append(infos[0]["terminal_observation"])
            final_at.append(t)
    env.close()
    if not done[-1]:  # end the recording's last episode: a loop over it never joins two
        done[-1] = truncated[-1] = True
        final.append(obs[-1].copy())
        final_at.append(steps - 1)
    return dict(obs=obs, final=np.stack(final), final_at=np.array(final_at), action=action, reward=reward,
                done=done, truncated=truncated, synthetic=np.array(False))


def episode_lengths(rec: dict) -> list[int]:
    ends = np.flatnonzero(rec["done"])
    return np.diff(np.concatenate([[-1], ends])).tolist()


def save(path: str, rec: dict) -> None:
    np.savez(path, **rec)


def load(path: str) -> dict:
    with np.load(path) as f:
        return {k: f[k] for k in f.files}


class Steps:
    """A recording as the arguments of SB3's ``ReplayBuffer.add`` (n_envs=1), views of its
    arrays, replayed in a loop by ``next_args``."""

    def __init__(self, rec: dict) -> None:
        obs, n = rec["obs"], len(rec["action"])
        finals = dict(zip(rec["final_at"].tolist(), rec["final"]))
        self.args = []
        for t in range(n):
            nxt = finals[t][None] if t in finals else obs[t + 1:t + 2]
            info = {"TimeLimit.truncated": True} if rec["truncated"][t] else {}
            self.args.append((obs[t:t + 1], nxt, rec["action"][t:t + 1, None], rec["reward"][t:t + 1],
                              rec["done"][t:t + 1], [info]))
        self.i = 0

    def next_args(self) -> tuple:
        a = self.args[self.i]
        self.i = (self.i + 1) % len(self.args)
        return a


def data_path(data_dir: str, kind: str) -> str:
    return os.path.join(data_dir, f"{kind}.npz")
