"""Distributed Ape-X DQN on Reprise.

    reprise demo apex                      # CartPole-v1 until solved (or --time-limit)
    reprise demo apex --smoke              # about a minute; shows learning
    reprise demo apex --env ALE/Pong-v5    # Atari, with the usual preprocessing (pip install 'reprise[atari]')
    python -m reprise.examples.apex --help

The processes (Horgan et al., "Distributed Prioritized Experience Replay", as laid out in the
in-network replay papers):

- the **supervisor** (this process) owns the tables and serves them with ``rp.Server``; it
  starts the learner and the actors, restarts any that die, shows progress, and at the end
  evaluates the newest parameters and writes ``summary.json`` and ``apex.png``;
- **actors** (``--actors``, default: the cores available) each run ``--envs-per-actor``
  environments with Ape-X's per-environment epsilon ``0.4 ** (1 + 7 i / (N - 1))``, write every
  step once through ``rp.Client(server.local_address)`` and make one item per n-step
  transition over the n + 1 steps it spans (so transitions share their steps), with an initial
  priority |TD error| computed locally from the actor's copy of the network;
- the **learner** (GPU when present) trains a dueling double DQN from the ``replay`` table
  (``Prioritized`` sampler, importance weights, priority updates). A ``SampleToInsertRatio``
  limiter sets how many samples the learner may draw per inserted transition, blocking whichever
  side runs ahead. It publishes its parameters as the one item of the ``params`` table (Reverb's
  "variable container"), which actors sample; a restarted learner reloads them from there.

Episode returns and evaluations travel back to the supervisor through two more Reprise tables
(``episodes`` and ``evals``, both queues).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing as mp
import os
import signal
import sys
import time

from collections import deque
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import reprise as rp

RANDOM_CARTPOLE_RETURN = 22.0  # mean return of a uniformly random policy on CartPole-v1


@dataclass
class Config:
    env: str = "CartPole-v1"
    actors: int = 0                  # 0: the cores available
    envs_per_actor: int = 4
    n_step: int = 3
    gamma: float = 0.99
    hidden: int = 64
    lr: float = 1e-3
    batch_size: int = 128
    samples_per_insert: float = 16.0
    min_replay: int = 2_000
    replay_size: int = 100_000
    priority_exponent: float = 0.6
    beta: float = 0.4                # importance-weight exponent, annealed to 1 over the run
    epsilon: float = 0.4             # Ape-X: actor i of N explores with epsilon ** (1 + alpha i / (N - 1))
    epsilon_alpha: float = 7.0
    target_update: int = 250         # learner steps between target-network copies
    publish_every: int = 25          # learner steps between parameter publications
    sync_every: int = 50             # actor iterations between parameter fetches
    eval_every: float = 5.0          # seconds between the learner's quick evaluations
    quick_eval_episodes: int = 10
    eval_episodes: int = 100         # the solve check and the final evaluation
    solve_return: float | None = None  # default: the environment's reward threshold (475 for CartPole-v1)
    time_limit: float = 600.0
    device: str | None = None        # learner device; default cuda when available
    seed: int = 0
    out: str | None = None
    smoke: bool = False

    def resolved(self) -> "Config":
        c = dataclasses.replace(self)
        if c.actors <= 0:
            c.actors = max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
        if c.out is None:
            c.out = f"reprise-apex-{time.strftime('%Y%m%d-%H%M%S')}"
        return c


# Atari frames are 28 KB a step and each episode is thousands of steps: a smaller replay, a slower
# learning rate, rarer and shorter evaluations (Pong is solved at a mean return of 18).
ATARI = dict(replay_size=50_000, min_replay=10_000, lr=1e-4, samples_per_insert=4.0, batch_size=64,
             target_update=2_000, eval_every=120.0, quick_eval_episodes=1, eval_episodes=5, time_limit=3600.0,
             solve_return=18.0)
SMOKE = dict(time_limit=55.0, min_replay=1_000, replay_size=50_000, eval_every=4.0, eval_episodes=20)


# --- environments and networks ----------------------------------------------------------------

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


def make_network(spec: dict, hidden: int):
    """A dueling Q network: an MLP for vector observations, the Nature CNN for Atari frames."""
    from torch import nn

    class Dueling(nn.Module):
        def __init__(self):
            super().__init__()
            shape = spec["obs_shape"]
            if len(shape) == 3:
                self.body = nn.Sequential(
                    nn.Conv2d(shape[0], 32, 8, stride=4), nn.ReLU(),
                    nn.Conv2d(32, 64, 4, stride=2), nn.ReLU(),
                    nn.Conv2d(64, 64, 3, stride=1), nn.ReLU(), nn.Flatten(),
                    nn.Linear(64 * 7 * 7, 512), nn.ReLU())
                width, self.scale = 512, 1.0 / 255.0
            else:
                self.body = nn.Sequential(nn.Linear(int(np.prod(shape)), hidden), nn.ReLU(),
                                          nn.Linear(hidden, hidden), nn.ReLU())
                width, self.scale = hidden, 1.0
            self.value = nn.Linear(width, 1)
            self.advantage = nn.Linear(width, spec["num_actions"])

        def forward(self, obs):
            h = self.body(obs.float() * self.scale)
            a = self.advantage(h)
            return self.value(h) + a - a.mean(dim=1, keepdim=True)

    return Dueling()


def flat_parameters(net) -> np.ndarray:
    import torch
    with torch.no_grad():
        return torch.cat([p.detach().reshape(-1).float().cpu() for p in net.parameters()]).numpy()


def load_flat_parameters(net, flat) -> None:
    import torch
    flat = torch.as_tensor(np.asarray(flat), dtype=torch.float32)
    offset = 0
    with torch.no_grad():
        for p in net.parameters():
            n = p.numel()
            p.copy_(flat[offset:offset + n].view_as(p))
            offset += n


def num_parameters(spec: dict, hidden: int) -> int:
    return sum(p.numel() for p in make_network(spec, hidden).parameters())


def actor_epsilon(cfg: Config, index: int) -> float:
    total = cfg.actors * cfg.envs_per_actor
    return cfg.epsilon ** (1.0 + cfg.epsilon_alpha * index / max(1, total - 1))


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


# --- tables ---------------------------------------------------------------------------------------

def make_tables(cfg: Config, spec: dict, num_params: int):
    """The replay table (n-step transitions over shared steps), the one-item parameter table
    and the two report queues."""
    writers = cfg.actors * cfg.envs_per_actor
    block = 64
    replay_store = rp.Store({
        "obs": rp.Field(spec["obs_shape"], spec["obs_dtype"]),
        "action": rp.Field((), "int64"),
        "reward": rp.Field((), "float32"),
        "terminal": rp.Field((), "bool"),
    }, capacity=cfg.replay_size + cfg.replay_size // 4 + 4 * block * writers, block_steps=block)
    replay = rp.Table(
        "replay", replay_store,
        sampler=rp.selectors.Prioritized(cfg.priority_exponent),
        remover=rp.selectors.Fifo(),
        max_size=cfg.replay_size,
        rate_limiter=rp.rate_limiters.SampleToInsertRatio(
            cfg.samples_per_insert, cfg.min_replay, error_buffer=max(10.0 * cfg.batch_size, 0.05 * cfg.min_replay * cfg.samples_per_insert)),
        seed=cfg.seed,
    )
    params_store = rp.Store({"weights": rp.Field((num_params,), "float32"), "learner_step": rp.Field((), "int64")},
                            capacity=16, block_steps=1)
    params = rp.Table("params", params_store, sampler=rp.selectors.Lifo(), remover=rp.selectors.Fifo(),
                      max_size=1, rate_limiter=rp.rate_limiters.MinSize(1))
    report_size = 1 << 16
    episodes_store = rp.Store({"episode_return": rp.Field((), "float32"), "episode_length": rp.Field((), "int32"),
                               "actor": rp.Field((), "int32"), "epsilon": rp.Field((), "float32")},
                              capacity=report_size + 64 * (cfg.actors + 2), block_steps=64)
    episodes = rp.Table.queue("episodes", episodes_store, max_size=report_size)
    evals_store = rp.Store({"learner_step": rp.Field((), "int64"), "mean_return": rp.Field((), "float32"),
                            "episodes": rp.Field((), "int32"), "loss": rp.Field((), "float32")},
                           capacity=4096, block_steps=1)
    evals = rp.Table.queue("evals", evals_store, max_size=1024)
    return [replay, params, episodes, evals]


def drain(table) -> dict:
    """Every item waiting in a queue table, as ``{field: array}`` (empty dict when none)."""
    n = table.size
    if n == 0:
        return {}
    s = table.sample(n, timeout=0)
    return {k: v[:, 0] for k, v in s.data.items()}


# --- actor ----------------------------------------------------------------------------------------

class NStepTransitions:
    """One environment's episode stream: every step is written once, and each n-step
    transition is an item over the steps it spans.

    Step t holds ``obs`` s_t, the ``action`` taken there, the ``reward`` it earned and
    ``terminal`` False; an episode ends with a step holding the final observation (``terminal``
    True when the environment terminated, False when a time limit cut it). The item of
    transition t covers steps t .. t + k with k = min(n, steps left): its return is
    ``sum_i gamma^i reward[i] for i < k``, bootstrapped from ``obs[k]`` unless ``terminal[k]``.
    Transitions overlap, so their items share steps. The initial priority is |TD error|
    with the actor's own Q values, as in Ape-X."""

    def __init__(self, writer, table: str, n: int, gamma: float):
        self.writer, self.table, self.n = writer, table, n
        self.discounts = gamma ** np.arange(n + 1)
        self.history = deque(maxlen=n)   # (Q(s_t, a_t), r_t) of the last n transitions

    def _priority(self, k: int, bootstrap: float) -> float:
        """|TD error| of the transition k steps back."""
        recent = list(self.history)[-k:]
        target = float(np.dot(self.discounts[:k], [r for _, r in recent])) + self.discounts[k] * bootstrap
        return abs(target - recent[0][0]) + 1e-3

    def step(self, obs, q_values, action: int, reward: float) -> None:
        """Writes step t; ``q_values`` = Q(s_t, .). The step completes transition t - n."""
        self.writer.append({"obs": obs, "action": action, "reward": reward, "terminal": False})
        if len(self.history) == self.n:
            self.writer.create_item(self.table, self.n + 1, self._priority(self.n, float(np.max(q_values))))
        self.history.append((float(q_values[action]), float(reward)))

    def end(self, final_obs, q_values, terminated: bool) -> None:
        """Writes the final observation and the items of every transition still open."""
        self.writer.append({"obs": final_obs, "action": 0, "reward": 0.0, "terminal": bool(terminated)})
        bootstrap = 0.0 if terminated else float(np.max(q_values))
        for k in range(len(self.history), 0, -1):
            self.writer.create_item(self.table, k + 1, self._priority(k, bootstrap))
        self.writer.end_episode()
        self.history.clear()


