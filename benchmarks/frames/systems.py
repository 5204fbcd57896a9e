"""One system's side of the frame benchmark: ``python -m benchmarks.frames.systems SYSTEM
FRAMES.npz N`` fills a buffer of N 3-step transitions (4x84x84 stacks, next observations)
from the frames file, then reports one JSON line: ``bytes`` (what the storage holds: its
arrays, tensors, frames or file pages), ``rss_bytes`` (the process's resident growth over
the fill, a cross-check), ``fill_s``, and ``sample_us`` (median of 256-transition uniform
samples with obs and next_obs materialized).

Systems: ``reprise-raw`` (TransitionBuffer, one stack per step), ``reprise-stack``
(frame_stack=4: one frame per step), ``reprise-zstd`` (frame_stack=4 and zstd),
``reprise-field`` and ``reprise-field-zstd`` (a table of n-step items over a store whose
``obs`` is ``Field((84, 84), stack=4)``, raw or zstd: the Ape-X replay's layout),
``cpprb`` and ``cpprb-nstep`` (see ``cpprb``; run in its venv),
``torchrl-lazy`` (LazyTensorStorage of obs and next_obs stacks) and ``torchrl-zstd``
(CompressedListStorage of the same)."""

from __future__ import annotations

import gc
import json
import statistics
import sys
import time

import numpy as np

from benchmarks.frames.frames import STACK, transitions

N_STEP, GAMMA, BATCH, SAMPLES = 3, 0.99, 256, 40


def rss() -> int:
    gc.collect()
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def reprise(kind: str, path: str, n: int) -> dict:
    import reprise as rp
    stack = kind != "reprise-raw"
    compress = "zstd" if kind == "reprise-zstd" else None
    buf = rp.TransitionBuffer(n, (STACK, 84, 84), "uint8", n_step=N_STEP, gamma=GAMMA, seed=0,
                              frame_stack=STACK if stack else 1, compress=compress)
    t0 = time.perf_counter()
    for obs, a, r, nxt, term, trunc, _ in transitions(path, n + 64):
        buf.add(obs, a, r, nxt, term, trunc)
    fill = time.perf_counter() - t0
    memory = buf._store.memory()

    def sample():
        b = buf.sample(BATCH)
        return b.obs, b.next_obs
    return dict(bytes=memory["stored_bytes"], fill_s=fill, sample=sample, size=len(buf),
                versions={"reprise": rp.__version__}, close=buf._store.close)


