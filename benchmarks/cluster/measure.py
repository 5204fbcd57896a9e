"""The ranks' side of the cluster benchmark: what every rank runs, in the same order
(every call below is a collective), inside one spawned gloo job (``reprise.distributed.local_ranks``).

``rank_main(rank, world, cfg)`` measures, on the same ranks and the same gloo group:

1. **bandwidth** variants: a ``ShardedTable`` (``shards="rank"``, ``Uniform``, one float32
   field of ``cfg["row_floats"]`` floats, ``cfg["items_per_shard"]`` one-step items per
   shard) and ``sample(batch)`` steps, against a bare ``all_to_all_single`` that replays,
   step for step, the split sizes the table's own exchange used (same bytes, same
   pattern, same group: the table's control group, so the same gloo connections);
2. **latency**: a table of one int64 scalar per row, ``sample(world)`` steps, against a
   bare 64-byte ``all_gather`` (8 int64 per rank), a bare 128-byte ``all_gather`` (the
   size of the table's header) and the two-collective floor (128-byte ``all_gather``
   then an ``all_to_all_single`` replaying the tiny step's splits);
3. the bytes every ``sample`` call's control ``all_gather`` sent and received, per call.

Timed blocks alternate (``rounds`` x: ``steps`` table steps, then the baselines for as
many steps), after ``warmup`` steps of each, so drifts in machine load hit both sides.
Each step is timed on every rank with ``time.perf_counter``; the parent takes, per step,
the slowest rank, then medians.

The table's ``Group.all_gather`` / ``Group.all_to_all`` (and its ``_plan``, ``_exchange``,
``_receive`` steps) are wrapped on the instance (the package is not modified) to time
the parts of ``sample`` and record the collectives' sizes: a ``perf_counter`` pair and a
list append each, about 1 us per step in all. Each step also counts the process's minor
page faults (``getrusage``): first touches of freshly allocated buffers.
"""

from __future__ import annotations

import os
import resource
import time

import numpy as np

clock = time.perf_counter
HOST_ENV = "REPRISE_HOST_ID"


class Probe:
    """Times and sizes of the collectives a ShardedTable makes (see the module docstring)."""

    def __init__(self, table):
        g = table._g
        self.events: list[tuple] = []
        gather, exchange = g.all_gather, g.all_to_all

        def timed_gather(words, doing):
            t0 = clock()
            out = gather(words, doing)
            self.events.append(("all_gather", clock() - t0, int(np.asarray(words).nbytes), int(out.nbytes)))
            return out

        def timed_exchange(send, recv, send_splits, recv_splits, doing, group=None):
            t0 = clock()
            exchange(send, recv, send_splits, recv_splits, doing, group=group)
            self.events.append(("all_to_all", clock() - t0, [int(x) for x in send_splits],
                                [int(x) for x in recv_splits]))

        g.all_gather = timed_gather
        g.all_to_all = timed_exchange
        for part in ("_plan", "_exchange", "_receive"):
            setattr(table, part, self._timed(part, getattr(table, part)))

    def _timed(self, part: str, method):
        def timed(*args, **kwargs):
            t0 = clock()
            try:
                return method(*args, **kwargs)
            finally:
                self.events.append((part, clock() - t0))
        return timed

    def take(self) -> list[tuple]:
        ev, self.events = self.events, []
        return ev


def _table(name, signature, cfg_items, assignment="iid", verify=True, own_host=None, shards="rank"):
    """A ShardedTable; ``own_host``: this rank's emulated host name (REPRISE_HOST_ID)."""
    import reprise as rp
    from reprise.distributed import ShardedTable
    old = os.environ.get(HOST_ENV)
    if own_host is not None:
        os.environ[HOST_ENV] = own_host
    try:
        return ShardedTable(name, signature, capacity_per_shard=cfg_items, sampler=rp.selectors.Uniform(),
                            shards=shards, assignment=assignment, verify_rows=verify, seed=7, timeout=60.0)
    finally:
        if own_host is not None:
            if old is None:
                os.environ.pop(HOST_ENV, None)
            else:
                os.environ[HOST_ENV] = old


def _fill(table, items: int, make, chunk: int = 1024) -> None:
    for start in range(0, items, chunk):
        table.insert({"x": make(start, min(chunk, items - start))}, 1.0)