def n_step_targets(reward, terminal, lengths, gamma: float, q_bootstrap):
    """Targets ``y`` of a batch of n-step items (torch tensors): ``reward`` [B, n+1], ``terminal``
    [B, n+1], ``lengths`` [B] (k + 1 steps each), ``q_bootstrap`` [B] = Q(obs[k]) by the target net."""
    import torch
    B, width = reward.shape
    n = width - 1
    k = lengths - 1
    rows = torch.arange(B, device=reward.device)
    powers = gamma ** torch.arange(n + 1, device=reward.device, dtype=torch.float64)
    taken = torch.arange(n, device=reward.device) < k[:, None]
    returns = (reward[:, :n].double() * taken * powers[:n]).sum(dim=1)
    alive = ~terminal[rows, k]
    return (returns + powers[k] * alive * q_bootstrap.double()).float()


def actor_main(cfg: Config, actor_id: int, address: str, seed: int) -> None:
    """One actor process: ``cfg.envs_per_actor`` environments, an epsilon each, n-step items
    with initial priorities, parameters fetched every ``cfg.sync_every`` iterations."""
    import torch
    torch.set_num_threads(1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the supervisor stops us
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
                                cfg.n_step, cfg.gamma) for _ in range(E)]
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


# --- learner --------------------------------------------------------------------------------------

