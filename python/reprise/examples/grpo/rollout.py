"""A rollout worker process: with the newest published policy, it samples prompts,
generates ``group_size`` completions for each, scores them with the task's checker and
writes each group through its client, a sequence an item, tagged with the policy version
that produced it (each token's, and the item's oldest as the ``version`` attribute), its
reward and its group.

With ``--partial-rollouts`` a worker that sees a new version in the middle of a generation
stops it there: the unfinished sequences go into the ``partials`` queue table with their
tokens, log-probabilities and per-token versions so far, and any worker (itself, at its next
round) takes them and finishes them with its newer policy (verl's and AReaL's partial
rollouts). Their groups wait, pending, until the finished members arrive."""

from __future__ import annotations

import time

import numpy as np

import reprise as rp

from ..stopping import child_setup
from ..children import connect
from .config import Config
from .model import extend, load_flat_parameters, make_policy
from .task import LENGTH, PROMPT, SEP, SEQUENCE, prompts, rewards


def fetch(client, policy, have: int) -> int:
    """Loads the newest parameters when their version is above ``have``; returns the
    version the policy now has (``have`` when none newer was published)."""
    s = client.sample("params", 1, timeout=30.0)
    version = int(s.data["version"][0, 0])
    if version > have:
        load_flat_parameters(policy, s.data["weights"][0, 0])
    return max(version, have)


def write(w, seqs, logps, versions, groups, slow: float = 0.0, group_size: int = 0) -> None:
    """Writes finished sequences (``[n, SEQUENCE]`` tokens, log-probabilities and
    per-token versions of their answers) as items of ``rollouts``, each with its oldest
    answer token's version, its reward and its group. ``slow``: before each group's last
    member, wait that long (the test's straggler)."""
    r = rewards(seqs[:, :LENGTH], seqs[:, PROMPT:])
    mask = np.zeros(SEQUENCE, bool)
    mask[PROMPT:] = True
    for i in range(len(seqs)):
        if slow > 0 and group_size and i % group_size == group_size - 1:
            w.flush()
            time.sleep(slow)
        logprob = np.zeros(SEQUENCE, np.float32)
        logprob[PROMPT:] = logps[i]
        version = np.full(SEQUENCE, versions[i].min(), np.int64)
        version[PROMPT:] = versions[i]
        w.extend({"token": seqs[i].astype(np.int32), "logprob": logprob, "mask": mask, "version": version})
        w.create_item("rollouts", SEQUENCE, 1.0, attributes={"version": int(versions[i].min()), "reward": float(r[i]),
                                                             "group": int(groups[i])})
        w.end_episode()
    w.flush()


def park(pw, x, logps, versions, groups) -> None:
    """Puts unfinished sequences (``x`` ``[n, t]`` with ``t - PROMPT`` answer digits) into
    the ``partials`` queue, with their answers' log-probabilities and versions so far."""
    t = x.shape[1]
    for i in range(len(x)):
        logprob = np.zeros(t, np.float32)
        logprob[PROMPT:] = logps[i]
        version = np.full(t, versions[i].min() if versions.shape[1] else 0, np.int64)
        version[PROMPT:] = versions[i]
        pw.extend({"token": x[i].astype(np.int32), "logprob": logprob, "version": version})
        pw.create_item("partials", t, 1.0, attributes={"group": int(groups[i])})
        pw.end_episode()
    pw.flush()


def take_partials(client, limit: int):
    """Up to ``limit`` unfinished sequences from the ``partials`` queue (None when empty)."""
    n = min(limit, client.info()["partials"]["size"])
    if n == 0:
        return None
    try:
        return client.sample("partials", n, timeout=0.05)
    except rp.errors.Timeout as e:  # another worker took some first: what was drawn is ours
        part = getattr(e, "partial", None)
        return part if part is not None and len(part) else None


def resume(client, w, policy, version: int, gen, limit: int) -> None:
    """Finishes unfinished sequences from ``partials`` with ``policy`` (``version``) and
    writes them, grouped by how far they got."""
    import torch
    s = take_partials(client, limit)
    if s is None:
        return
    lengths = np.asarray(s.lengths)
    for t in np.unique(lengths):
        rows = np.nonzero(lengths == t)[0]
        x = torch.as_tensor(s.data["token"][rows, :t].astype(np.int64))
        done = int(t) - PROMPT
        seqs, new = extend(policy, x, LENGTH - done, generator=gen)
        logps = np.concatenate([s.data["logprob"][rows, PROMPT:t], new.numpy()], axis=1)
        versions = np.concatenate([s.data["version"][rows, PROMPT:t],
                                   np.full((len(rows), LENGTH - done), version, np.int64)], axis=1)
        write(w, seqs.numpy(), logps, versions, np.asarray(s.attributes["group"])[rows])


def rollout_main(cfg: Config, worker: int, address: str, seed: int, parent: int) -> None:
    """The worker's loop, until the supervisor stops it with SIGTERM."""
    child_setup(parent)
    import torch
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    gen = torch.Generator().manual_seed(seed)
    policy = make_policy(cfg.width, cfg.layers).eval()
    client = connect(address)
    version = fetch(client, policy, -1)
    G = cfg.group_size
    n = cfg.prompts_per_round * G
    next_group = (worker << 40) | ((seed & 0xFF) << 32)   # ids unique across workers and restarts
    slow = cfg.slow_worker if worker == 0 else 0.0
    pw = client.writer("partials") if cfg.partial_rollouts else None
    with client.writer("rollouts") as w:
        while True:
            version = fetch(client, policy, version)
            if pw is not None:
                resume(client, w, policy, version, gen, n)
            groups = next_group + 1 + np.arange(n) // G
            next_group += cfg.prompts_per_round
            p = torch.as_tensor(np.repeat(prompts(cfg.prompts_per_round, rng), G, axis=0))
            x = torch.cat([p, torch.full((n, 1), SEP, dtype=torch.int64)], dim=1)
            logps = np.zeros((n, 0), np.float32)
            for k in range(LENGTH):
                x, lp = extend(policy, x, 1, generator=gen)
                logps = np.concatenate([logps, lp.numpy()], axis=1)
                if pw is not None and k < LENGTH - 1 and client.info()["rollouts"]["version"] > version:
                    break  # a new policy: park the round, resume it with that policy
            versions = np.full(logps.shape, version, np.int64)
            if logps.shape[1] < LENGTH:
                park(pw, x.numpy(), logps, versions, groups)
                continue
            write(w, x.numpy(), logps, versions, groups, slow, G)
