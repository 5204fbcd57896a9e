"""Static samples: a fixed-size device-resident sample whose gather a CUDA graph
can capture, so that a training step that samples is itself one graph replay.

A graph replays fixed kernels on fixed buffers; a table's draw waits on its rate
limiter and reads a mirror that changes. So a ``StaticSample`` splits a sample in
two:

* ``admit()``, on the host, outside the graph: the rate limiter admits
  ``batch_size`` draws, the mirror takes the table's changes and draws them on the
  device (``ResidentSelection.select``), and the draws' metadata and row numbers are
  written into the static buffers, all on the current stream;
* ``draw()``, capturable: the gathers of the static row numbers into the fields'
  tensors. The tensors ``draw()`` returns while a graph is captured are that
  graph's outputs, refreshed by every replay.

Every replay must follow one ``admit()`` on the same stream (the graph's); the rows
an admission drew stay reserved until the work queued on that stream before the
next ``admit()`` (or ``close()``) has finished, so an item evicted meanwhile is
never overwritten under a replay that reads it. Items are ``[batch_size, steps]``,
zero past each item's end; a table holding an item longer than ``steps`` refuses
the admission (and changes nothing).
"""

from __future__ import annotations

from ..errors import InvalidArgument
from ..sample import Sample
from ._device import current_stream, torch_module, use_stream
from .collect import RELEASER, gather, release_after


class StaticSample:
    """``batch_size`` draws of at most ``steps`` steps from a device-resident table
    into fixed device buffers (``Table.static_sample``).

    ``keys`` (uint64), ``probabilities``, ``priorities`` (float64),
    ``times_sampled`` and ``lengths`` (int64) are device tensors of the latest
    admission, rewritten in place by each; ``table_size`` is its table size."""

    def __init__(self, table_name: str, selection, columns, names: list, batch_size: int, steps: int):
        torch = torch_module()
        self.table_name, self.batch_size, self.steps, self.fields = table_name, batch_size, steps, list(names)
        self._sel, self._columns = selection, columns
        dev = selection.device
        self._meta = torch.zeros((5, batch_size), dtype=torch.int64, device=dev)
        self.keys = self._meta[0].view(torch.uint64)
        self.probabilities = self._meta[1].view(torch.float64)
        self.priorities = self._meta[2].view(torch.float64)
        self.times_sampled, self.lengths = self._meta[3], self._meta[4]
        self.table_size = 0
        self._idx = torch.full((batch_size * steps,), -1, dtype=torch.int64, device=columns.device)
        self._held = None  # the latest admission's rows
        self._admissions = 0
        self._closed = False
        # Every row number -1: a gather that reads nothing, and builds (and compiles)
        # whatever it will use before anyone captures it.
        self._gather()

    def admit(self, timeout: float | None = None) -> "StaticSample":
        """Draws the next ``batch_size`` items into the buffers (outside the graph),
        waiting on the rate limiter up to ``timeout``. On ``Timeout`` (or an
        interrupt) after some draws, the error's ``partial`` is an ordinary Sample
        of them and the buffers keep the previous admission."""
        if self._closed:
            raise InvalidArgument(f"static sample of table '{self.table_name}': admit() after close()")
        sel, t = self._sel, self.steps
        with sel.lock:
            a = sel.admit(self.batch_size, timeout, t)
            if a.stopped is not None:  # fewer than batch_size: an ordinary sample of them, the buffers untouched
                a.stopped.partial = sel.draw_admitted(a, self._columns, self.fields, None)
                raise a.stopped
            try:
                stream = current_stream(sel.device)
                with use_stream(stream):
                    self._release(stream)
                    self._columns.wait_for_writes(stream)
                    slots, meta, idx = sel.select(a, t)
                    if idx is None:
                        idx = sel.rows(slots, t)
                    self._meta.copy_(meta)
                    self._idx.copy_(idx.reshape(-1))
            except BaseException:
                a.rows.release()
                raise
        self._held, self.table_size = a.rows, int(a.table_size)
        self._admissions += 1
        return self

    def draw(self) -> Sample:
        """The gathers of the admitted rows into the fields' ``[batch_size, steps,
        *shape]`` tensors, on the current stream; capturable by a CUDA graph."""
        if self._admissions == 0:
            raise InvalidArgument(f"static sample of table '{self.table_name}': draw() before any admit(); "
                                  f"admit() draws the items, draw() gathers them")
        return Sample(keys=self.keys, probabilities=self.probabilities, priorities=self.priorities,
                      times_sampled=self.times_sampled, table_size=self.table_size, lengths=self.lengths,
                      data=self._gather())

    def _gather(self) -> dict:
        return gather(self._columns, self.fields, self._idx, self.batch_size, self.steps, True)

    def _release(self, stream):
        """Lets the latest admission's rows go once ``stream``'s work so far is done."""
        if self._held is not None:
            event = RELEASER.event(self._columns.device)
            event.record(stream)
            release_after(self._held, event, self._columns.device)
            self._held = None

    def close(self):
        """Lets the latest admission's rows go once the current stream's work is
        done; the sample cannot admit again."""
        if not self._closed:
            self._closed = True
            with self._sel.lock:
                self._release(current_stream(self._sel.device))

    def __enter__(self) -> "StaticSample":
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return (f"StaticSample(table={self.table_name!r}, batch_size={self.batch_size}, steps={self.steps}, "
                f"fields={self.fields})")
