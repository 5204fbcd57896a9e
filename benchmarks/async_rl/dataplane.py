"""The store between rollout workers and a trainer (issue 35, section 3): Reprise against the
data planes LLM-RL teams use today, in one run on this machine.

    python -m benchmarks.async_rl.dataplane                       # K = 1, 2, 4, 8; ~15 minutes
    python -m benchmarks.async_rl.dataplane --quick               # K = 1, 2; a smoke test
    python -m benchmarks.async_rl.dataplane --systems reprise,redis --producers 4

Workload: K rollout processes each write groups of 8 sequences of 256-8,192 tokens
(log-uniform; int32 token, float32 logprob, bool mask a token; version, reward, group and a
commit timestamp per sequence) as fast as they can, cycling through groups made before the
clock. One trainer (this process) draws batches of whole groups of at least 32,768 tokens
(Reprise: token draws of at most 65,536 in all; the peers pop groups until the batch holds
32,768), oldest first, each once, under a staleness bound of 1, and moves the policy version every 4 batches (the
producers tag what they write with the newest version they have seen). Per system and K:
trainer tokens/s, batch latency p50/p99 (one draw), lag p50 (commit to draw) and the items
drawn past the bound.

Systems, each as its users set it up:
- ``reprise``: ``rp.Server`` over a table with ``attributes``, ``max_staleness=1``,
  ``group_size=8`` (Fifo, consume-once); producers write through ``rp.Client`` writers on the
  local path; the trainer draws ``client.sample(tokens=65_536)`` and calls ``set_version``.
- ``redis``: a Redis list of pickled groups (the common hand-rolled baseline): producers
  ``RPUSH``; the trainer ``LPOP``s groups until the budget is full and drops the stale ones
  itself (they count as drawn past the bound: they crossed the wire and were read).
- ``ray``: a Ray actor holding a queue of ``ray.put`` references (verl's fully-async
  ``MessageQueue`` pattern): producers ``ray.put`` each group and push its reference; the
  trainer pops references until the budget is full, ``ray.get``s them, drops the stale ones.
- ``torchrl``: TorchRL 0.14's ``RayReplayBuffer`` over ``LazyStackStorage`` (the storage its
  ``grpo-async.py`` uses for ragged token data) with ``ConsumingSampler`` (each item drawn
  once): an item is one group, a lazy stack of its 8 sequences' TensorDicts (token, logprob,
  mask; ``policy_version``, reward, group, commit time); producers ``add`` through
  ``rb.client()``; the trainer ``sample(1)``s groups until the budget is full and drops the
  stale ones. ``StalenessAwareSampler`` would gate by version but draws with replacement,
  and ``PromptGroupSampler`` draws whole groups but never consumes: neither composes with
  drawing each group once, so the trainer filters as with the other peers. The in-process
  ``ReplayBuffer`` (no Ray) is compared in ``benchmarks.async_rl.compare``.

Each cell runs ``--repeats`` times (systems in a rotated order each time); the run with the
median tokens/s is reported.

Writes ``benchmarks/out/dataplane-<date>.json`` and ``.md`` (``--out-dir`` elsewhere).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import pickle
import platform
import subprocess
import tempfile
import time

import numpy as np

G = 8
BUDGET = 65_536
FILL = BUDGET // 2   # a batch is done once it holds this many tokens (a group averages ~23k)
BOUND = 1
VERSION_EVERY = 4


def make_groups(seed: int, n: int) -> list[dict]:
    """``n`` groups: ``{"lengths", "token", "logprob", "mask", "reward"}`` (8 sequences end to end)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        lengths = np.exp(rng.uniform(np.log(256), np.log(8192), G)).astype(np.int64)
        total = int(lengths.sum())
        out.append({"lengths": lengths, "token": rng.integers(0, 50_000, total, dtype=np.int32),
                    "logprob": rng.normal(size=total).astype(np.float32), "mask": np.ones(total, bool),
                    "reward": rng.random(G).astype(np.float32)})
    return out


# ----------------------------------------------------------------------------- producers

def _version_file(path: str) -> int:
    try:
        with open(path) as f:
            return int(f.read() or 0)
    except (OSError, ValueError):
        return 0


def reprise_producer(address: str, pid: int, vfile: str, stop, seed: int):
    import reprise as rp
    groups = make_groups(seed, 8)
    with rp.Client(address) as c, c.writer("rollouts") as w:
        k = 0
        while not stop.is_set():
            g = groups[k % len(groups)]
            version, gid = _version_file(vfile), (pid << 32) | k
            at = 0
            for i, n in enumerate(g["lengths"]):
                n = int(n)
                w.extend({"token": g["token"][at:at + n], "logprob": g["logprob"][at:at + n],
                          "mask": g["mask"][at:at + n]})
                w.create_item("rollouts", n, 1.0, attributes={"version": version, "reward": float(g["reward"][i]),
                                                             "group": gid, "committed": time.time()})
                w.end_episode()
                at += n
            w.flush()
            k += 1


