"""Environments: gymnasium ids, the usual DQN preprocessing for Atari, and greedy evaluation."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from .config import Config


def is_atari(env_id: str) -> bool:
    return env_id.startswith("ALE/")


def make_env(env_id: str, seed: int):
    import gymnasium as gym
    if is_atari(env_id):
        import ale_py
        gym.register_envs(ale_py)
        # The usual DQN preprocessing: no-op starts, frame skip 4 (max-pooled), 84x84 grey, 4 stacked frames.
        env = gym.make(env_id, frameskip=1, repeat_action_probability=0.0)
        env = gym.wrappers.AtariPreprocessing(env, noop_max=30, frame_skip=4, screen_size=84,
                                              terminal_on_life_loss=False, grayscale_obs=True, scale_obs=False)
        env = gym.wrappers.FrameStackObservation(env, 4)
    else:
        env = gym.make(env_id)
    env.reset(seed=seed)
    env.action_space.seed(seed)
    return env


def env_spec(env_id: str) -> dict:
    """Observation shape and dtype, number of actions and reward threshold of ``env_id``."""
    env = make_env(env_id, 0)
    try:
        space = env.observation_space
        threshold = env.spec.reward_threshold if env.spec is not None else None
        if env_id.startswith("ALE/Pong"):
            threshold = threshold or 18.0
        return {"obs_shape": tuple(space.shape), "obs_dtype": "uint8" if is_atari(env_id) else "float32",
                "num_actions": int(env.action_space.n), "reward_threshold": threshold}
    finally:
        env.close()


def evaluate(net, cfg: Config, episodes: int, seed: int, device="cpu") -> list[float]:
    """Greedy returns of ``episodes`` episodes, run side by side with one batched forward per step."""
    import torch
    envs = [make_env(cfg.env, seed + i) for i in range(episodes)]
    obs = [e.reset(seed=seed + i)[0] for i, e in enumerate(envs)]
    returns = [0.0] * episodes
    live = list(range(episodes))
    try:
        while live:
            with torch.no_grad():
                q = net(torch.as_tensor(np.stack([obs[i] for i in live]), device=device))
            actions = q.argmax(dim=1).cpu().numpy()
            still = []
            for i, a in zip(live, actions):
                obs[i], r, terminated, truncated, _ = envs[i].step(int(a))
                returns[i] += float(r)
                if not (terminated or truncated):
                    still.append(i)
            live = still
    finally:
        for e in envs:
            e.close()
    return returns
