"""The single-table reference of a cluster-mode draw: the same plan arithmetic
applied, in one process, to a list of ordinary tables standing for the shards.
With the same inserts, deletes and priority updates, ``ReferenceTable.sample``
returns exactly (bit for bit) the keys and probabilities a ``ShardedTable`` with
that many shards draws over all its consumers together, in position order."""

from __future__ import annotations

import numpy as np

from .. import _native
from ..table import Table

C = _native.cluster


class ReferenceTable:
    """``tables[s]`` plays shard s (each built as that shard would be, with the
    same seed). ``sample(n)`` is step after step of the global draw."""

    def __init__(self, tables: list[Table], seed: int, name: str | None = None):
        self.tables = list(tables)
        self.seed = int(seed)
        self.table_id = C.table_id(name or self.tables[0].name)
        self.step = 0
        self.boundaries = [[] for _ in self.tables]

    def sample(self, n: int) -> dict:
        """``{keys, probabilities, table_size}`` of step ``self.step``'s n positions
        (drawn units: with ``group_size`` G, n groups, their members in order)."""
        natives = [t._native for t in self.tables]
        plan = self._positions(n)
        groups = self.tables[0].info()["groups"]
        rows = n * (groups["group_size"] if groups else 1)
        keys = np.zeros(rows, dtype=np.uint64)
        probabilities = np.zeros(rows, dtype=np.float64)
        filled = np.zeros(rows, dtype=bool)
        shard, index, table_size = plan["shard"], plan["index"], plan["table_size"]
        for s, t in enumerate(natives):
            at = np.nonzero(shard == s)[0]
            if "ranked" in plan:
                pick = index[at].astype(np.int64)
                ranked = plan["ranked"][s]
                drawn, ok = t.draw_ranked(np.ascontiguousarray(ranked[0][pick]), np.ascontiguousarray(ranked[1][pick]),
                                          table_size)
            else:
                drawn, ok = t.draw_planned(plan["by_mass"], np.ascontiguousarray(index[at]),
                                           np.ascontiguousarray(plan["mass"][at]), plan["divisor"], table_size,
                                           int(plan["sizes"][s]), float(plan["masses"][s]))
            self._put(drawn, ok, at, s, keys, probabilities, filled)
        for b, next_seq in zip(self.boundaries, plan["next_seqs"]):
            b.append(next_seq)
        self.step += 1
        return {"keys": keys[filled], "probabilities": probabilities[filled], "table_size": table_size}

    def sample_tokens(self, tokens: int, consumers: int = 1) -> dict:
        """``sample``'s result for a token-budget step of ``tokens`` per consumer
        over ``consumers`` consumers, with ``consumer``: which one takes each position."""
        cap = consumers * tokens + 1
        k = min(cap, 16 * consumers)
        while True:
            lengths = self._lengths(k)
            consumer = C.token_cut(lengths, consumers, tokens)
            if len(consumer) < len(lengths) or len(lengths) < k or k >= cap:
                break
            k = min(cap, 2 * k)
        out = self.sample(len(consumer))
        out["consumer"] = consumer
        return out

    def _positions(self, n: int) -> dict:
        """The next step's first ``n`` positions, drawing nothing: ``shard`` and
        ``index`` per position, ``table_size``, the shards' ``sizes``, ``masses`` and
        ``next_seqs``; for random samplers the plan's ``mass``, ``by_mass`` and
        ``divisor``, for ordered ones each shard's ``ranked`` candidates and
        ``lengths`` per position."""
        natives = [t._native for t in self.tables]
        summaries = [t.shard_summary() for t in natives]
        sizes = np.array([s[0] for s in summaries], dtype=np.uint64)
        masses = np.array([s[1] for s in summaries], dtype=np.float64)
        out = {"sizes": sizes, "masses": masses, "next_seqs": [s[2] for s in summaries], "table_size": int(sizes.sum())}
        kind = self.tables[0]._sampler._spec()
        if kind[0] in ("Uniform", "Prioritized"):
            shard, index, mass, by_mass, divisor, table_size = C.plan(
                kind[0] == "Prioritized", sizes, masses, n, self.seed, self.table_id, self.step)
            return {**out, "shard": shard, "index": index, "mass": mass, "by_mass": by_mass, "divisor": divisor,
                    "table_size": table_size}
        max_times = self.tables[0].info()["max_times_sampled"]
        k = C.candidates_needed(kind, max_times, n)
        ranked = [t.ranked(k) for t in natives]
        counts = np.array([len(r[0]) for r in ranked], dtype=np.uint64)
        visible = [np.searchsorted(np.array(b, dtype=np.int64), r[1].astype(np.int64), side="right")
                   for b, r in zip(self.boundaries, ranked)]
        cat = [np.concatenate([r[i] for r in ranked]) for i in range(5)]
        shard, index = C.merge(kind, max_times, counts, cat[0].astype(np.uint32), cat[1].astype(np.uint64),
                               cat[2].astype(np.float64), cat[3].astype(np.uint32),
                               np.concatenate(visible).astype(np.uint64), n, out["table_size"])
        first = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
        lengths = cat[4][first[shard.astype(np.int64)] + index.astype(np.int64)].astype(np.uint32)
        return {**out, "shard": shard, "index": index, "ranked": ranked, "lengths": lengths}

    def _lengths(self, n: int) -> np.ndarray:
        """The lengths of the units the next step's first ``n`` positions would draw."""
        plan = self._positions(n)
        if "lengths" in plan:
            return plan["lengths"]
        lengths = np.zeros(len(plan["shard"]), dtype=np.uint32)
        for s, t in enumerate(self.tables):
            at = np.nonzero(plan["shard"] == s)[0]
            lengths[at] = t._native.planned_lengths(plan["by_mass"], np.ascontiguousarray(plan["index"][at]),
                                                    np.ascontiguousarray(plan["mass"][at]), int(plan["sizes"][s]),
                                                    float(plan["masses"][s]))
        return lengths

    @staticmethod
    def _put(rows, ok, at, shard, keys, probabilities, filled):
        """Puts a shard's drawn rows at their positions: ``ok`` holds ``width`` rows
        per position in ``at`` (a group's members with ``group_size``), so the
        outputs hold ``width`` rows per position."""
        local, probs = rows.meta()[:2]
        rows.release()
        width = len(ok) // len(at) if len(at) else 1
        done = (at[:, None] * width + np.arange(width)).reshape(-1)[ok]
        keys[done] = C.global_keys(shard, local)
        probabilities[done] = probs
        filled[done] = True