def redis_producer(port: int, pid: int, vfile: str, stop, seed: int):
    import redis
    r = redis.Redis(port=port)
    groups = make_groups(seed, 8)
    k = 0
    while not stop.is_set():
        g = dict(groups[k % len(groups)], version=_version_file(vfile), group=(pid << 32) | k, committed=time.time())
        r.rpush("rollouts", pickle.dumps(g, protocol=5))
        k += 1
        if k % 16 == 0 and r.llen("rollouts") > 4096:  # bounded, as a real buffer would be
            time.sleep(0.01)


def ray_producer(queue_name: str, pid: int, vfile: str, stop, seed: int, address: str):
    import ray
    ray.init(address=address, namespace="reprise-dataplane", log_to_driver=False, configure_logging=False)
    q = ray.get_actor(queue_name)
    groups = make_groups(seed, 8)
    k = 0
    while not stop.is_set():
        g = dict(groups[k % len(groups)], version=_version_file(vfile), group=(pid << 32) | k, committed=time.time())
        ray.get(q.push.remote([ray.put(g)]))
        k += 1


def torchrl_producer(client_bytes: bytes, pid: int, vfile: str, stop, seed: int, address: str):
    import ray
    import torch
    from tensordict import TensorDict, lazy_stack
    ray.init(address=address, namespace="reprise-dataplane", log_to_driver=False, configure_logging=False)
    client = pickle.loads(client_bytes)   # RayReplayBuffer.client(): picklable, no lifecycle rights
    groups = make_groups(seed, 8)
    k = 0
    while not stop.is_set():
        g, version, gid = groups[k % len(groups)], _version_file(vfile), (pid << 32) | k
        committed, at, items = time.time(), 0, []
        for i, n in enumerate(g["lengths"]):
            n = int(n)
            items.append(TensorDict({"token": torch.from_numpy(g["token"][at:at + n]),
                                     "logprob": torch.from_numpy(g["logprob"][at:at + n]),
                                     "mask": torch.from_numpy(g["mask"][at:at + n]),
                                     "policy_version": torch.tensor(version), "reward": torch.tensor(float(g["reward"][i])),
                                     "group": torch.tensor(gid), "committed": torch.tensor(committed, dtype=torch.float64)},
                                    batch_size=[]))
            at += n
        client.add(lazy_stack(items))   # one item: the group's 8 sequences, ragged
        k += 1


class _RefQueue:
    """verl-style message queue: an actor with a deque of object references."""

    def __init__(self):
        import collections
        self.q = collections.deque()

    def push(self, refs):
        self.q.extend(refs)
        while len(self.q) > 4096:  # bounded
            self.q.popleft()

    def pop(self, n):
        return [self.q.popleft() for _ in range(min(n, len(self.q)))]


# ------------------------------------------------------------------------------- trainers

def run_reprise(k: int, seconds: float, seed: int) -> dict:
    import reprise as rp
    store = rp.Store({"token": rp.Field((), "int32"), "logprob": rp.Field((), "float32"),
                      "mask": rp.Field((), "bool")}, capacity=1 << 25, block_steps=4096)
    table = rp.Table("rollouts", store, sampler=rp.selectors.Fifo(), remover=rp.selectors.Fifo(),
                     max_size=20_000, max_times_sampled=1, max_staleness=BOUND, group_size=G,
                     attributes={"version": "int64", "reward": "float32", "group": "int64", "committed": "float64"})
    with rp.Server([table]) as server, rp.Client(server.local_address) as client:
        def draw():
            # As the peers' trainers: whole groups until the batch holds at least FILL tokens.
            tokens, versions, committed = 0, [], []
            while tokens < FILL:
                try:
                    s = client.sample("rollouts", tokens=BUDGET - tokens, timeout=5.0)
                except rp.errors.InvalidArgument:  # the next group does not fit what is left
                    break
                tokens += s.num_steps
                versions.append(s.attributes["version"])
                committed.append(s.attributes["committed"])
            return tokens, np.concatenate(versions), np.concatenate(committed)

        def move(v):
            client.set_version("rollouts", v)
        out = _drive(k, seconds, seed, draw, move,
                     lambda vfile, stop, i: (reprise_producer, (server.local_address, i, vfile, stop, seed + i)))
    store.close()
    return out


