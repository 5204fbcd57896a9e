"""Placement: where the sampling mass lies against where the consumers are, the
rows a step is expected to move between hosts, and offline data spread over the
shards so each host's mass share matches its consumers' share (GEAR's placement:
with pipelines, the data goes to the first-stage hosts)."""

from __future__ import annotations

import math

import numpy as np

from ..errors import InvalidArgument
from . import _rows
from ._header import W_MASS, W_MAXLEN, W_SIZE, bits_f64


def _expected_excess(batch: int, p: float, quota: int) -> float:
    """E[max(0, X - quota)] for X ~ Binomial(batch, p)."""
    if p <= 0.0:
        return 0.0
    if p >= 1.0:
        return float(max(0, batch - quota))
    k = np.arange(quota + 1, batch + 1)
    if len(k) == 0:
        return 0.0
    logpmf = (np.array([math.lgamma(batch + 1)]) - np.vectorize(math.lgamma)(k + 1)
              - np.vectorize(math.lgamma)(batch - k + 1) + k * math.log(p) + (batch - k) * math.log1p(-p))
    return float(np.sum((k - quota) * np.exp(logpmf)))


def report(table, owners: np.ndarray, batch: int) -> dict:
    """``ShardedTable.placement_report``'s figures from the gathered headers."""
    kind = table._sampler._spec()[0]
    weights = bits_f64(owners[:, W_MASS]) if kind == "Prioritized" else owners[:, W_SIZE].astype(np.float64)
    total = float(weights.sum())
    names = table._g.host_names
    n_consumers = len(table._consumers)
    quota = batch // n_consumers if batch % n_consumers == 0 else None
    _, stride = _rows.layout(table._signature, max(1, int(owners[:, W_MAXLEN].max())), table._record)
    hosts, remote_rows = [], 0.0
    for h, name in enumerate(names):
        mass = float(weights[table._shard_host == h].sum())
        share = mass / total if total > 0 else 0.0
        consumers_here = int((table._consumer_host == h).sum())
        if table._assignment == "iid" or quota is None:
            crossing = batch * share * (1 - consumers_here / n_consumers) if quota is not None else float("nan")
        else:
            crossing = _expected_excess(batch, share, quota * consumers_here)
        remote_rows += crossing
        hosts.append({"host": name, "mass_share": share, "consumer_share": consumers_here / n_consumers,
                      "expected_rows_sent_away": crossing})
    return {"global_batch_size": batch, "assignment": table._assignment, "row_bytes": stride, "hosts": hosts,
            "expected_remote_rows_per_step": remote_rows,
            "expected_remote_bytes_per_step": remote_rows * stride,
            "expected_remote_fraction": remote_rows / batch}


def consumer_shares(table) -> np.ndarray:
    """Each shard's target share of offline data: its host's consumer share split
    evenly over that host's shards."""
    shares = np.zeros(table.num_shards)
    n = len(table._consumers)
    for h in set(int(x) for x in table._shard_host):
        on_host = np.nonzero(table._shard_host == h)[0]
        shares[on_host] = (table._consumer_host == h).sum() / n / len(on_host)
    return shares


def load_dataset(table, episodes, priority: float = 1.0, window: int | None = None) -> int:
    """Spreads ``episodes`` (a sequence of ``{field: array[T, ...]}``, the same on
    every rank) over the shards so each host's share matches its consumers' share;
    each owner inserts its episodes (whole, or every ``window``-step window when
    given; an episode shorter than ``window`` is one item of its length). Returns
    the items this rank inserted. Not a collective, but every
    owner must call it with the same episodes."""
    shares = consumer_shares(table)
    if shares.sum() <= 0:
        raise InvalidArgument("no consumer: nothing to place the data near")
    lengths = np.array([len(next(iter(e.values()))) for e in episodes], dtype=np.float64)
    # Greedy by step count: each episode to the shard furthest below its share.
    target = shares / shares.sum() * lengths.sum()
    got = np.zeros(len(shares))
    owner_of = np.empty(len(episodes), dtype=np.int64)
    for i in np.argsort(-lengths, kind="stable"):
        s = int(np.argmax(target - got))
        owner_of[i] = s
        got[s] += lengths[i]
    if table.shard is None:
        return 0
    inserted = 0
    for i in np.nonzero(owner_of == table.shard)[0]:
        ep = episodes[int(i)]
        T = len(next(iter(ep.values())))
        w = T if window is None or T < window else window  # a short episode: one item, as rp.datasets.load
        starts = range(0, T - w + 1)
        data = {k: np.stack([np.asarray(v)[s:s + w] for s in starts]) for k, v in ep.items()}
        table.insert(data, priority)
        inserted += len(starts)
    return inserted