def learner_main(cfg: Config, address: str, seed: int, started: float) -> None:
    """The learner process: dueling double DQN on prioritized n-step samples."""
    import torch
    import torch.nn.functional as F
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    torch.manual_seed(seed)
    device = torch.device(cfg.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cpu":
        torch.set_num_threads(1)
    spec = env_spec(cfg.env)
    net = make_network(spec, cfg.hidden).to(device)
    client = rp.Client(address)
    # A restarted learner continues from the newest published parameters.
    step = 0
    try:
        s = client.sample("params", 1, timeout=0)
        load_flat_parameters(net, s.data["weights"][0, 0])
        step = int(s.data["learner_step"][0, 0])
    except rp.errors.Timeout:
        pass
    target = make_network(spec, cfg.hidden).to(device)
    target.load_state_dict(net.state_dict())
    try:
        optimizer = torch.optim.Adam(net.parameters(), lr=cfg.lr, fused=True)
    except (RuntimeError, TypeError):  # a torch without fused Adam for this device
        optimizer = torch.optim.Adam(net.parameters(), lr=cfg.lr)
    # max_sequence_length=1: each item is one step, older steps' blocks go back at once.
    params = client.writer("params", max_sequence_length=1)
    evals = client.writer("evals", max_sequence_length=1)

    def publish():
        params.append({"weights": flat_parameters(net), "learner_step": step})
        params.create_item("params", 1, 1.0)
        params.flush()

    def report(mean_return, episodes, loss):
        evals.append({"learner_step": step, "mean_return": mean_return, "episodes": episodes, "loss": loss})
        evals.create_item("evals", 1, 1.0)
        evals.flush()

    publish()
    sample_device = "cuda" if device.type == "cuda" else None
    threshold = solve_threshold(cfg, spec)
    next_eval = time.monotonic() + cfg.eval_every
    losses = []
    while True:
        try:
            s = client.sample("replay", cfg.batch_size, timeout=1.0, device=sample_device)
        except rp.errors.Timeout:
            continue
        d = {k: torch.as_tensor(v, device=device) for k, v in s.data.items()}
        B = len(s)
        lengths = torch.as_tensor(s.lengths.astype(np.int64), device=device)
        rows = torch.arange(B, device=device)
        boot_obs = d["obs"][rows, lengths - 1]
        q_all = net(torch.cat([d["obs"][:, 0], boot_obs]))
        q_taken = q_all[:B].gather(1, d["action"][:, 0:1]).squeeze(1)
        with torch.no_grad():
            best = q_all[B:].argmax(dim=1, keepdim=True)                     # double DQN: online picks,
            q_next = target(boot_obs).gather(1, best).squeeze(1)            # target evaluates
            y = n_step_targets(d["reward"], d["terminal"], lengths, cfg.gamma, q_next)
        td = y - q_taken
        progress = min(1.0, (time.time() - started) / cfg.time_limit)
        weights = torch.as_tensor(s.importance_weights(cfg.beta + (1.0 - cfg.beta) * progress),
                                  dtype=torch.float32, device=device)
        loss = (weights * F.smooth_l1_loss(q_taken, y, reduction="none")).mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 10.0)
        optimizer.step()
        client.update_priorities("replay", s.keys, td.detach().abs().cpu().numpy().astype(np.float64) + 1e-3)
        losses.append(loss.item())
        step += 1
        if step % cfg.target_update == 0:
            target.load_state_dict(net.state_dict())
        if step % cfg.publish_every == 0:
            publish()
        if time.monotonic() >= next_eval:
            net.eval()
            quick = evaluate(net, cfg, cfg.quick_eval_episodes, seed=10_000 + step, device=device)
            mean_loss = float(np.mean(losses)) if losses else float("nan")
            report(float(np.mean(quick)), len(quick), mean_loss)
            if threshold is not None and np.mean(quick) >= threshold:
                full = evaluate(net, cfg, cfg.eval_episodes, seed=20_000 + step, device=device)
                if np.mean(full) >= threshold:
                    # Solved: publish exactly these parameters (the final evaluation's) and stop
                    # learning; the supervisor ends the run.
                    publish()
                    report(float(np.mean(full)), len(full), mean_loss)
                    while True:
                        time.sleep(1.0)
                report(float(np.mean(full)), len(full), mean_loss)
            net.train()
            losses.clear()
            next_eval = time.monotonic() + cfg.eval_every