def run_redis(k: int, seconds: float, seed: int) -> dict:
    import redis
    port = _free_port()
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--save", "", "--appendonly", "no"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        r = redis.Redis(port=port)
        for _ in range(100):
            try:
                r.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.05)
        state = {"version": 0}

        def pop():
            raw = r.lpop("rollouts")
            if raw is None:
                return []
            g = pickle.loads(raw)
            return [(g["version"], g["committed"], int(g["lengths"].sum()))]

        def draw():
            return _whole_groups(pop, state["version"])

        def move(v):
            state["version"] = v
        return _drive(k, seconds, seed, draw, move,
                      lambda vfile, stop, i: (redis_producer, (port, i, vfile, stop, seed + i)))
    finally:
        proc.terminate()
        proc.wait()


def run_ray(k: int, seconds: float, seed: int) -> dict:
    import ray
    ray.init(num_cpus=max(2, k), namespace="reprise-dataplane", include_dashboard=False, log_to_driver=False,
             configure_logging=False)
    try:
        name = f"dataplane-queue-{os.getpid()}"
        q = ray.remote(_RefQueue).options(name=name, num_cpus=0).remote()
        address = ray.get_runtime_context().gcs_address
        state = {"version": 0}

        def pop():
            refs = ray.get(q.pop.remote(8))
            return [(g["version"], g["committed"], int(g["lengths"].sum())) for g in ray.get(refs)] if refs else []

        def draw():
            return _whole_groups(pop, state["version"])

        def move(v):
            state["version"] = v
        return _drive(k, seconds, seed, draw, move,
                      lambda vfile, stop, i: (ray_producer, (name, i, vfile, stop, seed + i, address)))
    finally:
        ray.shutdown()


def run_torchrl(k: int, seconds: float, seed: int) -> dict:
    import ray
    import torch
    from functools import partial
    from torchrl.data import LazyStackStorage
    from torchrl.data.replay_buffers.ray_buffer import RayReplayBuffer
    from torchrl.data.replay_buffers.samplers import ConsumingSampler
    torch.set_num_threads(1)
    ray.init(num_cpus=max(2, k), namespace="reprise-dataplane", include_dashboard=False, log_to_driver=False,
             configure_logging=False)
    try:
        # One item per group (a lazy stack of its 8 ragged sequences), each drawn once.
        rb = RayReplayBuffer(storage=partial(LazyStackStorage, 4096), sampler=ConsumingSampler, batch_size=1,
                             remote_config={"num_cpus": 0})
        client_bytes = pickle.dumps(rb.client())
        address = ray.get_runtime_context().gcs_address
        state = {"version": 0}

        def pop():
            try:
                batch = rb.sample(1)
            except RuntimeError:   # nothing left to consume
                return []
            return [(int(g.get("policy_version")[0]), float(g.get("committed")[0]),
                     sum(t.numel() for t in g.get("token", as_list=True))) for g in batch.unbind(0)]

        def draw():
            return _whole_groups(pop, state["version"])

        def move(v):
            state["version"] = v
        try:
            return _drive(k, seconds, seed, draw, move,
                          lambda vfile, stop, i: (torchrl_producer, (client_bytes, i, vfile, stop, seed + i, address)))
        finally:
            rb.close()
    finally:
        ray.shutdown()


def _whole_groups(pop, version: int):
    """A peer trainer's batch: groups from ``pop()`` (``[(version, commit time, tokens)]``,
    empty when nothing waits) until it holds ``FILL`` fresh tokens or 5 s pass; groups past
    the staleness bound are read and dropped (they count as drawn past it). Returns
    ``(fresh tokens, each item's version, each item's commit time)``."""
    tokens, versions, committed = 0, [], []
    deadline = time.monotonic() + 5.0
    while tokens < FILL and time.monotonic() < deadline:
        groups = pop()
        if not groups:
            time.sleep(0.001)
            continue
        for v, when, n in groups:
            versions.extend([v] * G)
            committed.extend([when] * G)
            if v >= version - BOUND:
                tokens += n
    return tokens, np.array(versions), np.array(committed)


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _drive(k, seconds, seed, draw, move, producer) -> dict:
    """Starts k producers, draws batches for ``seconds`` (after a 1 s warm-up), moves the
    version every ``VERSION_EVERY`` batches; returns the figures."""
    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    with tempfile.NamedTemporaryFile("w", delete=False, suffix=".version") as f:
        f.write("0")
        vfile = f.name
    procs = []
    for i in range(k):
        target, args = producer(vfile, stop, i)
        p = ctx.Process(target=target, args=args, daemon=True)
        p.start()
        procs.append(p)
    try:
        version, batches = 0, 0
        latencies, lags, tokens, stale, items, timeouts = [], [], 0, 0, 0, 0
        warm = time.monotonic() + 3.0
        start = end = None
        while True:
            now = time.monotonic()
            if start is None and now >= warm:
                start, end = now, now + seconds
            if end is not None and now >= end:
                break
            t0 = time.perf_counter()
            try:
                n, versions, committed = draw()
            except Exception as e:  # a timed-out draw: nothing arrived
                if "Timeout" not in type(e).__name__:
                    raise
                timeouts += start is not None
                continue
            t1 = time.perf_counter()
            batches += 1
            if start is not None:
                latencies.append(t1 - t0)
                tokens += n
                stale += int((np.asarray(versions) < version - BOUND).sum())
                items += len(versions)
                lags.extend((time.time() - np.asarray(committed)).tolist())
            if batches % VERSION_EVERY == 0:
                version += 1
                move(version)
                with open(vfile, "w") as f:
                    f.write(str(version))
        elapsed = time.monotonic() - start if start is not None else float("nan")
    finally:
        stop.set()
        for p in procs:
            p.join(5)
            if p.is_alive():
                p.kill()
        os.unlink(vfile)
    lat = np.array(latencies) if latencies else np.array([float("nan")])
    return {"producers": k, "seconds": elapsed, "batches": len(latencies), "tokens_per_s": tokens / elapsed,
            "batch_p50_ms": float(np.percentile(lat, 50) * 1e3), "batch_p99_ms": float(np.percentile(lat, 99) * 1e3),
            "lag_p50_ms": float(np.median(lags) * 1e3) if lags else float("nan"), "items_drawn": items,
            "drawn_past_bound": stale, "timed_out_draws": timeouts}


