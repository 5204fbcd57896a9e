"""Reprise side of the async-RL comparison (``benchmarks.async_rl.compare``):
``python -m benchmarks.async_rl.reprise_async [--quick] [--only KEYS]`` prints one JSON
object (workloads in ``workloads.py``).

Paths: one ``rp.Store({"token": int32, "logprob": float32, "mask": bool}, capacity=2**24
steps, block_steps=4096)`` and ``rp.Table("rollouts", store, Uniform, Fifo,
max_size=100,000, attributes={"version": "int64", "reward": "float32", "group": "int64"}
[, max_staleness=2])`` per workload, in this process.

- insert: one ``store.writer()`` per pass; per sequence ``w.extend({field: array [L]})``,
  ``w.create_item(table, num_steps=L, priority=1.0, attributes={...})``,
  ``w.end_episode()``; the pass ends when the writer's ``with`` block has flushed (every
  item sampleable). The arrays are copied into the store. Timed after the store's ring has
  been written round once (``workloads.py``); the first pass into the new store is
  ``cold_tokens_per_s``.
- sample_pack: ``table.sample(tokens=65_536)`` (as many whole items as fit in the budget),
  then ``.packed()`` (``data[f]`` [total], ``cu_seqlens`` int32[n + 1], ``lengths``,
  ``position_ids``); the attributes are ``sample.attributes[key]`` [n].
- staleness: the table made with ``max_staleness=2``; ``table.set_version(v)`` as the
  version advances, new groups written with ``attributes={"version": v, ...}``; the table
  drops items that went stale (``info()["stale_removed"]``, ``["stale_dropped"]``).

- sample_pack[groups]: the table made with ``group_size=8``: a group becomes sampleable
  when all 8 sequences are in, and ``table.sample(16)`` draws two whole groups, packed
  (TorchRL's row: ``PromptGroupSampler(num_groups=2)``). The other rows draw items.
"""

from __future__ import annotations

import gc

import numpy as np
import reprise as rp

from benchmarks.async_rl import workloads as wl
from benchmarks.common.bench import Bench, package_versions


class Rollouts:
    """A store and its table (closed by ``close``)."""

    def __init__(self, cfg, max_staleness: int | None = None, group_size: int | None = None) -> None:
        signature = {f: rp.Field((), wl.FIELD_DTYPES[f]) for f in wl.FIELDS}
        self.store = rp.Store(signature, capacity=cfg.store_capacity, block_steps=cfg.block_steps)
        self.store_capacity = cfg.store_capacity
        kwargs = {} if max_staleness is None else {"max_staleness": max_staleness}
        if group_size is not None:
            kwargs["group_size"] = group_size
        self.table = rp.Table("rollouts", self.store, sampler=rp.selectors.Uniform(),
                              remover=rp.selectors.Fifo(), max_size=cfg.max_size,
                              attributes=dict(wl.ATTRIBUTES), **kwargs)

    def write(self, seqs: wl.Sequences, groups: list[tuple[int, int, int]]) -> None:
        """``groups``: (source group, version, group id) each; one writer for all of them."""
        table = self.table
        with self.store.writer() as w:
            for source, version, gid in groups:
                for i in seqs.group(source):
                    seq = seqs.seqs[i]
                    w.extend(seq)
                    w.create_item(table, num_steps=int(seqs.lengths[i]), priority=1.0,
                                  attributes={"version": version, "reward": float(seqs.reward[i]), "group": gid})
                    w.end_episode()

    def warm(self, seqs: wl.Sequences) -> None:
        """Write every group until the store's ring has wrapped once (all its pages touched),
        then empty the table: later writes land on pages in use, as in a running buffer."""
        written = 0
        groups = [(g, 0, g) for g in range(seqs.groups)]
        while written < self.store_capacity:
            self.write(seqs, groups)
            self.table.reset()
            written += seqs.tokens

    def close(self) -> None:
        self.store.close()
        self.table = self.store = None
        gc.collect()


def draw(table, budget: int):
    s = table.sample(tokens=budget)
    return s, s.packed()


def check(seqs, s, p, budget, min_version=None, group_ids=None) -> dict:
    return wl.check_packed(seqs, p.data, p.cu_seqlens, p.position_ids, s.attributes["group"], budget,
                           versions=s.attributes["version"], min_version=min_version, group_ids=group_ids)


# --- workloads ------------------------------------------------------------------------------------
def insert(cfg, seqs: wl.Sequences) -> dict:
    r = Rollouts(cfg)
    try:
        all_groups = [(g, 0, g) for g in range(seqs.groups)]
        out = wl.insert_passes(lambda: r.write(seqs, all_groups), r.table.reset, seqs.tokens, cfg,
                               warm_tokens=cfg.store_capacity + seqs.tokens)
        assert len(r.table) == seqs.groups * seqs.group_size, (len(r.table), seqs.groups * seqs.group_size)
    finally:
        r.close()
    out["path"] = ("store.writer(): extend(sequence) + create_item(table, num_steps=L, attributes=...) + "
                   "end_episode() per sequence, flushed at the end of the pass")
    return out


