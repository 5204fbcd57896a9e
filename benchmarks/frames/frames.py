"""Pong frames for the frame benchmarks: ``collect(n, path)`` plays ``ALE/Pong-v5`` with a
random policy through gymnasium's ``AtariPreprocessing`` (84x84 grayscale, frame skip 4) and
saves ``frames`` (uint8[steps, 84, 84], each step's newest frame), ``first`` (True where an
episode starts), ``action``, ``reward``, ``terminated`` and ``truncated`` to an ``.npz``; ``transitions``
walks it as a ``FrameStackObservation(4)`` agent sees it (episode starts padded by
repeating the reset frame, gymnasium's default ``padding_type="reset"``). numpy only, so
every system's venv can read the file."""

from __future__ import annotations

import numpy as np

STACK = 4


def collect(n: int, path: str, seed: int = 0) -> None:
    import ale_py
    import gymnasium as gym
    gym.register_envs(ale_py)
    env = gym.make("ALE/Pong-v5", frameskip=1, repeat_action_probability=0.0)
    env = gym.wrappers.AtariPreprocessing(env, frame_skip=4, screen_size=84, grayscale_obs=True, noop_max=30)
    rng = np.random.default_rng(seed)
    frames = np.empty((n + 1, 84, 84), np.uint8)
    first = np.zeros(n + 1, bool)
    action = np.zeros(n + 1, np.int64)
    reward = np.zeros(n + 1, np.float32)
    terminated = np.zeros(n + 1, bool)
    truncated = np.zeros(n + 1, bool)
    obs, _ = env.reset(seed=seed)
    frames[0], first[0] = obs, True
    i = 0
    while i < n:
        a = int(rng.integers(env.action_space.n))
        obs, r, term, trunc, _ = env.step(a)
        i += 1
        frames[i], action[i], reward[i], terminated[i], truncated[i] = obs, a, r, term, trunc
        if (term or trunc) and i < n:  # the next slot is the next episode's reset frame
            obs, _ = env.reset()
            i += 1
            frames[i], first[i] = obs, True
    env.close()
    np.savez(path, frames=frames, first=first, action=action, reward=reward, terminated=terminated,
             truncated=truncated)


def transitions(path: str, limit: int | None = None):
    """Yields ``(obs, action, reward, next_obs, terminated, truncated, episode_end)`` with
    ``obs``/``next_obs`` uint8[4, 84, 84] stacks, newest frame last."""
    d = np.load(path)
    frames, first = d["frames"], d["first"]
    action, reward, terminated, truncated = d["action"], d["reward"], d["terminated"], d["truncated"]
    stack = None
    count = 0
    for i in range(len(frames) - 1):
        if first[i]:
            stack = np.repeat(frames[i][None], STACK, 0)
        if first[i + 1]:  # frame i + 1 starts another episode: no transition into it
            continue
        nxt = np.concatenate([stack[1:], frames[i + 1][None]])
        term = bool(terminated[i + 1])
        end = term or bool(truncated[i + 1]) or i + 2 >= len(frames)
        yield stack, int(action[i + 1]), float(reward[i + 1]), nxt, term, end and not term, end
        stack = nxt
        count += 1
        if limit is not None and count >= limit:
            return
