"""What the async-RL comparison's two sides share (``benchmarks.async_rl.compare``): the
sizes, the sequences, how a workload is timed, and the checks of a packed batch.
numpy and the standard library only.

Data. A token is one step with the fields ``token`` int32 (uniform in [0, 151,936), a
Qwen-sized vocabulary), ``logprob`` float32 (uniform in (-8, 0]) and ``mask`` bool
(False over the prompt, the first min(L // 4, 512) tokens, True over the response). A
sequence is one item of L tokens, L log-uniform in [256, 16,384] (seed 0: the same
sequences for every system and run); sequences come in GRPO prompt groups of 8 (group g
is sequences 8g .. 8g + 7) with per-item attributes ``version`` int64, ``reward``
float32 (uniform in [0, 1)) and ``group`` int64 (= g). Mean length ~3,900 tokens.

Workloads (keys of each side's ``results``; a row's number is tokens/s):

- ``insert``: write ``insert_groups`` groups (~4M tokens) with their attributes into an
  empty buffer, ``insert_repeats`` timed passes, each into the buffer emptied again
  (Reprise ``table.reset()``, TorchRL ``rb.empty()``), after untimed warm-up passes: the
  steady state of a buffer in use. Reprise's store is a ring of ``store_capacity`` steps
  whose pages are first touched when the writer first reaches them (about 2.7x slower
  than rewriting touched pages here), so its warm-up writes until the ring has wrapped
  once (``store_capacity`` tokens); TorchRL's storage keeps references to tensors the
  producer already allocated, so one pass warms it. The first pass into a new buffer is
  reported beside it (``cold_tokens_per_s``).
- ``sample_pack``: from a buffer holding those groups, draw ``token_budget`` (65,536)
  tokens' worth of sequences and pack them into the varlen layout a flash-attention
  trainer takes: ``data[f]`` [total_tokens] per field, ``cu_seqlens`` int32[n + 1],
  ``position_ids`` [total_tokens], the per-item attributes [n].
- ``staleness``: the same draw with ``max_staleness`` = 2 while the policy moves on (Reprise's
  store ring written round once first, as for ``insert``, so the inserts land on touched
  pages as in a buffer in use): the buffer starts with ``stale_new_groups`` groups at each of versions 0, 1, 2 (version 2
  current); every ``stale_samples_per_version`` draws the version advances by one and
  ``stale_new_groups`` new groups of the new version are inserted. Inserts and version
  changes are inside the timed span; tokens/s counts the tokens drawn.

- ``sample_pack[first]``: ``sample_pack`` run first thing in each side's fresh process,
  before any other workload. Where a draw's output buffers come from depends on the C
  allocator's state: glibc serves large blocks by mmap and trims the heap's top until a
  block of several MB has been freed once, after which they come from already-mapped heap
  pages. A fresh process pays a page fault per 4 KiB of every draw's new buffers
  (``minor_faults_per_call``); a process that has run for a while (here: after the
  ``insert`` workload) does not. The other rows run after ``insert`` in both processes.

Timing: each sample workload warms up (>= 2 calls and ``warmup_seconds``), then runs
``rounds`` rounds of >= 2 calls and ``round_seconds``; a round's rate is the tokens its
calls returned over its seconds; the entry's number is the median round.
"""

from __future__ import annotations

import resource
import statistics
import time
from typing import Callable

import numpy as np

from benchmarks.common.config import Config

FIELDS = ("token", "logprob", "mask")
FIELD_DTYPES = {"token": "int32", "logprob": "float32", "mask": "bool"}
ATTRIBUTES = {"version": "int64", "reward": "float32", "group": "int64"}
VOCAB = 151_936
WORKLOADS = ["insert", "sample_pack", "staleness"]

FULL = dict(seed=0, min_len=256, max_len=16_384, group_size=8, insert_groups=128, token_budget=65_536,
            max_staleness=2, stale_new_groups=2, stale_samples_per_version=4,
            max_size=100_000, store_capacity=1 << 24, block_steps=4096,
            insert_repeats=5, rounds=9, round_seconds=0.5, warmup_seconds=0.3,
            passes=2, torch_threads=1, budget_seconds=240.0)
QUICK = dict(insert_groups=16, insert_repeats=2, rounds=2, round_seconds=0.1, warmup_seconds=0.05,
             passes=1, budget_seconds=60.0)


