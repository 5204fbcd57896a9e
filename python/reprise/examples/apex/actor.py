"""An actor process: epsilon-greedy environments writing n-step items into ``replay``."""

from __future__ import annotations

import numpy as np

import reprise as rp

from ..stopping import child_setup
from .config import Config
from .envs import env_spec, make_env
from .model import load_flat_parameters, make_network
from .nstep import NStepTransitions
from .tables import stacks_frames


def actor_epsilon(cfg: Config, index: int) -> float:
    """Ape-X's epsilon of environment ``index`` of all the actors' environments."""
    total = cfg.actors * cfg.envs_per_actor
    return cfg.epsilon ** (1.0 + cfg.epsilon_alpha * index / max(1, total - 1))


def actor_main(cfg: Config, actor_id: int, address: str, seed: int, parent: int) -> None:
    """One actor process: ``cfg.envs_per_actor`` environments, an epsilon each, n-step items
    with initial priorities, parameters fetched every ``cfg.sync_every`` iterations. The
    supervisor (``parent``) stops it with SIGTERM; it ignores the terminal's SIGINT."""
    child_setup(parent)
    import torch
    torch.set_num_threads(1)
    spec = env_spec(cfg.env)
    net = make_network(spec, cfg.hidden)
    rng = np.random.default_rng(seed)
    client = rp.Client(address)
    first = client.sample("params", 1)  # blocks until the learner has published
    load_flat_parameters(net, first.data["weights"][0, 0])
    version = int(first.data["learner_step"][0, 0])

    E = cfg.envs_per_actor
    envs = [make_env(cfg.env, seed * 1000 + j) for j in range(E)]
    eps = np.array([actor_epsilon(cfg, actor_id * E + j) for j in range(E)])
    streams = [NStepTransitions(client.writer("replay", max_sequence_length=cfg.n_step + 1), "replay",
                                cfg.n_step, cfg.gamma, newest_frame=stacks_frames(spec)) for _ in range(E)]
    reports = client.writer("episodes", max_sequence_length=1)
    obs = [e.reset(seed=seed * 1000 + j)[0] for j, e in enumerate(envs)]
    ep_return = [0.0] * E
    ep_length = [0] * E
    iteration = 0
    while True:
        with torch.no_grad():
            q = net(torch.as_tensor(np.stack(obs))).numpy()
        greedy = q.argmax(axis=1)
        explore = rng.random(E) < eps
        actions = np.where(explore, rng.integers(0, spec["num_actions"], E), greedy)
        finals = []
        for j, env in enumerate(envs):
            a = int(actions[j])
            next_obs, r, terminated, truncated, _ = env.step(a)
            streams[j].step(obs[j], q[j], a, float(r))
            ep_return[j] += float(r)
            ep_length[j] += 1
            if terminated or truncated:
                finals.append((j, next_obs, terminated))
            else:
                obs[j] = next_obs
        if finals:
            # Q of the final observations: the bootstrap of transitions cut by a time limit.
            with torch.no_grad():
                q_final = net(torch.as_tensor(np.stack([o for _, o, _ in finals]))).numpy()
            for (j, final_obs, terminated), qf in zip(finals, q_final):
                streams[j].end(final_obs, qf, terminated)
                reports.append({"episode_return": ep_return[j], "episode_length": ep_length[j],
                                "actor": actor_id, "epsilon": float(eps[j])})
                reports.create_item("episodes", 1, 1.0)
                reports.flush()
                ep_return[j], ep_length[j] = 0.0, 0
                obs[j] = envs[j].reset()[0]
        iteration += 1
        if iteration % cfg.sync_every == 0:
            s = client.sample("params", 1)
            step = int(s.data["learner_step"][0, 0])
            if step != version:
                load_flat_parameters(net, s.data["weights"][0, 0])
                version = step
