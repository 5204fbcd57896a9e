"""A rollout worker process: with the newest published policy, it samples prompts,
generates ``group_size`` completions for each, scores them with the task's checker and
writes each group through its client, a sequence an item, tagged with the policy version
that produced it, its reward and its group."""

from __future__ import annotations

import time

import numpy as np

import reprise as rp

from ..stopping import child_setup
from .config import Config
from .model import generate, load_flat_parameters, make_policy
from .task import LENGTH, PROMPT, SEQUENCE, prompts, rewards


def fetch(client, policy, have: int) -> int:
    """Loads the newest parameters when their version is above ``have``; returns the
    version the policy now has (``have`` when none newer was published)."""
    s = client.sample("params", 1, timeout=30.0)
    version = int(s.data["version"][0, 0])
    if version > have:
        load_flat_parameters(policy, s.data["weights"][0, 0])
    return max(version, have)


def rollout_main(cfg: Config, worker: int, address: str, seed: int, parent: int) -> None:
    """The worker's loop, until the supervisor stops it with SIGTERM."""
    child_setup(parent)
    import torch
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    gen = torch.Generator().manual_seed(seed)
    policy = make_policy(cfg.width, cfg.layers).eval()
    client = rp.Client(address)
    version = fetch(client, policy, -1)
    G = cfg.group_size
    group = (worker << 40) | ((seed & 0xFF) << 32)   # ids unique across workers and restarts
    with client.writer("rollouts") as w:
        while True:
            version = fetch(client, policy, version)
            p = np.repeat(prompts(cfg.prompts_per_round, rng), G, axis=0)
            seqs, logps = generate(policy, p, generator=gen)
            seqs, logps = seqs.numpy(), logps.numpy()
            r = rewards(seqs[:, :LENGTH], seqs[:, PROMPT:])
            logprob = np.zeros((len(seqs), SEQUENCE), np.float32)
            logprob[:, PROMPT:] = logps
            mask = np.zeros(SEQUENCE, bool)
            mask[PROMPT:] = True
            for i in range(len(seqs)):
                member = i % G
                if member == 0:
                    group += 1
                if member == G - 1 and cfg.slow_worker > 0 and worker == 0:
                    w.flush()
                    time.sleep(cfg.slow_worker)  # the straggler: its group's last member comes late
                w.extend({"token": seqs[i].astype(np.int32), "logprob": logprob[i], "mask": mask})
                w.create_item("rollouts", SEQUENCE, 1.0,
                              attributes={"version": version, "reward": float(r[i]), "group": group})
                w.end_episode()
            w.flush()
