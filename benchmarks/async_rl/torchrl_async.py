"""TorchRL side of the async-RL comparison (``benchmarks.async_rl.compare``):
``python -m benchmarks.async_rl.torchrl_async [--quick] [--only KEYS]`` prints one JSON
object (workloads in ``workloads.py``).

The composition TorchRL's own LLM code uses for ragged token data: ``grpo-async.py``
(sota-implementations/grpo) builds ``RayReplayBuffer(storage=partial(LazyStackStorage, N),
batch_size=B)`` over the default ``RandomSampler``; the collector writes one TensorDict per
sequence (ragged tensors, scalars beside them) and the trainer samples B sequences as a
``LazyStackedTensorDict``. Here the same ``ReplayBuffer`` runs in-process (no Ray actor):

- an item is ``TensorDict({"token": int32[L], "logprob": float32[L], "mask": bool[L],
  "policy_version": int64[], "reward": float32[], "group": int64[]}, batch_size=[])``
  (``policy_version`` is the key ``StalenessAwareSampler`` reads);
- insert: per group, the 8 TensorDicts built from the sequences' arrays
  (``torch.from_numpy``, no copy) and ``rb.extend(lazy_stack(group))`` (timed together:
  building the TensorDict is the user's step between the inference engine's arrays and the
  buffer). ``insert[prebuilt]`` times ``extend`` alone over TensorDicts built beforehand, as
  a collector would hand them over. ``LazyStackStorage`` keeps references to the tensors it
  is given: nothing is copied on insert (Reprise copies the tokens into its shared-memory
  store);
- no token budget in TorchRL: a draw is ``rb.sample(k)`` of k = floor(65,536 / mean
  sequence length) items (16 here), so its expected tokens match the budget without passing
  it on average (tokens/s is what is compared; each row reports its tokens per call);
- packing into the varlen layout: ``torch.cat(batch.get(f, as_list=True))`` per field
  (one copy, as the trainer's input must be contiguous), lengths from the tensors' shapes,
  ``cu_seqlens`` int32 by ``cumsum``, ``position_ids = arange(total) -
  repeat_interleave(cu_seqlens[:-1], lengths)``, the attributes by ``batch.get(key)`` (a
  stack of the items' scalars). This was faster here than ``as_nested_tensor=True,
  layout=torch.jagged`` + ``.values()`` / ``.offsets()`` (about 2x, measured while writing it);
- ``sample_pack[groups]``: ``PromptGroupSampler(num_groups=2, group_key="group")``, batch
  2 x 8 = 16 items: whole GRPO groups (Reprise's row: a table with ``group_size=8``,
  ``sample(16)``);
- ``staleness``: ``StalenessAwareSampler(max_staleness=2, staleness_weight_fn=uniform)``
  (the hard gate without the default 1/(staleness+1) weighting: Reprise draws uniformly
  among the items it admits), ``sampler.consumer_version = v`` as the version advances.
  TorchRL never removes stale items, and its gate reads every stored item's version on
  every draw (``storage[:n]`` of a ``LazyStackStorage`` stacks them), so its cost grows
  with what is stored. The row compared sizes the storage to the staleness window,
  ``max_size`` = (max_staleness + 1) x new groups per version x 8 items (48), so FIFO
  overwriting drops items as they go stale: the best a user who knows the schedule can
  do. ``staleness[max_size]`` keeps ``max_size`` = 100,000 items like Reprise's table:
  the stale items pile up during the run (``stored_items_at_end``) and every draw gets
  slower, so its number depends on how long the run is.

torch intra-op threads: ``cfg.torch_threads`` (1, as the integrations suite), recorded.
"""

from __future__ import annotations

import numpy as np
import torch
from tensordict import TensorDict, lazy_stack
from torchrl.data import LazyStackStorage, ReplayBuffer
from torchrl.data.replay_buffers.samplers import PromptGroupSampler, StalenessAwareSampler