def solve_threshold(cfg: Config, spec: dict) -> float | None:
    return cfg.solve_return if cfg.solve_return is not None else spec["reward_threshold"]


# --- supervisor -----------------------------------------------------------------------------------

class Supervisor:
    """Starts the learner and the actors as processes, restarts any that die."""

    def __init__(self, cfg: Config, address: str, started: float):
        self.cfg, self.address, self.started = cfg, address, started
        self.ctx = mp.get_context("spawn")
        self.procs: dict[str, mp.Process] = {}
        self.restarts = {"learner": 0, "actors": 0}
        self.launches = 0

    def start(self, name: str):
        self.launches += 1
        seed = self.cfg.seed * 7919 + self.launches
        if name == "learner":
            p = self.ctx.Process(target=learner_main, args=(self.cfg, self.address, seed, self.started),
                                 name="reprise-apex-learner", daemon=True)
        else:
            actor_id = int(name.split("-")[1])
            p = self.ctx.Process(target=actor_main, args=(self.cfg, actor_id, self.address, seed),
                                 name=f"reprise-apex-{name}", daemon=True)
        p.start()
        self.procs[name] = p

    def start_all(self):
        self.start("learner")
        for i in range(self.cfg.actors):
            self.start(f"actor-{i}")

    def check(self, log) -> None:
        for name, p in list(self.procs.items()):
            if p.exitcode is not None:
                log(f"{name} (pid {p.pid}) exited with {p.exitcode}: restarting it")
                self.restarts["learner" if name == "learner" else "actors"] += 1
                self.start(name)

    def pids(self) -> dict:
        return {name: p.pid for name, p in self.procs.items()}

    def stop(self):
        for p in self.procs.values():
            if p.exitcode is None:
                p.terminate()
        deadline = time.monotonic() + 5.0
        for p in self.procs.values():
            p.join(max(0.0, deadline - time.monotonic()))
            if p.exitcode is None:
                p.kill()
                p.join()