def _median_run(rs: list[dict]) -> dict:
    """The run with the median tokens/s (the lower middle of an even count), with every
    run's tokens/s beside it."""
    done = [r for r in rs if "skipped" not in r]
    if not done:
        return rs[0]
    done.sort(key=lambda r: r["tokens_per_s"])
    return dict(done[(len(done) - 1) // 2], tokens_per_s_runs=[r["tokens_per_s"] for r in rs if "skipped" not in r])


SYSTEMS = {"reprise": run_reprise, "redis": run_redis, "ray": run_ray, "torchrl": run_torchrl}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--systems", default="reprise,redis,ray,torchrl")
    ap.add_argument("--producers", default="1,2,4,8")
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out-dir", default=os.path.join("benchmarks", "out"))
    args = ap.parse_args(argv)
    if args.quick:
        args.producers, args.seconds, args.repeats = "1,2", 3.0, 1
    systems = [s for s in args.systems.split(",") if s]
    ks = [int(k) for k in args.producers.split(",")]
    runs: dict[str, dict[str, list]] = {}
    for k in ks:
        for rep in range(args.repeats):
            for name in systems[rep % len(systems):] + systems[:rep % len(systems)]:
                try:
                    r = SYSTEMS[name](k, args.seconds, seed=k)
                except ImportError as e:
                    r = {"skipped": f"{type(e).__name__}: {e}"}
                runs.setdefault(name, {}).setdefault(str(k), []).append(r)
                print(f"{name:8s} K={k}: " + (r.get("skipped") or
                      f"{r['tokens_per_s'] / 1e6:6.1f}M tokens/s, batch p50 {r['batch_p50_ms']:.1f} ms p99 "
                      f"{r['batch_p99_ms']:.1f} ms, lag p50 {r['lag_p50_ms']:.0f} ms, past bound "
                      f"{r['drawn_past_bound']} of {r['items_drawn']}"), flush=True)
    results = {name: {k: _median_run(rs) for k, rs in per_k.items()} for name, per_k in runs.items()}
    stamp = time.strftime("%Y%m%d-%H%M%S")
    report = {"config": {**vars(args), "group": G, "budget": BUDGET, "bound": BOUND, "version_every": VERSION_EVERY},
              "machine": {"platform": platform.platform(), "cpus": os.cpu_count()}, "results": results, "runs": runs}
    lines = ["| K | " + " | ".join(f"{s} tokens/s (p50 / p99 ms, lag ms, past bound)" for s in systems) + " |",
             "|---|" + "---|" * len(systems)]
    for k in ks:
        cells = []
        for s in systems:
            r = results[s][str(k)]
            cells.append(r.get("skipped", "") or f"{r['tokens_per_s'] / 1e6:.1f}M ({r['batch_p50_ms']:.1f} / "
                         f"{r['batch_p99_ms']:.1f}, {r['lag_p50_ms']:.0f}, {r['drawn_past_bound']})")
        lines.append(f"| {k} | " + " | ".join(cells) + " |")
    os.makedirs(args.out_dir, exist_ok=True)
    base = os.path.join(args.out_dir, f"dataplane-{stamp}{'-quick' if args.quick else ''}")
    with open(base + ".json", "w") as f:
        json.dump(report, f, indent=1)
    with open(base + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"wrote {base}.json and .md")
    return report


if __name__ == "__main__":
    main()