def sample_pack(cfg, seqs: wl.Sequences, groups: bool = False) -> dict:
    """``sample(tokens=budget).packed()`` from an item table; with ``groups``, two whole
    groups per draw (``sample(2 * group_size, packed=True)``) from a table that admits
    groups of ``group_size``."""
    r = Rollouts(cfg, group_size=seqs.group_size if groups else None)
    try:
        r.write(seqs, [(g, 0, g) for g in range(seqs.groups)])
        table, budget, n = r.table, cfg.token_budget, 2 * seqs.group_size
        assert len(table) == seqs.groups * seqs.group_size, len(table)

        def sample():
            return table.sample(n, packed=True) if groups else table.sample(tokens=budget)

        def call():
            p = sample().packed()
            return int(p.cu_seqlens[-1]), len(p.lengths)

        out = wl.token_rounds(call, cfg)
        s = sample()
        p = s.packed()
        out["check"] = check(seqs, s, p, 1 << 62 if groups else budget)
        out["check"]["packed_types"] = {f: str(np.asarray(p.data[f]).dtype) for f in wl.FIELDS} | {
            "cu_seqlens": str(np.asarray(p.cu_seqlens).dtype), "position_ids": str(np.asarray(p.position_ids).dtype)}
        if groups:
            g, k = s.attributes["group"], seqs.group_size
            out["check"]["whole_groups"] = bool((g[:k] == g[0]).all() and (g[k:] == g[-1]).all())
            if not out["check"]["whole_groups"]:
                raise AssertionError(f"a draw of two groups returned groups {g.tolist()}")
    finally:
        r.close()
    out["path"] = (f"Table(group_size={seqs.group_size}).sample({n}, packed=True).packed()" if groups
                   else f"table.sample(tokens={cfg.token_budget}).packed()")
    return out


def staleness(cfg, seqs: wl.Sequences) -> dict:
    r = Rollouts(cfg, max_staleness=cfg.max_staleness)
    try:
        table, budget = r.table, cfg.token_budget
        sched = wl.StaleSchedule(cfg, seqs)
        r.warm(seqs)
        r.write(seqs, [(gid % seqs.groups, v, gid) for gid, v in sched.prefill()])
        table.set_version(sched.version)
        inserted = [0]

        def call():
            s, p = draw(table, budget)
            step = sched.after_draw()
            if step is not None:
                v, gids = step
                table.set_version(v)
                r.write(seqs, [(gid % seqs.groups, v, gid) for gid in gids])
                inserted[0] += sum(int(seqs.lengths[list(seqs.group(gid % seqs.groups))].sum()) for gid in gids)
            return int(p.cu_seqlens[-1]), len(p.lengths)

        out = wl.token_rounds(call, cfg)
        s, p = draw(table, budget)
        out["check"] = check(seqs, s, p, budget, min_version=sched.version - cfg.max_staleness,
                             group_ids=lambda gid: gid % seqs.groups)
        info = table.info()
        out.update(final_version=sched.version, version_reported=int(table.version),
                   stored_items_at_end=len(table), inserted_tokens=inserted[0],
                   stale_removed=info.get("stale_removed"), stale_dropped=info.get("stale_dropped"))
        if out["version_reported"] != sched.version:
            raise AssertionError(f"table.version is {out['version_reported']}, set to {sched.version}")
    finally:
        r.close()
    out["path"] = (f"Table(max_staleness={cfg.max_staleness}), set_version every "
                   f"{cfg.stale_samples_per_version} draws, table.sample(tokens={cfg.token_budget}).packed()")
    return out


def main() -> None:
    bench = Bench("reprise", "async_rl", wl.make_config)
    cfg = bench.cfg
    bench.versions.update(package_versions("reprise"))
    bench.versions["reprise_module"] = rp.__file__
    seqs = wl.Sequences(cfg, cfg.insert_groups)
    bench.notes.append(f"sequences: {seqs.describe()}")
    bench.run("sample_pack[first]", sample_pack, cfg, seqs)  # first: the allocator as a new process has it
    bench.run("insert", insert, cfg, seqs)
    bench.run("sample_pack", sample_pack, cfg, seqs)
    bench.run("sample_pack[groups]", sample_pack, cfg, seqs, True)
    bench.run("staleness", staleness, cfg, seqs)
    bench.finish()


if __name__ == "__main__":
    main()