def write_json(path: Path, value) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(value, indent=2))
    os.replace(tmp, path)


def plot(path: Path, history: list[dict], episodes: list[tuple], evals: list[dict], threshold, title: str):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 7), sharex=True)
    if episodes:
        t = np.array([e[0] for e in episodes])
        r = np.array([e[1] for e in episodes])
        top.scatter(t, r, s=3, alpha=0.25, color="tab:blue", label="actor episodes (epsilon-greedy)")
        window = min(100, len(r))
        rolling = np.convolve(r, np.ones(window) / window, mode="valid")
        top.plot(t[window - 1:], rolling, color="tab:blue", label=f"actors, mean of last {window}")
    if evals:
        top.plot([e["time"] for e in evals], [e["mean_return"] for e in evals], "o-", color="tab:orange",
                 markersize=3, label="learner, greedy evaluation")
    if threshold is not None:
        top.axhline(threshold, color="gray", linestyle="--", linewidth=1, label=f"solved ({threshold:g})")
    top.set_ylabel("episode return")
    top.legend(loc="upper left", fontsize=8)
    top.set_title(title)
    if len(history) > 1:
        t = np.array([h["time"] for h in history])
        for key, label in (("inserts", "inserts/s"), ("samples", "samples/s"), ("env_steps", "env steps/s")):
            v = np.array([h[key] for h in history], dtype=float)
            lag = min(10, len(t) - 1)   # rates over about 5 s: episodes report their steps when they end
            rate = (v[lag:] - v[:-lag]) / np.maximum(t[lag:] - t[:-lag], 1e-9)
            bottom.plot(t[lag:], rate, label=label)
        bottom.set_yscale("symlog")
    bottom.set_xlabel("seconds")
    bottom.set_ylabel("replay throughput")
    bottom.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(cfg: Config) -> dict:
    """Runs the demo; returns the summary (also written to ``<out>/summary.json``)."""
    import torch
    cfg = cfg.resolved()
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    spec = env_spec(cfg.env)
    threshold = solve_threshold(cfg, spec)
    tables = make_tables(cfg, spec, num_parameters(spec, cfg.hidden))
    replay, params, episodes_q, evals_q = tables
    server = rp.Server(tables, name=f"apex-{os.getpid()}")
    started = time.time()
    sup = Supervisor(cfg, server.local_address, started)
    history, episodes, evals, log_lines = [], [], [], []
    solved_at = None
    env_steps = 0
    interactive = sys.stderr.isatty()
    from tqdm import tqdm
    bar = tqdm(total=round(cfg.time_limit), unit="s", disable=not interactive, dynamic_ncols=True,
               bar_format="{desc} {percentage:3.0f}%|{bar}| {n:.0f}/{total:.0f} s {postfix}",
               desc=f"apex {cfg.env}")

    def log(msg):
        line = f"[{time.time() - started:6.1f}s] {msg}"
        log_lines.append(line)
        (tqdm.write if interactive else print)(line, file=sys.stderr)

    device = cfg.device or ("cuda" if torch.cuda.is_available() else "cpu")
    log(f"serving replay, params, episodes, evals at {server.local_address}; "
        f"{cfg.actors} actors x {cfg.envs_per_actor} envs, learner on {device}")
    sup.start_all()
    last_print = 0.0
    try:
        while True:
            time.sleep(0.5)
            now = time.time() - started
            got = drain(episodes_q)
            for ret, length in zip(got.get("episode_return", []), got.get("episode_length", [])):
                episodes.append((now, float(ret)))
                env_steps += int(length)
            got = drain(evals_q)
            for i in range(len(got.get("mean_return", []))):
                e = {"time": now, "learner_step": int(got["learner_step"][i]),
                     "mean_return": float(got["mean_return"][i]), "episodes": int(got["episodes"][i]),
                     "loss": float(got["loss"][i])}
                evals.append(e)
                if e["episodes"] >= cfg.eval_episodes and threshold is not None and e["mean_return"] >= threshold:
                    solved_at = e
            info = replay.info()
            history.append({"time": now, "inserts": info["num_inserts"], "samples": info["num_samples"],
                            "env_steps": env_steps})
            sup.check(log)
            recent = [r for _, r in episodes[-100:]]
            window = [h for h in history if h["time"] >= now - 5.0]
            rates = {k: (window[-1][k] - window[0][k]) / max(1e-9, window[-1]["time"] - window[0]["time"])
                     for k in ("inserts", "samples", "env_steps")} if len(window) > 1 else {}
            status = {
                "time": now, "pids": sup.pids(), "restarts": sup.restarts, "env_steps": env_steps,
                "inserts": info["num_inserts"], "samples": info["num_samples"], "episodes": len(episodes),
                "learner_step": evals[-1]["learner_step"] if evals else 0,
                "mean_actor_return": float(np.mean(recent)) if recent else None,
                "last_eval": evals[-1]["mean_return"] if evals else None,
            }
            write_json(out / "status.json", status)
            if rates:
                postfix = (f"env {rates['env_steps']:,.0f}/s ins {rates['inserts']:,.0f}/s "
                           f"smp {rates['samples']:,.0f}/s return {status['mean_actor_return'] or 0:.0f} "
                           f"eval {status['last_eval'] if status['last_eval'] is not None else float('nan'):.0f}")
                bar.set_postfix_str(postfix, refresh=False)
                if not interactive and now - last_print >= 10.0:
                    last_print = now
                    print(f"[{now:6.1f}s] {postfix}", file=sys.stderr, flush=True)
            bar.update(min(round(now), bar.total) - bar.n)
            if solved_at is not None:
                log(f"solved: greedy mean return {solved_at['mean_return']:.1f} over {solved_at['episodes']} "
                    f"episodes at learner step {solved_at['learner_step']}")
                break
            if now >= cfg.time_limit:
                log(f"time limit ({cfg.time_limit:g} s) reached")
                break
    except KeyboardInterrupt:
        log("interrupted")
    finally:
        bar.close()
        sup.stop()
    elapsed = time.time() - started

    # The final evaluation: the newest published parameters, greedy, in this process.
    net = make_network(spec, cfg.hidden)
    p = params.sample(1, timeout=0)
    load_flat_parameters(net, p.data["weights"][0, 0])
    net.eval()
    final = evaluate(net, cfg, cfg.eval_episodes, seed=123_456)
    info = replay.info()
    recent = [r for _, r in episodes[-100:]]
    summary = {
        "env": cfg.env,
        "solved": solved_at is not None,
        "solve_threshold": threshold,
        "solved_at_seconds": solved_at["time"] if solved_at else None,
        "solved_at_learner_step": solved_at["learner_step"] if solved_at else None,
        "final_eval_mean_return": float(np.mean(final)),
        "final_eval_episodes": len(final),
        "final_eval_returns": final,
        "final_learner_step": int(p.data["learner_step"][0, 0]),
        "random_policy_return": RANDOM_CARTPOLE_RETURN if cfg.env.startswith("CartPole") else None,
        "mean_actor_return_last_100": float(np.mean(recent)) if recent else None,
        "seconds": elapsed,
        "env_steps": env_steps,
        "episodes": len(episodes),
        "inserts": info["num_inserts"],
        "samples": info["num_samples"],
        "inserts_per_second": info["num_inserts"] / elapsed,
        "samples_per_second": info["num_samples"] / elapsed,
        "samples_per_insert": info["num_samples"] / max(1, info["num_inserts"]),
        "restarts": sup.restarts,
        "learner_device": device,
        "evals": evals,
        "replay_info": info,
        "log": log_lines,
        "config": dataclasses.asdict(cfg),
    }
    write_json(out / "summary.json", summary)
    plot(out / "apex.png", history, episodes, evals, threshold,
         f"Ape-X DQN on Reprise: {cfg.env}, {cfg.actors} actors x {cfg.envs_per_actor} envs")
    server.stop()
    for s in {id(t.store): t.store for t in tables}.values():
        s.close()
    print(f"{'solved' if summary['solved'] else 'not solved'} in {elapsed:.0f} s: final greedy mean return "
          f"{summary['final_eval_mean_return']:.1f} over {len(final)} episodes; {env_steps:,} env steps, "
          f"{info['num_inserts']:,} inserts, {info['num_samples']:,} samples "
          f"({summary['samples_per_insert']:.1f} per insert); restarts {sup.restarts}")
    print(f"wrote {out / 'summary.json'} and {out / 'apex.png'}")
    return summary


