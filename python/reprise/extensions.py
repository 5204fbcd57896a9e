"""Table extensions: built-in observers of a table's inserts, draws, priority
updates and removals, whose figures ``Table.stats()`` returns (Reverb's
``TableExtension`` model, with the observers in Rust so that the hot path never
calls Python).

A table gets every built-in by default (``extensions=None``); pass a list to
choose or configure them, or ``[]`` for none::

    from reprise import extensions as ext
    rp.Table("replay", store, extensions=[ext.PriorityHistogram(), ext.UniqueSamples(window=1000)])

Each runs under the table's lock, called directly for every insert, draw, update
and removal. All five together cost about 4-7% of the throughput of inserts and
11-15% of draws (``SampledAge`` most; ``benchmarks/extensions_overhead.py``,
figures in ``benchmarks/RESULTS.md``): attach fewer where draws must be fastest.
Checkpoints keep every extension's state. Histograms are dicts
``{"bounds": [...], "counts": [...], "total": n}``: bucket i is
``[bounds[i], bounds[i+1])``, power-of-two buckets, listed from the first to the
last non-empty one.
"""

from __future__ import annotations

import json

from ._convert import as_int
from .errors import InvalidArgument

__all__ = ["Extension", "PriorityHistogram", "SampledAge", "TimesSampled", "UniqueSamples", "Rates", "BUILT_INS",
           "defaults"]


class Extension:
    """A built-in extension (the classes below); its settings are checked when made."""

    kind = ""

    def _spec(self) -> dict:
        return {"kind": self.kind}

    def __repr__(self) -> str:
        settings = ", ".join(f"{k}={v}" for k, v in self._spec().items() if k != "kind")
        return f"{type(self).__name__}({settings})"

    def __eq__(self, other) -> bool:
        return isinstance(other, Extension) and self._spec() == other._spec()

    def __hash__(self) -> int:
        return hash(json.dumps(self._spec(), sort_keys=True))


class PriorityHistogram(Extension):
    """``stats()["priority_histogram"]``: the priorities of the items in the table,
    in buckets ``[0, 2^-64)`` then ``[2^e, 2^(e+1))``."""

    kind = "priority_histogram"


class SampledAge(Extension):
    """``stats()["sampled_age"]``: how old each drawn item was, in inserts (items
    inserted after it; 0 is the newest) and in seconds, as histograms over every
    draw since the table was made, with ``count``, ``mean_inserts`` and
    ``mean_seconds``. Keeps no data per item: insertion times come from a list
    of (insertion number, clock tick) marks, exact for recent items and, for old
    ones, never later than the insert (the clock ticks in milliseconds)."""

    kind = "sampled_age"


class TimesSampled(Extension):
    """``stats()["times_sampled"]``: how often the items in the table have been
    sampled, in buckets never, once, 2-3, 4-7, ..."""

    kind = "times_sampled"


class UniqueSamples(Extension):
    """``stats()["unique_samples"]``: distinct items / ``window`` in the last
    complete window of ``window`` consecutive draws (``fraction``; None before the
    first window completes), with the window being filled (``current`` distinct in
    ``current_draws``). Uses a word of each table slot that was padding."""

    kind = "unique_samples"

    def __init__(self, window: int = 10_000):
        self.window = as_int("UniqueSamples window", window, minimum=1)

    def _spec(self) -> dict:
        return {"kind": self.kind, "window": self.window}


class Rates(Extension):
    """``stats()["rates"]``: items inserted and drawn in each of the last ``seconds``
    seconds (oldest first, the current second last) and ``insert_rate`` /
    ``sample_rate`` in items/s over the last 10 complete seconds (over fewer while
    the table is younger; in its first second, the items so far over the time
    elapsed, at least 0.1 s)."""

    kind = "rates"

    def __init__(self, seconds: int = 60):
        self.seconds = as_int("Rates seconds", seconds, minimum=1)
        if self.seconds > 86_400:
            raise InvalidArgument(f"Rates seconds must be 1 to 86400, got {self.seconds}")

    def _spec(self) -> dict:
        return {"kind": self.kind, "seconds": self.seconds}


BUILT_INS = (PriorityHistogram, SampledAge, TimesSampled, UniqueSamples, Rates)


def defaults() -> list[Extension]:
    """Every built-in with its default settings (what a table gets unless told)."""
    return [c() for c in BUILT_INS]


def _from_spec(spec: dict) -> Extension:
    kinds = {c.kind: c for c in BUILT_INS}
    settings = {k: v for k, v in spec.items() if k != "kind"}
    return kinds[spec["kind"]](**settings)


def _specs_json(table: str, extensions) -> str | None:
    """The native table's ``extensions`` argument: None for the defaults, else a
    JSON list. Anything but a list of extensions is refused, naming the table."""
    if extensions is None:
        return None
    if isinstance(extensions, (str, bytes, dict)) or not hasattr(extensions, "__iter__"):
        raise InvalidArgument(f"table '{table}': extensions must be a list of reprise.extensions objects "
                              f"(or None for every built-in), got {extensions!r}")
    extensions = list(extensions)
    for e in extensions:
        if not isinstance(e, Extension):
            raise InvalidArgument(f"table '{table}': extensions must be reprise.extensions objects "
                                  f"such as PriorityHistogram(), got {e!r}")
    return json.dumps([e._spec() for e in extensions])