from benchmarks.async_rl import workloads as wl
from benchmarks.common.bench import Bench, package_versions

GROUPS_PER_DRAW_DEFAULT = 2


def item_td(seq: dict, version: int, reward: float, group: int) -> TensorDict:
    return TensorDict({"token": torch.from_numpy(seq["token"]), "logprob": torch.from_numpy(seq["logprob"]),
                       "mask": torch.from_numpy(seq["mask"]),
                       "policy_version": torch.tensor(version, dtype=torch.int64),
                       "reward": torch.tensor(reward, dtype=torch.float32),
                       "group": torch.tensor(group, dtype=torch.int64)}, batch_size=[])


def group_stack(seqs: wl.Sequences, source: int, version: int, group_id: int):
    return lazy_stack([item_td(seqs.seqs[i], version, float(seqs.reward[i]), group_id)
                       for i in seqs.group(source)])


def pack(batch) -> dict:
    """The varlen layout of a sampled ``LazyStackedTensorDict``."""
    out = {}
    for f in wl.FIELDS:
        parts = batch.get(f, as_list=True)
        out[f] = torch.cat(parts)
    lengths = torch.tensor([p.shape[0] for p in parts], dtype=torch.int32)
    cu = torch.zeros(len(parts) + 1, dtype=torch.int32)
    torch.cumsum(lengths, 0, out=cu[1:])
    total = int(cu[-1])
    position_ids = torch.arange(total, dtype=torch.int32) - torch.repeat_interleave(cu[:-1], lengths)
    attributes = {"version": batch.get("policy_version"), "reward": batch.get("reward"),
                  "group": batch.get("group")}
    return {"data": out, "cu_seqlens": cu, "lengths": lengths, "position_ids": position_ids,
            "attributes": attributes, "tokens": total}


def check(seqs, p, budget=None, min_version=None, group_ids=None) -> dict:
    return wl.check_packed(seqs, {f: p["data"][f].numpy() for f in wl.FIELDS}, p["cu_seqlens"].numpy(),
                           p["position_ids"].numpy(), p["attributes"]["group"].numpy(), budget,
                           versions=p["attributes"]["version"].numpy(), min_version=min_version,
                           group_ids=group_ids)


def fill(rb, seqs: wl.Sequences) -> None:
    for g in range(seqs.groups):
        rb.extend(group_stack(seqs, g, 0, g))


# --- workloads ------------------------------------------------------------------------------------
def insert(cfg, seqs: wl.Sequences) -> dict:
    rb = ReplayBuffer(storage=LazyStackStorage(cfg.max_size))
    out = wl.insert_passes(lambda: fill(rb, seqs), rb.empty, seqs.tokens, cfg)
    assert len(rb) == seqs.groups * seqs.group_size
    out["path"] = "TensorDict per sequence + ReplayBuffer(LazyStackStorage).extend(lazy_stack(group of 8))"
    return out


def insert_prebuilt(cfg, seqs: wl.Sequences) -> dict:
    rb = ReplayBuffer(storage=LazyStackStorage(cfg.max_size))
    stacks = [group_stack(seqs, g, 0, g) for g in range(seqs.groups)]

    def insert_all() -> None:
        for s in stacks:
            rb.extend(s)

    out = wl.insert_passes(insert_all, rb.empty, seqs.tokens, cfg)
    out["path"] = "ReplayBuffer(LazyStackStorage).extend(lazy_stack(group of 8)), TensorDicts built beforehand"
    return out