def reprise_field(kind: str, path: str, n: int) -> dict:
    """n-step items over steps that store one frame each (``Field(stack=4)``), written as the
    Ape-X actor writes them (``NStepTransitions``): a transition's obs and next obs are its
    item's first and last steps, stacked from the same frames."""
    import reprise as rp
    from reprise.examples.apex.nstep import NStepTransitions
    compress = "zstd" if kind == "reprise-field-zstd" else None
    block = 64
    store = rp.Store({"obs": rp.Field((84, 84), "uint8", stack=STACK, compress=compress),
                      "action": rp.Field((), "int64"), "reward": rp.Field((), "float32"),
                      "terminal": rp.Field((), "bool")},
                     capacity=(n + 1) * block // (block - STACK + 1) + n // 50 + 4 * block, block_steps=block)
    table = rp.Table("t", store, sampler=rp.selectors.Uniform(), remover=rp.selectors.Fifo(), max_size=n, seed=0)
    w = store.writer(max_sequence_length=N_STEP + 1)
    stream = NStepTransitions(w, "t", N_STEP, GAMMA, newest_frame=True)
    q = np.zeros(32, np.float32)
    t0 = time.perf_counter()
    for obs, a, r, nxt, term, trunc, end in transitions(path, n + 64):
        stream.step(obs, q, int(a), float(r))
        if end:
            stream.end(nxt, q, terminated=bool(term))
    fill = time.perf_counter() - t0
    memory = store.memory()
    rows = np.arange(BATCH)

    def sample():
        s = table.sample(BATCH)
        obs = s.data["obs"]
        return obs[:, 0], obs[rows, s.lengths - 1]
    return dict(bytes=memory["stored_bytes"], fill_s=fill, sample=sample, size=len(table),
                versions={"reprise": rp.__version__}, close=store.close)


def cpprb(kind: str, path: str, n: int) -> dict:
    """``cpprb``: ``next_of`` + ``stack_compress``, each frame once, but 1-step transitions:
    with ``Nstep`` too its samples carry no next observations (cpprb 11: ``next_of`` and
    ``Nstep`` do not combine). ``cpprb-nstep``: 3-step, next stacks stored beside the
    observations, both ``stack_compress``ed."""
    import cpprb as c
    env = {"obs": {"shape": (STACK, 84, 84), "dtype": np.uint8}, "act": {"dtype": np.int64}, "rew": {}, "done": {}}
    if kind == "cpprb":
        rb = c.ReplayBuffer(n, env, next_of="obs", stack_compress="obs")
    else:
        env["next_obs"] = {"shape": (STACK, 84, 84), "dtype": np.uint8}
        rb = c.ReplayBuffer(n, env, stack_compress=["obs", "next_obs"],
                            Nstep={"size": N_STEP, "gamma": GAMMA, "rew": "rew", "next": "next_obs"})
    t0 = time.perf_counter()
    for obs, a, r, nxt, term, trunc, end in transitions(path, n + 64):
        rb.add(obs=obs, act=a, rew=r, next_obs=nxt, done=float(term))
        if end:
            rb.on_episode_end()
    fill = time.perf_counter() - t0

    def sample():
        s = rb.sample(BATCH)
        return s["obs"], s["next_obs"]
    return dict(bytes=None, fill_s=fill, sample=sample, size=rb.get_stored_size(),
                versions={"cpprb": __import__("importlib.metadata").metadata.version("cpprb")}, close=rb.clear)


def torchrl(kind: str, path: str, n: int) -> dict:
    import tensordict
    import torch
    import torchrl
    from torchrl.data import CompressedListStorage, LazyTensorStorage, ReplayBuffer
    storage = CompressedListStorage(n, compression_level=3) if kind == "torchrl-zstd" else LazyTensorStorage(n)
    rb = ReplayBuffer(storage=storage, batch_size=BATCH)
    chunk, rows = 256, []

    def flush():
        if rows:
            obs, a, r, nxt, term = (np.stack(x) for x in zip(*rows))
            rb.extend(tensordict.TensorDict({"obs": torch.from_numpy(obs), "action": torch.from_numpy(a),
                                             "reward": torch.from_numpy(r.astype(np.float32)),
                                             "next_obs": torch.from_numpy(nxt), "done": torch.from_numpy(term)},
                                            batch_size=[len(rows)]))
            rows.clear()
    t0 = time.perf_counter()
    for obs, a, r, nxt, term, _, _ in transitions(path, n):
        # the 3-step target is precomputed as TorchRL's MultiStep would: the same bytes per item
        rows.append((obs, a, r, nxt, term))
        if len(rows) == chunk:
            flush()
    flush()
    fill = time.perf_counter() - t0
    if kind == "torchrl-zstd":
        held = sum(v.numel() * v.element_size() for item in storage._storage for v in item.values()
                   if isinstance(v, torch.Tensor))
    else:
        held = storage._storage.bytes()

    def sample():
        s = rb.sample()
        return s["obs"], s["next_obs"]
    return dict(bytes=int(held), fill_s=fill, sample=sample, size=len(rb),
                versions={"torchrl": torchrl.__version__, "torch": torch.__version__}, close=lambda: None)


def main(argv=None) -> int:
    system, path, n = (argv or sys.argv[1:])[:3]
    n = int(n)
    before = rss()
    if system.startswith("reprise-field"):
        r = reprise_field(system, path, n)
    elif system.startswith("reprise"):
        r = reprise(system, path, n)
    elif system.startswith("cpprb"):
        r = cpprb(system, path, n)
    else:
        r = torchrl(system, path, n)
    grown = rss() - before
    for _ in range(3):
        r["sample"]()
    times = []
    for _ in range(SAMPLES):
        t0 = time.perf_counter()
        obs, nxt = r["sample"]()
        times.append(time.perf_counter() - t0)
    assert tuple(obs.shape) == (BATCH, STACK, 84, 84) and tuple(nxt.shape) == (BATCH, STACK, 84, 84), obs.shape
    out = dict(system=system, n=n, size=int(r["size"]), bytes=r["bytes"] if r["bytes"] is not None else grown,
               bytes_from="storage" if r["bytes"] is not None else "rss", rss_bytes=grown, fill_s=r["fill_s"],
               sample_us=statistics.median(times) * 1e6, versions=r["versions"])
    r["close"]()
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
