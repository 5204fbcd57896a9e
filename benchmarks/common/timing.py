"""How every suite times: one clock, rounds, windows, per-call times, percentiles
(standard library; numpy only inside :func:`latency_stats`).

- :func:`timed_rounds`: one caller, back to back: warm-up, then ``cfg.rounds`` rounds of
  at least ``cfg.round_seconds``; units/s per round (the core and writer1 workloads).
- :class:`Window`: processes that start together, warm up, and count only what they
  finish inside a common window (:func:`count_in_window`, :func:`latencies_in_window`,
  :func:`window_run`); :func:`latency_stats` summarises latencies in ms.
- :func:`call_times` / :func:`call_summary`: seconds per call, each closed by a ``sync``
  (a CUDA synchronize on the GPU), and their median and percentiles in us.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable


def now() -> float:
    """CLOCK_MONOTONIC: one clock for every process on this host."""
    return time.monotonic()


# --- one caller, back to back -------------------------------------------------------------
def timed_rounds(call: Callable[[], object], units_per_call: int, cfg,
                 flush: Callable[[], object] | None = None) -> list[float]:
    """Warm up (at least two calls and ``cfg.warmup_seconds``), then ``cfg.rounds``
    rounds of at least two calls and ``cfg.round_seconds`` each; ``flush()`` (if
    given) ends the warm-up and every round, inside the timed span. Units/s per round."""
    t_end = now() + cfg.warmup_seconds
    n = 0
    while n < 2 or now() < t_end:
        call()
        n += 1
    if flush is not None:
        flush()
    rates = []
    for _ in range(cfg.rounds):
        calls = 0
        t0 = now()
        deadline = t0 + cfg.round_seconds
        while calls < 2 or now() < deadline:
            call()
            calls += 1
        if flush is not None:
            flush()
        rates.append(calls * units_per_call / (now() - t0))
    return rates


# --- processes that start together ---------------------------------------------------------
@dataclass
class Window:
    """The measured span of a concurrent run: every process starts at ``start``,
    warms up for ``warmup`` seconds, and counts what it finishes inside
    [start + warmup, start + warmup + duration]."""

    start: float
    warmup: float
    duration: float

    @property
    def begin(self) -> float:
        return self.start + self.warmup

    @property
    def end(self) -> float:
        return self.start + self.warmup + self.duration

    def wait_start(self) -> None:
        d = self.start - now()
        if d > 0:
            time.sleep(d)


def count_in_window(win: Window, call, units_per_call: int) -> dict:
    """Call repeatedly from win.start until win.end; count units of calls that
    finished inside the window."""
    win.wait_start()
    counted = 0
    calls = 0
    while True:
        t = now()
        if t >= win.end:
            break
        call()
        calls += 1
        done = now()
        if win.begin <= done <= win.end:
            counted += units_per_call
    return {"units": counted, "calls": calls, "seconds": win.duration,
            "per_s": counted / win.duration}


def latencies_in_window(win: Window, call, period: float = 0.0, phase: float = 0.0,
                        after=None) -> list[float]:
    """Call from win.start until win.end, back to back (``period`` 0) or once every
    ``period`` seconds starting at ``phase`` (a call that overruns its slot is
    followed at once by the next, with no catching up); latency (s) of each call that
    began after warm-up and finished inside the window. ``after(what call returned)``,
    if given, runs after each call, outside its latency (e.g. a backlog guard)."""
    win.wait_start()
    lat = []
    next_t = win.start + phase
    while True:
        if period:
            d = next_t - now()
            if d > 0:
                time.sleep(d)
        t0 = now()
        if t0 >= win.end:
            break
        out = call()
        t1 = now()
        if t0 >= win.begin and t1 <= win.end:
            lat.append(t1 - t0)
        if after is not None:
            after(out)
        if period:
            next_t = max(next_t + period, now())
    return lat


def window_run(win: Window, call) -> dict:
    """Call back to back from win.start to win.end: the number of calls that finished
    inside the window, and the latency (s) of those that also started inside it."""
    win.wait_start()
    done = 0
    lat = []
    while True:
        t0 = now()
        if t0 >= win.end:
            break
        call()
        t1 = now()
        if win.begin <= t1 <= win.end:
            done += 1
            if t0 >= win.begin:
                lat.append(t1 - t0)
    return {"calls": done, "lat": lat}


def latency_stats(lat_s: list[float]) -> dict:
    """p50/p90/p99/mean/max in ms (numpy percentiles, linear interpolation)."""
    import numpy as np  # here: the rest of this module is standard library only

    if not lat_s:
        return {"n": 0}
    a = np.sort(np.asarray(lat_s)) * 1e3
    return {"n": int(a.size), "p50_ms": float(np.percentile(a, 50)),
            "p90_ms": float(np.percentile(a, 90)), "p99_ms": float(np.percentile(a, 99)),
            "mean_ms": float(a.mean()), "max_ms": float(a[-1])}


# --- seconds per call ---------------------------------------------------------------------
def call_times(fn: Callable[[], object], warmup: int, repeats: int,
               sync: Callable[[], object] | None = None, budget_s: float | None = None,
               min_repeats: int = 5) -> list[float]:
    """Seconds per call, each closed by ``sync()`` (if given) inside a perf_counter
    timer, after ``warmup`` calls and a ``sync``; stops after ``repeats`` calls or once
    ``budget_s`` has passed (after at least ``min_repeats``)."""
    for _ in range(warmup):
        fn()
    if sync is not None:
        sync()
    clock = time.perf_counter
    times = []
    start = clock()
    for i in range(repeats):
        t0 = clock()
        fn()
        if sync is not None:
            sync()
        times.append(clock() - t0)
        if budget_s is not None and i + 1 >= min_repeats and clock() - start > budget_s:
            break
    return times


def call_summary(times: list[float], nbytes: int | None = None) -> dict:
    """Median, p10/p90/p99 (nearest lower rank), min and mean in us; GB/s of the median
    when ``nbytes`` moved per call."""
    ts = sorted(times)
    n = len(ts)
    med = statistics.median(ts)
    out = {"us_median": med * 1e6, "us_p10": ts[int(0.10 * (n - 1))] * 1e6,
           "us_p90": ts[int(0.90 * (n - 1))] * 1e6, "us_p99": ts[int(0.99 * (n - 1))] * 1e6,
           "us_min": ts[0] * 1e6, "us_mean": statistics.fmean(ts) * 1e6, "repeats": n}
    if nbytes is not None:
        out["bytes_per_call"] = nbytes
        out["gbps"] = nbytes / med / 1e9
    return out
