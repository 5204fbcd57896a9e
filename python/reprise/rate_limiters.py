"""Rate limiters: one mechanism with four numbers (Reverb paper, section 3.4).

With ``size`` items, ``inserts``/``samples`` counted since the last reset and
``spi = samples_per_insert``:

- an insert may proceed when ``size + 1 <= min_size_to_sample`` or
  ``(inserts + 1) * spi - samples <= max_diff``;
- a sample may proceed when ``size >= min_size_to_sample`` and
  ``inserts * spi - samples - 1 >= min_diff``.

Blocked callers wait (``timeout=None``), fail at once (``0``) or wait that many
seconds, then raise ``reprise.errors.Timeout``. The presets below only fill in the
numbers; the native core validates them."""

from __future__ import annotations

from . import _native
from ._convert import as_float, as_int


class RateLimiter:
    """The general form: ``RateLimiter(samples_per_insert, min_size_to_sample, min_diff, max_diff)``."""

    def __init__(self, samples_per_insert: float, min_size_to_sample: int, min_diff: float, max_diff: float):
        numbers = _native.rate_limiter_preset(
            "RateLimiter",
            as_float("samples_per_insert", samples_per_insert),
            as_int("min_size_to_sample", min_size_to_sample),
            as_float("min_diff", min_diff),
            as_float("max_diff", max_diff),
        )
        self._set(*numbers)

    def _set(self, samples_per_insert, min_size_to_sample, min_diff, max_diff):
        self.samples_per_insert = samples_per_insert
        self.min_size_to_sample = min_size_to_sample
        self.min_diff = min_diff
        self.max_diff = max_diff

    def _spec(self):
        return (self.samples_per_insert, self.min_size_to_sample, self.min_diff, self.max_diff)

    @classmethod
    def _preset(cls, kind, *args):
        obj = RateLimiter.__new__(cls)
        obj._set(*_native.rate_limiter_preset(kind, *args))
        return obj

    def __repr__(self):
        return (
            f"{type(self).__name__}(samples_per_insert={self.samples_per_insert}, "
            f"min_size_to_sample={self.min_size_to_sample}, min_diff={self.min_diff}, max_diff={self.max_diff})"
        )


class MinSize(RateLimiter):
    """Sampling waits until the table holds ``min_size_to_sample`` items; nothing else."""

    def __new__(cls, min_size_to_sample: int = 1):
        return cls._preset("MinSize", as_int("min_size_to_sample", min_size_to_sample))

    def __init__(self, *args, **kwargs):
        pass


class SampleToInsertRatio(RateLimiter):
    """Keeps samples per insert at ``samples_per_insert``, within ``error_buffer``
    (in samples), once ``min_size_to_sample`` items are in the table."""

    def __new__(cls, samples_per_insert: float, min_size_to_sample: int, error_buffer: float):
        return cls._preset(
            "SampleToInsertRatio",
            as_float("samples_per_insert", samples_per_insert),
            as_int("min_size_to_sample", min_size_to_sample),
            as_float("error_buffer", error_buffer),
        )

    def __init__(self, *args, **kwargs):
        pass


class Queue(RateLimiter):
    """Each item sampled once, at most ``size`` waiting (with Fifo and max_times_sampled=1)."""

    def __new__(cls, size: int):
        return cls._preset("Queue", as_int("size", size))

    def __init__(self, *args, **kwargs):
        pass


class Stack(RateLimiter):
    """Like ``Queue``, for a Lifo table."""

    def __new__(cls, size: int):
        return cls._preset("Stack", as_int("size", size))

    def __init__(self, *args, **kwargs):
        pass


__all__ = ["RateLimiter", "MinSize", "SampleToInsertRatio", "Queue", "Stack"]