def sample_pack(cfg, seqs: wl.Sequences, grouped: bool) -> dict:
    k = wl.items_for_budget(cfg, seqs)
    if grouped:
        num_groups = max(1, round(cfg.token_budget / (seqs.group_size * seqs.mean_length)))
        k = num_groups * seqs.group_size
        rb = ReplayBuffer(storage=LazyStackStorage(cfg.max_size), batch_size=k,
                          sampler=PromptGroupSampler(num_groups=num_groups, group_key="group"))
        path = (f"ReplayBuffer(LazyStackStorage, PromptGroupSampler(num_groups={num_groups}, group_key='group'))"
                f".sample() of {k} items + torch.cat per field")
    else:
        rb = ReplayBuffer(storage=LazyStackStorage(cfg.max_size), batch_size=k)
        path = f"ReplayBuffer(LazyStackStorage).sample() of {k} items (RandomSampler) + torch.cat per field"
    fill(rb, seqs)

    def call():
        p = pack(rb.sample())
        return p["tokens"], int(p["lengths"].shape[0])

    out = wl.token_rounds(call, cfg)
    p = pack(rb.sample())
    out["check"] = check(seqs, p)
    if grouped:
        g = p["attributes"]["group"].numpy()
        out["check"]["whole_groups"] = bool(all((g == x).sum() == seqs.group_size for x in set(g.tolist())))
    out.update(path=path, items_per_draw=k)
    return out


def uniform_weight(staleness: torch.Tensor) -> torch.Tensor:
    return torch.ones_like(staleness, dtype=torch.float32)


def staleness(cfg, seqs: wl.Sequences, window: bool) -> dict:
    k = wl.items_for_budget(cfg, seqs)
    sched = wl.StaleSchedule(cfg, seqs)
    max_size = ((cfg.max_staleness + 1) * cfg.stale_new_groups * seqs.group_size) if window else cfg.max_size
    sampler = StalenessAwareSampler(max_staleness=cfg.max_staleness, staleness_weight_fn=uniform_weight)
    rb = ReplayBuffer(storage=LazyStackStorage(max_size), sampler=sampler, batch_size=k)
    for gid, v in sched.prefill():
        rb.extend(group_stack(seqs, gid % seqs.groups, v, gid))
    sampler.consumer_version = sched.version
    inserted = [0]

    def call():
        p = pack(rb.sample())
        step = sched.after_draw()
        if step is not None:
            v, gids = step
            sampler.consumer_version = v
            for gid in gids:
                rb.extend(group_stack(seqs, gid % seqs.groups, v, gid))
                inserted[0] += int(seqs.lengths[list(seqs.group(gid % seqs.groups))].sum())
        return p["tokens"], int(p["lengths"].shape[0])

    out = wl.token_rounds(call, cfg)
    p = pack(rb.sample())
    out["check"] = check(seqs, p, min_version=sched.version - cfg.max_staleness,
                         group_ids=lambda gid: gid % seqs.groups)
    out.update(path=(f"ReplayBuffer(LazyStackStorage({max_size}), StalenessAwareSampler(max_staleness="
                     f"{cfg.max_staleness}, uniform weights)).sample() of {k} items + torch.cat per field"),
               items_per_draw=k, final_version=sched.version, stored_items_at_end=len(rb),
               inserted_tokens=inserted[0])
    return out


def main() -> None:
    bench = Bench("torchrl", "async_rl", wl.make_config)
    cfg = bench.cfg
    torch.set_num_threads(cfg.torch_threads)
    bench.versions.update(package_versions("torchrl", "tensordict", "torch"))
    bench.notes.append(f"torch intra-op threads: {torch.get_num_threads()}")
    seqs = wl.Sequences(cfg, cfg.insert_groups)
    bench.notes.append(f"sequences: {seqs.describe()}")
    bench.run("sample_pack[first]", sample_pack, cfg, seqs, False)  # first: the allocator as a new process has it
    bench.run("insert", insert, cfg, seqs)
    bench.run("insert[prebuilt]", insert_prebuilt, cfg, seqs)
    bench.run("sample_pack", sample_pack, cfg, seqs, False)
    bench.run("sample_pack[groups]", sample_pack, cfg, seqs, True)
    bench.run("staleness", staleness, cfg, seqs, True)
    bench.run("staleness[max_size]", staleness, cfg, seqs, False)
    bench.finish()


if __name__ == "__main__":
    main()
