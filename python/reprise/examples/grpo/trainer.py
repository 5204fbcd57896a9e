"""The trainer process: draws token-budget batches of whole groups under the staleness
bound, computes group-normalised advantages, takes a clipped importance-ratio step over
``packed()`` micro-batches split by tokens, then moves the version and publishes the
parameters (one item of ``params``) for the rollout workers."""

from __future__ import annotations

import time

import numpy as np

import reprise as rp

from ..stopping import child_setup
from ..children import connect
from .config import Config
from .model import answer_logprobs, flat_parameters, generate, make_policy
from .task import LENGTH, PROMPT, SEQUENCE, eval_prompts, rewards


def group_advantages(reward: np.ndarray, group: np.ndarray) -> np.ndarray:
    """GRPO's advantage: each reward minus its group's mean, over the group's standard
    deviation (+1e-4). A group's members sit side by side; a group drawn twice is two runs."""
    reward = np.asarray(reward, np.float64)
    out = np.zeros_like(reward)
    starts = np.flatnonzero(np.r_[True, group[1:] != group[:-1]]) if len(group) else np.zeros(0, np.int64)
    for a, b in zip(starts, np.r_[starts[1:], len(group)]):
        r = reward[a:b]
        out[a:b] = (r - r.mean()) / (r.std() + 1e-4)
    return out.astype(np.float32)


def greedy_reward(policy, prompts_) -> float:
    seqs, _ = generate(policy, prompts_, greedy=True)
    seqs = seqs.numpy()
    return float(rewards(seqs[:, :LENGTH], seqs[:, PROMPT:]).mean())


def trainer_main(cfg: Config, address: str, seed: int, parent: int) -> None:
    """The trainer's loop, until the supervisor stops it with SIGTERM. A restarted trainer
    continues from the newest published parameters and version."""
    child_setup(parent)
    import torch
    torch.manual_seed(seed)
    device = torch.device(cfg.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cpu":
        torch.set_num_threads(1)
    policy = make_policy(cfg.width, cfg.layers).to(device)
    client = connect(address)
    version = 0
    try:
        s = client.sample("params", 1, timeout=0)
        from .model import load_flat_parameters
        load_flat_parameters(policy, s.data["weights"][0, 0])
        version = int(s.data["version"][0, 0])
    except rp.errors.Timeout:
        pass
    optimizer = torch.optim.Adam(policy.parameters(), lr=cfg.lr)
    params = client.writer("params", max_sequence_length=1)
    reports = client.writer("metrics", max_sequence_length=1)
    evals = client.writer("evals", max_sequence_length=1)
    probe = eval_prompts()

    def publish():
        params.append({"weights": flat_parameters(policy), "version": version})
        params.create_item("params", 1, 1.0)
        params.flush()

    def evaluate(step):
        policy.eval()
        g = greedy_reward(policy.cpu() if device.type != "cpu" else policy, probe)
        policy.to(device).train()
        evals.append({"step": step, "greedy_reward": g})
        evals.create_item("evals", 1, 1.0)
        evals.flush()

    publish()
    step = version
    evaluate(step)
    next_eval = time.monotonic() + cfg.eval_every
    while True:
        # A token draw takes what is there: wait until a whole budget's worth is, so every
        # step trains on a full batch (the budget holds tokens // SEQUENCE sequences here).
        if client.info()["rollouts"]["size"] * SEQUENCE < cfg.tokens:
            time.sleep(0.002)
            continue
        try:
            s = client.sample("rollouts", tokens=cfg.tokens, timeout=1.0)
        except rp.errors.Timeout:
            continue
        s.attributes["advantage"] = group_advantages(s.attributes["reward"], s.attributes["group"])
        total = s.num_steps
        optimizer.zero_grad(set_to_none=True)
        for part in s.split(cfg.micro_batches, groups=True):
            if len(part) == 0:
                continue
            p = part.packed()
            n = len(part)
            seqs = torch.as_tensor(p.data["token"].reshape(n, SEQUENCE), dtype=torch.int64, device=device)
            old = torch.as_tensor(p.data["logprob"].reshape(n, SEQUENCE)[:, PROMPT:], device=device)
            adv = torch.as_tensor(part.attributes["advantage"], device=device)[:, None]
            ratio = (answer_logprobs(policy, seqs) - old).exp()
            clipped = ratio.clamp(1.0 - cfg.clip, 1.0 + cfg.clip)
            loss = -torch.min(ratio * adv, clipped * adv).mean() * (p.total_steps / total)
            loss.backward()
        optimizer.step()
        step += 1
        behind = float(np.mean(version - s.attributes["version"]))
        version += 1
        client.set_version("rollouts", version)   # items below version - max_staleness leave now
        publish()
        reports.append({"step": step, "version": version, "reward": float(np.mean(s.attributes["reward"])),
                        "tokens": total, "items": len(s), "staleness": behind})
        reports.create_item("metrics", 1, 1.0)
        reports.flush()
        if time.monotonic() >= next_eval:
            evaluate(step)
            next_eval = time.monotonic() + cfg.eval_every