def parse_args(argv) -> Config:
    d = Config()
    p = argparse.ArgumentParser(prog="reprise demo apex", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--env", default=d.env, help="a gymnasium id; ALE/<Game>-v5 for Atari (needs the atari extra)")
    p.add_argument("--actors", type=int, default=d.actors, help="actor processes (0: the cores available)")
    p.add_argument("--envs-per-actor", type=int, default=d.envs_per_actor)
    p.add_argument("--n-step", type=int, default=d.n_step)
    p.add_argument("--gamma", type=float, default=d.gamma)
    p.add_argument("--hidden", type=int, default=d.hidden, help="MLP width (vector observations)")
    p.add_argument("--lr", type=float, default=d.lr)
    p.add_argument("--batch-size", type=int, default=d.batch_size)
    p.add_argument("--samples-per-insert", type=float, default=d.samples_per_insert)
    p.add_argument("--min-replay", type=int, default=d.min_replay)
    p.add_argument("--replay-size", type=int, default=d.replay_size)
    p.add_argument("--priority-exponent", type=float, default=d.priority_exponent)
    p.add_argument("--target-update", type=int, default=d.target_update)
    p.add_argument("--eval-episodes", type=int, default=d.eval_episodes)
    p.add_argument("--solve-return", type=float, default=None,
                   help="mean greedy return over --eval-episodes that ends the run (default: the env's threshold)")
    p.add_argument("--time-limit", type=float, default=d.time_limit, help="seconds")
    p.add_argument("--device", default=None, help="learner device (default: cuda when available, else cpu)")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--out", default=None, help="output directory (default: ./reprise-apex-<time>)")
    p.add_argument("--smoke", action="store_true", help="a short run (about a minute) for CI")
    a = p.parse_args(argv)
    values = {f.name: getattr(a, f.name) for f in dataclasses.fields(Config) if hasattr(a, f.name)}
    for k, v in ATARI.items() if is_atari(values["env"]) else ():
        if values.get(k, getattr(d, k)) == getattr(d, k):
            values[k] = v
    if a.smoke:
        for k, v in SMOKE.items():
            if values.get(k, getattr(d, k)) == getattr(d, k):   # explicit options win over the smoke defaults
                values[k] = v
    for name in ("actors", "envs_per_actor", "n_step", "batch_size", "min_replay", "replay_size", "target_update",
                 "eval_episodes", "hidden"):
        floor = 0 if name == "actors" else 1
        if values[name] < floor:
            p.error(f"--{name.replace('_', '-')} must be >= {floor}, got {values[name]}")
    if values["min_replay"] > values["replay_size"]:
        p.error(f"--min-replay ({values['min_replay']}) must be <= --replay-size ({values['replay_size']})")
    if not (0.0 < values["gamma"] <= 1.0):
        p.error(f"--gamma must be in (0, 1], got {values['gamma']}")
    if values["samples_per_insert"] <= 0 or values["time_limit"] <= 0 or values["lr"] <= 0:
        p.error("--samples-per-insert, --time-limit and --lr must be > 0")
    return Config(**values)


def main(argv=None) -> int:
    cfg = parse_args(sys.argv[1:] if argv is None else argv)
    summary = run(cfg)
    return 0 if (summary["solved"] or cfg.smoke or summary["final_eval_mean_return"] > 0) else 1


if __name__ == "__main__":
    sys.exit(main())
