"""``Table.iterate``: batches collected ahead on a side stream.

Batch i+1 .. i+k are gathered on a side stream while the caller uses batch i on
its current stream. Before a batch is handed out, the current stream waits for
the event recorded after its gather (the caller never sees a half-written batch)
and its tensors are marked as used on the current stream (so the caching
allocator does not give their memory to the next side-stream gather while the
caller's kernels may still read it). Priority updates for batch i go to the
host table at once; batches already in flight were drawn before them. When a
draw fails (a timeout), the batches drawn before it are yielded first, then the
error is raised (its ``partial`` holds what that draw got).
"""

from __future__ import annotations

from collections import deque

from ._device import current_stream, new_event, new_stream, use_stream


def iterate(draw, device, prefetch: int, num_batches: int | None):
    """Yields ``draw(stream)`` results (Samples of device tensors), ``prefetch`` ahead."""
    side = new_stream(device)
    inflight: deque = deque()
    launched = 0

    def launch():
        nonlocal launched
        side.wait_stream(current_stream(device))
        with use_stream(side):
            sample = draw(side)
            ready = new_event(device)
            ready.record(side)
        inflight.append((sample, ready))
        launched += 1

    produced = 0
    failed = None  # a draw's error, raised once the batches already in flight are out
    while num_batches is None or produced < num_batches:
        while failed is None and len(inflight) < prefetch + 1 and (num_batches is None or launched < num_batches):
            try:
                launch()
            except Exception as e:  # noqa: BLE001 - re-raised below, after the batches drawn before it
                failed = e
        if not inflight:
            break
        sample, ready = inflight.popleft()
        cur = current_stream(device)
        cur.wait_event(ready)
        if device.type == "cuda":
            for t in sample.data.values():
                t.record_stream(cur)
        produced += 1
        yield sample
    if failed is not None:
        raise failed
