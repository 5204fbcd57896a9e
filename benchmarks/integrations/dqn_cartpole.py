"""One DQN training run of the integrations comparison, part 2, in its own process:
``python -m benchmarks.integrations.dqn_cartpole --arm reprise --seed 0 [--quick]``.

SB3's ``DQN("MlpPolicy", "CartPole-v1")`` with RL Zoo's tuned hyperparameters
(``workloads.DQN_KWARGS``: a 100k buffer, 128 gradient steps of 64 every 256 env steps), on
the CPU with ``torch_threads`` intra-op threads, with SB3's default ``ReplayBuffer``
(``sb3``) or ``replay_buffer_class=RepriseReplayBuffer`` (``reprise``), and nothing else
different. ``learn(total_timesteps=dqn_steps)`` is timed (the model is built before);
env steps/s = steps taken (``num_timesteps``: whole rollouts of
``train_freq``) / seconds. The last 20 episodes' mean return rides along as a sanity
check (the two buffers draw different batches, so it differs between arms).
"""

from __future__ import annotations

import time

import numpy as np

from benchmarks.common.bench import Bench, package_versions
from benchmarks.integrations.sb3_replay import reprise_buffer_class
from benchmarks.integrations.workloads import DQN_ARMS, DQN_KWARGS, make_config


def train(cfg, arm: str, seed: int) -> dict:
    from stable_baselines3 import DQN

    kwargs = dict(DQN_KWARGS)
    path = "stable_baselines3 ReplayBuffer"
    if arm == "reprise":
        cls, path = reprise_buffer_class()
        kwargs["replay_buffer_class"] = cls
    model = DQN("MlpPolicy", "CartPole-v1", seed=seed, device="cpu", verbose=0, **kwargs)
    t0 = time.perf_counter()
    model.learn(total_timesteps=cfg.dqn_steps)
    seconds = time.perf_counter() - t0
    returns = [ep["r"] for ep in list(model.ep_info_buffer)[-20:]]
    buffer = model.replay_buffer
    steps = int(model.num_timesteps)  # whole rollouts of train_freq steps: a few past dqn_steps
    out = dict(path=path, steps=steps, seconds=seconds, steps_per_s=steps / seconds,
               gradient_steps=int(model._n_updates), buffer_held=int(buffer.size()),
               mean_return_last20=float(np.mean(returns)) if returns else None)
    if hasattr(buffer, "close"):
        buffer.close()
    return out


def main() -> None:
    bench = Bench("dqn", "integrations", make_config,
                  lambda ap: (ap.add_argument("--arm", required=True, choices=DQN_ARMS),
                              ap.add_argument("--seed", type=int, default=0)))
    import torch

    torch.set_num_threads(bench.cfg.torch_threads)
    bench.system = f"dqn:{bench.args.arm}"
    bench.versions.update(package_versions("stable-baselines3", "torch", "gymnasium", "reprise"))
    bench.notes.append(f"torch intra-op threads: {torch.get_num_threads()}")
    bench.run("dqn_cartpole", train, bench.cfg, bench.args.arm, bench.args.seed)
    bench.finish()


if __name__ == "__main__":
    main()