def minor_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _step(table, probe, batch):
    """One timed sample step: (seconds, sample, its collectives and parts)."""
    f0 = minor_faults()
    t0 = clock()
    s = table.sample(batch // len(table.consumers))  # batch: the global draw
    t = clock() - t0
    events = probe.take()
    events.append(("faults", minor_faults() - f0))
    return t, s, events


def _record(out: dict, t: float, events, rank: int, stride: int, status: int) -> tuple:
    """Adds one step's figures to ``out``; returns the exchange's (send, recv) splits."""
    gathers = [e for e in events if e[0] == "all_gather"]
    (_, t_a2a, send, recv), = [e for e in events if e[0] == "all_to_all"]
    out["sample_s"].append(t)
    out["gather_s"].append(sum(e[1] for e in gathers))
    out["a2a_s"].append(t_a2a)
    out["gathers"].append(len(gathers))
    out["control_sent_bytes"].append(sum(e[2] for e in gathers))
    out["control_recv_bytes"].append(sum(e[3] for e in gathers))
    parts = {e[0]: e[1] for e in events if len(e) == 2}
    out["faults"].append(parts["faults"])
    out["plan_s"].append(parts["_plan"])
    out["receive_s"].append(parts["_receive"])
    out["pack_s"].append(parts["_exchange"] - t_a2a - parts["_receive"])
    out["begin_s"].append(t - parts["_plan"] - parts["_exchange"])
    out["exchange_bytes"].append(sum(send))
    out["remote_bytes"].append(sum(n for d, n in enumerate(send) if d != rank))
    out["remote_rows"].append(sum((n - status) // stride for d, n in enumerate(send) if d != rank))
    return send, recv


def _new_record() -> dict:
    return {k: [] for k in ("sample_s", "gather_s", "a2a_s", "gathers", "control_sent_bytes", "control_recv_bytes",
                            "exchange_bytes", "remote_bytes", "remote_rows", "bare_s", "plan_s", "receive_s",
                            "pack_s", "begin_s", "faults")}


def bandwidth(cfg: dict, rank: int, world: int, batch: int, assignment: str, verify: bool,
              own_host: bool, shards: str = "rank", reads: bool = True) -> dict:
    """``shards="host"``: one shard on this (one) host, rank 0's, the other ranks reading
    its rows from shared memory. ``reads=False``: every row through the exchange, an
    owner's own rows and same-host rows too (the data path before same-host reads)."""
    import reprise as rp
    import torch
    import torch.distributed as dist
    from reprise.distributed import _rows

    floats = cfg["row_floats"]
    signature = {"x": rp.Field((floats,), "float32")}
    name = f"bw-{assignment}-{batch}-{int(verify)}-{int(own_host)}-{shards}-{int(reads)}"
    shard_items = cfg["items_per_shard"] * (world if shards == "host" else 1)
    table = _table(name, signature, shard_items, assignment, verify, f"bench-host-{rank}" if own_host else None,
                   shards)
    if not reads:
        table._use_locators(np.zeros_like(table._locators))
    rng = np.random.default_rng(1000 + rank)
    if table.shard is not None:
        _fill(table, shard_items, lambda s, n: rng.standard_normal((n, 1, floats), dtype=np.float32))
    _, stride = _rows.layout(signature, 1)
    status = _rows.STATUS
    probe = Probe(table)
    group = table._g.control  # the group the table's rows cross: the same gloo connections
    most = status * world + batch * stride
    send_buf = torch.full((most,), 7, dtype=torch.uint8)
    recv_buf = torch.zeros(most, dtype=torch.uint8)

    def bare(splits) -> float:
        send, recv = splits
        s, r = send_buf[:sum(send)], recv_buf[:sum(recv)]
        t0 = clock()
        dist.all_to_all_single(r, s, output_split_sizes=recv, input_split_sizes=send, group=group)
        return clock() - t0

    out = _new_record()
    warm = []
    for _ in range(cfg["warmup_steps"]):
        t, s, ev = _step(table, probe, batch)
        warm.append(_record(_new_record(), t, ev, rank, stride, status))
    for splits in warm:
        bare(splits)
    last = None
    for _ in range(cfg["rounds"]):
        block = []
        for _ in range(cfg["steps_per_round"]):
            t, last, ev = _step(table, probe, batch)
            block.append(_record(out, t, ev, rank, stride, status))
        for splits in block:
            out["bare_s"].append(bare(splits))
    x = last.data["x"]
    assert x.shape == (batch // world, 1, floats) and np.isfinite(x).all(), (x.shape, batch, world)
    table.close()
    out.update(batch=batch, assignment=assignment, verify_rows=verify, own_host=own_host, stride=stride,
               payload_bytes_per_row=floats * 4, status_bytes=status, shards=shards, reads=reads)
    return out


def latency(cfg: dict, rank: int, world: int) -> dict:
    import reprise as rp
    import torch
    import torch.distributed as dist
    from reprise.distributed import _rows

    signature = {"x": rp.Field((), "int64")}
    items = cfg["tiny_items"]
    table = _table("tiny", signature, items)
    _fill(table, items, lambda s, n: np.arange(s, s + n, dtype=np.int64).reshape(n, 1))
    _, stride = _rows.layout(signature, 1)
    status = _rows.STATUS
    probe = Probe(table)
    group = table._g.control
    small = {8: torch.full((8,), rank, dtype=torch.int64), 16: torch.full((16,), rank, dtype=torch.int64)}
    gathered = {k: [torch.empty_like(v) for _ in range(world)] for k, v in small.items()}
    most = status * world + world * stride
    send_buf = torch.full((most,), 7, dtype=torch.uint8)
    recv_buf = torch.zeros(most, dtype=torch.uint8)

    def gather(words: int) -> float:
        t0 = clock()
        dist.all_gather(gathered[words], small[words], group=group)
        return clock() - t0

    def pair(splits) -> float:
        send, recv = splits
        t0 = clock()
        dist.all_gather(gathered[16], small[16], group=group)
        dist.all_to_all_single(recv_buf[:sum(recv)], send_buf[:sum(send)], output_split_sizes=recv,
                               input_split_sizes=send, group=group)
        return clock() - t0

    out = _new_record()
    out.update(gather64_s=[], gather128_s=[], pair_s=[])
    warm = []
    for _ in range(cfg["warmup_steps"]):
        t, s, ev = _step(table, probe, world)
        warm.append(_record(_new_record(), t, ev, rank, stride, status))
    for splits in warm:
        gather(8), gather(16), pair(splits)
    last = None
    for _ in range(cfg["rounds"]):
        block = []
        for _ in range(cfg["tiny_steps_per_round"]):
            t, last, ev = _step(table, probe, world)
            block.append(_record(out, t, ev, rank, stride, status))
        for _ in block:
            out["gather64_s"].append(gather(8))
        for _ in block:
            out["gather128_s"].append(gather(16))
        for splits in block:
            out["pair_s"].append(pair(splits))
    assert last.data["x"].shape == (1, 1), last.data["x"].shape
    table.close()
    out.update(batch=world, stride=stride, status_bytes=status, items_per_shard=items)
    return out


def variants(cfg: dict) -> list[tuple]:
    """(key, batch, assignment, verify_rows, one emulated host per rank, shards, same-host
    reads) of the bandwidth rows."""
    out = []
    for verify in (True, False):
        for b in cfg["batches"]:
            out.append((f"iid/b{b}" + ("" if verify else "/no-crc"), b, "iid", verify, False, "rank", True))
    for b in cfg["local_batches"]:
        out.append((f"iid/b{b}/exchange", b, "iid", True, False, "rank", False))
        out.append((f"local-hosts/b{b}", b, "local", True, True, "rank", True))
        if not cfg.get("links"):  # on namespaced links every rank is a host of its own
            out.append((f"host-shard/b{b}", b, "iid", True, False, "host", True))
            out.append((f"host-shard/b{b}/exchange", b, "iid", True, False, "host", False))
    return out


def rank_main(rank: int, world: int, cfg: dict) -> dict:
    import reprise as rp
    import torch
    from reprise.distributed.table import WORDS

    t0 = clock()
    result = {"rank": rank, "versions": {"reprise": getattr(rp, "__version__", "?"), "torch": torch.__version__,
                                         "numpy": np.__version__},
              "header_words": WORDS, "bandwidth": {}}
    result["latency"] = latency(cfg, rank, world)
    for key, *how in variants(cfg):
        result["bandwidth"][key] = bandwidth(cfg, rank, world, *how)
    result["wall_s"] = clock() - t0
    return result
