"""Throughput while a checkpoint is written (part 2 of the checkpoint benchmark), shared by
Reprise's side (``measure.py``) and Reverb's (``peers/reverb_checkpoint.py``; numpy and the
standard library only, so the reverb venv imports it).

:class:`Load` runs a writer and a sampler in two threads, each recording (time, cumulative
items) after every call; :func:`compare_windows` reads items/s off those marks in a window
without a checkpoint and in the checkpoint's span, their ratio, and the longest pause.
"""

from __future__ import annotations

import threading
import time
from typing import Callable

import numpy as np

Marks = list[tuple[float, int]]


class Load:
    """``write()`` and ``sample()`` (each returns the items it wrote or drew; 0: nothing this
    time) called in two threads until :meth:`stop`; ``w_marks`` / ``s_marks`` get (time,
    cumulative items) after every call that did something; ``errors``, what ended a thread."""

    def __init__(self, write: Callable[[], int], sample: Callable[[], int]) -> None:
        self.stop_flag = threading.Event()
        start = time.perf_counter()
        self.w_marks: Marks = [(start, 0)]
        self.s_marks: Marks = [(start, 0)]
        self.errors: list[str] = []
        self.threads = [threading.Thread(target=self._loop, args=("writer", write, self.w_marks), daemon=True),
                        threading.Thread(target=self._loop, args=("sampler", sample, self.s_marks),
                                         daemon=True)]
        for t in self.threads:
            t.start()

    def _loop(self, name: str, call: Callable[[], int], marks: Marks) -> None:
        n = 0
        try:
            while not self.stop_flag.is_set():
                k = call()
                if k:
                    n += k
                    marks.append((time.perf_counter(), n))
        except Exception as e:  # noqa: BLE001 - recorded, the other thread goes on
            self.errors.append(f"{name}: {type(e).__name__}: {e}")

    def stop(self) -> None:
        self.stop_flag.set()
        for t in self.threads:
            t.join(timeout=60)


def count_at(marks: Marks, t: float) -> int:
    i = np.searchsorted(np.fromiter((m[0] for m in marks), float, len(marks)), t, side="right")
    return marks[i - 1][1] if i else 0


def rate(marks: Marks, t0: float, t1: float) -> float:
    """Items/s between t0 and t1."""
    return (count_at(marks, t1) - count_at(marks, t0)) / (t1 - t0) if t1 > t0 else 0.0


def max_gap(marks: Marks, t0: float, t1: float) -> float:
    """The longest time between t0 and t1 without a call ending."""
    ts = [t0] + [t for t, _ in marks if t0 < t < t1] + [t1]
    return max(b - a for a, b in zip(ts, ts[1:]))


def compare_windows(load: Load, without: tuple[float, float], during: tuple[float, float]) -> dict:
    """Per thread (writer, sampler): items/s ``without`` a checkpoint and ``during`` one (each
    a (t0, t1) span), during / without, and the longest pause during."""
    e = {}
    for k, marks in (("writer", load.w_marks), ("sampler", load.s_marks)):
        wo, du_ = rate(marks, *without), rate(marks, *during)
        e[f"{k}_items_per_s_without"] = wo
        e[f"{k}_items_per_s_during"] = du_
        e[f"{k}_ratio"] = du_ / wo if wo else None
        e[f"{k}_longest_gap_during_s"] = max_gap(marks, *during)
    return e
