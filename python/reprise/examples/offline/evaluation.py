"""Evaluation online in CartPole-v1: the model acting greedily, conditioned on
``--target-return``, and a uniformly random policy beside it."""

from __future__ import annotations

from .config import ENV, Config
from .model import RTG_SCALE


def evaluate(model, torch, dev, cfg: Config, episodes: int, state_mean, state_std, max_timestep, seed: int) -> list:
    """Returns of ``episodes`` episodes acting greedily, conditioned on ``cfg.target_return``."""
    import gymnasium as gym
    env = gym.make(ENV)
    k = cfg.context
    model.eval()
    returns = []
    with torch.no_grad():
        for i in range(episodes):
            obs, _ = env.reset(seed=seed + i)
            limit = env.spec.max_episode_steps or 10_000
            states = torch.zeros(limit, obs.shape[0], device=dev)
            actions = torch.zeros(limit, dtype=torch.long, device=dev)
            rtg = torch.zeros(limit, device=dev)
            timesteps = torch.arange(limit, device=dev).clamp(max=max_timestep)
            remaining, total, done, t = cfg.target_return, 0.0, False, 0
            while not done:
                states[t] = (torch.as_tensor(obs, device=dev) - state_mean) / state_std
                rtg[t] = remaining / RTG_SCALE
                lo = max(0, t + 1 - k)
                logits = model(rtg[None, lo:t + 1], states[None, lo:t + 1], actions[None, lo:t + 1],
                               timesteps[None, lo:t + 1])
                a = int(logits[0, -1].argmax())
                actions[t] = a
                obs, r, terminated, truncated, _ = env.step(a)
                remaining -= r
                total += r
                done, t = terminated or truncated, t + 1
            returns.append(total)
    env.close()
    model.train()
    return returns


def random_returns(episodes: int, seed: int) -> list:
    import gymnasium as gym
    env = gym.make(ENV)
    env.action_space.seed(seed)
    out = []
    for i in range(episodes):
        env.reset(seed=seed + i)
        total, done = 0.0, False
        while not done:
            _, r, terminated, truncated, _ = env.step(env.action_space.sample())
            total, done = total + r, terminated or truncated
        out.append(total)
    env.close()
    return out