def make_config(quick: bool, budget: float | None) -> Config:
    return Config.choose(quick, budget, FULL, QUICK)


# --- the sequences ------------------------------------------------------------------------------
def lengths(cfg, n: int) -> np.ndarray:
    """The first ``n`` sequence lengths: log-uniform in [min_len, max_len], seeded."""
    rng = np.random.default_rng(cfg.seed)
    lo, hi = np.log(cfg.min_len), np.log(cfg.max_len + 1)
    return np.minimum(np.exp(rng.uniform(lo, hi, n)).astype(np.int64), cfg.max_len)


class Sequences:
    """``groups`` prompt groups of ``cfg.group_size`` sequences as numpy arrays (built once,
    before any clock starts): ``seqs[i]`` is {field: array [L_i]}, ``reward[i]``,
    ``group_of[i]``; ``group(g)`` the indices of group g. New groups in the staleness
    workload reuse these arrays in a cycle (``cycle_group(k)``) under new group ids."""

    def __init__(self, cfg, groups: int) -> None:
        n = groups * cfg.group_size
        self.group_size = cfg.group_size
        self.groups = groups
        self.lengths = lengths(cfg, n)
        rng = np.random.default_rng(cfg.seed + 1)
        self.seqs = []
        for L in self.lengths.tolist():
            mask = np.ones(L, bool)
            mask[:min(L // 4, 512)] = False
            self.seqs.append({"token": rng.integers(0, VOCAB, L, dtype=np.int32),
                              "logprob": -8.0 * rng.random(L, dtype=np.float32),
                              "mask": mask})
        self.reward = rng.random(n, dtype=np.float32)
        self.group_of = np.repeat(np.arange(groups, dtype=np.int64), cfg.group_size)
        self.tokens = int(self.lengths.sum())
        self.mean_length = float(self.lengths.mean())

    def group(self, g: int) -> range:
        return range(g * self.group_size, (g + 1) * self.group_size)

    def cycle_group(self, k: int) -> range:
        return self.group(k % self.groups)

    def describe(self) -> dict:
        return dict(sequences=len(self.seqs), groups=self.groups, tokens=self.tokens,
                    mean_length=round(self.mean_length, 1), min_length=int(self.lengths.min()),
                    max_length=int(self.lengths.max()))


def items_for_budget(cfg, seqs: Sequences) -> int:
    """How many items a fixed-size draw takes so that its expected tokens do not pass the
    budget: floor(token_budget / mean length) (TorchRL's side; it has no token budget)."""
    return max(1, int(cfg.token_budget // seqs.mean_length))


# --- timing --------------------------------------------------------------------------------------
def token_rounds(call: Callable[[], tuple[int, int]], cfg) -> dict:
    """``call()`` draws once and returns (tokens, items) it delivered. Warm-up, then
    ``cfg.rounds`` rounds; tokens/s per round and their median, tokens and items per call."""
    t_end = time.perf_counter() + cfg.warmup_seconds
    n = 0
    while n < 2 or time.perf_counter() < t_end:
        call()
        n += 1
    rates, calls, tokens, items = [], 0, 0, 0
    faults0 = minor_faults()
    for _ in range(cfg.rounds):
        c = tok = 0
        t0 = time.perf_counter()
        deadline = t0 + cfg.round_seconds
        while c < 2 or time.perf_counter() < deadline:
            t, i = call()
            tok += t
            items += i
            c += 1
        rates.append(tok / (time.perf_counter() - t0))
        calls += c
        tokens += tok
    return {"tokens_per_s": statistics.median(rates), "rounds": rates, "calls": calls,
            "tokens_per_call": tokens / calls, "items_per_call": items / calls,
            "us_per_call": 1e6 * statistics.median([tokens / calls / r for r in rates]),
            "minor_faults_per_call": (minor_faults() - faults0) / calls}


def minor_faults() -> int:
    """This process's minor page faults so far (a draw whose output buffers come from fresh
    pages pays one per 4 KiB page)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def insert_passes(insert_all: Callable[[], None], empty: Callable[[], None], tokens: int, cfg,
                  warm_tokens: int = 0) -> dict:
    """One cold pass of ``insert_all()`` into the new buffer, more untimed passes (each after
    ``empty()``) until ``warm_tokens`` tokens have been written in all, then
    ``cfg.insert_repeats`` timed passes each after ``empty()`` (not timed); tokens/s of each."""
    t0 = time.perf_counter()
    insert_all()
    cold = tokens / (time.perf_counter() - t0)
    written, warm_passes = tokens, 0
    while written < warm_tokens:
        empty()
        insert_all()
        written += tokens
        warm_passes += 1
    rates = []
    for _ in range(cfg.insert_repeats):
        empty()
        t0 = time.perf_counter()
        insert_all()
        rates.append(tokens / (time.perf_counter() - t0))
    return {"tokens_per_s": statistics.median(rates), "rounds": rates, "cold_tokens_per_s": cold,
            "tokens_per_pass": tokens, "warm_up_passes": warm_passes}


class StaleSchedule:
    """The staleness workload's clock: which version is current and which new groups to
    insert, shared by both sides. ``prefill()`` yields (group index, version) for the
    starting groups; ``after_draw()`` returns the new (version, [group indices]) every
    ``stale_samples_per_version`` draws, else None."""

    def __init__(self, cfg, seqs: Sequences) -> None:
        self.cfg, self.seqs = cfg, seqs
        self.version = cfg.max_staleness
        self.draws = 0
        self.next_group = 0

    def _take(self) -> list[int]:
        out = list(range(self.next_group, self.next_group + self.cfg.stale_new_groups))
        self.next_group += self.cfg.stale_new_groups
        return out

    def prefill(self) -> list[tuple[int, int]]:
        return [(k, v) for v in range(self.cfg.max_staleness + 1) for k in self._take()]

    def after_draw(self) -> tuple[int, list[int]] | None:
        self.draws += 1
        if self.draws % self.cfg.stale_samples_per_version:
            return None
        self.version += 1
        return self.version, self._take()


# --- checks of a packed batch (not timed) --------------------------------------------------------------
def check_packed(seqs: Sequences, data: dict, cu_seqlens, position_ids, groups, budget: int | None,
                 versions=None, min_version: int | None = None, group_ids: Callable[[int], int] = None) -> dict:
    """Checks one packed batch against the sequences it must come from: cu_seqlens starts at
    0 and ends at the total, each field has that many tokens, position_ids restart at 0 per
    sequence, every sequence equals one of its group's (``group_ids(attribute)`` maps a
    stored group id to the source group) and, with ``budget``, the total is within it;
    with ``min_version``, no item is older. Returns what it saw; raises on a mismatch."""
    cu = np.asarray(cu_seqlens).astype(np.int64)
    total = int(cu[-1])
    assert cu[0] == 0 and np.all(np.diff(cu) > 0), "cu_seqlens must start at 0 and increase"
    for f in FIELDS:
        assert np.asarray(data[f]).shape == (total,), (f, np.asarray(data[f]).shape, total)
    pos = np.asarray(position_ids).astype(np.int64)
    lens = np.diff(cu)
    expect = np.arange(total) - np.repeat(cu[:-1], lens)
    assert np.array_equal(pos, expect), "position_ids must restart at 0 for every sequence"
    groups = np.asarray(groups).astype(np.int64)
    assert groups.shape == (len(lens),), (groups.shape, len(lens))
    tokens = np.asarray(data["token"])
    for i in range(len(lens)):
        src_group = group_ids(int(groups[i])) if group_ids else int(groups[i])
        seg = slice(int(cu[i]), int(cu[i + 1]))
        found = [j for j in seqs.group(src_group) if seqs.lengths[j] == lens[i]
                 and np.array_equal(seqs.seqs[j]["token"], tokens[seg])]
        assert found, f"sequence {i} (group {groups[i]}, {lens[i]} tokens) is none of its group's"
        j = found[0]
        assert np.array_equal(seqs.seqs[j]["mask"], np.asarray(data["mask"])[seg]), f"mask of sequence {i}"
        assert np.array_equal(seqs.seqs[j]["logprob"], np.asarray(data["logprob"])[seg]), f"logprob of {i}"
    if budget is not None:
        assert total <= budget, f"{total} tokens drawn over a budget of {budget}"
    out = {"checked_items": int(len(lens)), "checked_tokens": total}
    if min_version is not None:
        v = np.asarray(versions).astype(np.int64)
        assert v.min() >= min_version, f"an item of version {v.min()} drawn at min version {min_version}"
        out["versions_seen"] = sorted(set(v.tolist()))
    return out
