"""Environments: gymnasium ids (Atari ones through ``atari``), the check of ``--env``, and greedy evaluation."""

from __future__ import annotations

import numpy as np

from .atari import ATARI_MODULES, is_atari, make_atari_env
from .config import Config


def make_env(env_id: str, seed: int):
    import gymnasium as gym
    env = make_atari_env(env_id) if is_atari(env_id) else gym.make(env_id)
    env.reset(seed=seed)
    env.action_space.seed(seed)
    return env


class UnsupportedEnv(ValueError):
    """``--env`` names an environment the demo cannot run; the message says why and what it supports."""


SUPPORTED = ("supported: gymnasium environments with a Discrete action space and vector observations (a 1-D "
             "Box), such as CartPole-v1, Acrobot-v1, MountainCar-v0 or LunarLander-v3 (box2d), and Atari games "
             "as ALE/<Game>-v5 (pip install 'reprise[atari]')")


def _missing_modules(names) -> list[str]:
    import importlib.util
    missing = []
    for name in names:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):  # ValueError: a module set to None in sys.modules
            found = False
        if not found:
            missing.append(name)
    return missing


def env_spec(env_id: str) -> dict:
    """Observation shape and dtype, number of actions and reward threshold of ``env_id``.
    Raises ``UnsupportedEnv`` (naming the environment, what it has and what the demo
    supports) for one it cannot run: unknown ids, missing dependencies, continuous actions,
    observations that are not vectors (or Atari frames)."""
    atari = is_atari(env_id)
    if atari:
        missing = _missing_modules(ATARI_MODULES)
        if missing:
            names = " and ".join(ATARI_MODULES[m] for m in missing)
            raise UnsupportedEnv(f"--env {env_id} needs the atari extra ({names} {'is' if len(missing) == 1 else 'are'} "
                                 "not installed here): pip install 'reprise[atari]'")
    import gymnasium as gym
    try:
        env = make_env(env_id, 0)
    except gym.error.Error as e:  # an unknown id or version, a missing dependency such as box2d
        raise UnsupportedEnv(f"--env {env_id}: {str(e).rstrip('. ')}; {SUPPORTED}") from None
    except ImportError as e:
        raise UnsupportedEnv(f"--env {env_id} needs a module that is not installed ({e}); {SUPPORTED}") from None
    try:
        actions, space = env.action_space, env.observation_space
        threshold = env.spec.reward_threshold if env.spec is not None else None
    finally:
        env.close()
    if not isinstance(actions, gym.spaces.Discrete) or int(actions.start) != 0:
        raise UnsupportedEnv(f"--env {env_id} has the action space {actions}; the demo's DQN chooses one of n "
                             f"actions, so it needs a Discrete(n) action space; {SUPPORTED}")
    if not isinstance(space, gym.spaces.Box) or (not atari and len(space.shape) != 1):
        raise UnsupportedEnv(f"--env {env_id} has the observation space {space}; the demo's network reads "
                             f"vector observations (a 1-D Box) or Atari frames; {SUPPORTED}")
    if env_id.startswith("ALE/Pong"):
        threshold = threshold or 18.0
    return {"obs_shape": tuple(space.shape), "obs_dtype": "uint8" if atari else "float32",
            "num_actions": int(actions.n), "reward_threshold": threshold}


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
