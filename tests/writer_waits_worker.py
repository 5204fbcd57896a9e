"""A process that blocks one writer in one kind of wait, against a rate limiter that
holds its items back, and reports how it got out (run by test_writer_waits.py).

    python tests/writer_waits_worker.py KIND WAIT HOW

KIND: in_process | local | remote. WAIT: the call that waits (append, create_item,
end_episode, flush, close, exit — leaving a `with` block). HOW: sigint (a real
SIGINT to this process once the writer waits) or timeout (the call's own timeout).
Prints one JSON line: what was raised, how long after the signal or the call's
start, and the table's size then and after a settling pause (nothing committed is
lost). Every wait here is bounded: a writer that does not give up is killed by the
test's own timeout.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time

import numpy as np

import reprise as rp
from reprise.rate_limiters import Queue
from reprise.selectors import Fifo

QUEUE = 10           # items the table takes before inserts wait
TIMEOUT = 0.3        # the call's timeout, for HOW=timeout


def scenario(kind: str, wait: str):
    """A table whose inserts block after QUEUE items, a writer of KIND, and the
    step size and block size that make WAIT the call that blocks."""
    # Remote appends wait only once the stream is full: big steps fill it quickly.
    width = 4096 if kind == "remote" and wait in {"append", "create_item", "end_episode"} else 4
    # A local writer's append waits only when it needs a new block: small blocks
    # for that wait, and blocks big enough that no other call leases one.
    block_steps = 16 if wait == "append" or width > 4 else 4096
    store = rp.Store({"obs": rp.Field((width,), "float32")}, capacity=8 * block_steps if width == 4 else 4096,
                     block_steps=block_steps)
    table = rp.Table("q", store, sampler=Fifo(), remover=Fifo(), max_size=QUEUE, rate_limiter=Queue(QUEUE),
                     max_times_sampled=1, evict_when_store_full=False)
    if kind == "in_process":
        return store, table, None, store.writer(max_sequence_length=1), width
    server = rp.Server([table], address="127.0.0.1:0" if kind == "remote" else None)
    client = rp.Client(server.address if kind == "remote" else server.local_address)
    return store, table, server, client.writer("q", max_sequence_length=1), width


def fill_stream(w, step) -> None:
    """A remote writer: items the table cannot take, then steps until the insert
    stream has no room (the server waits on the first item it cannot insert)."""
    for _ in range(QUEUE + 1):
        w.append(step)
        w.create_item("q", 1, 1.0)
    for _ in range(100_000):
        try:
            w.append(step, timeout=0.05)
        except rp.errors.Timeout:
            return
    raise AssertionError("the insert stream never filled")


def drive(w, wait: str, width: int, timeout):
    """Writes until the call named `wait` blocks (and raises)."""
    step = {"obs": np.zeros(width, np.float32)}
    t = timeout if wait in {"append", "create_item", "end_episode"} else None
    if width > 4 and wait == "create_item":
        fill_stream(w, step)
        for _ in range(10_000):  # a message of create_items goes out every 1024
            w.create_item("q", 1, 1.0, timeout=t)
        raise AssertionError("create_item did not block")
    for i in range(200_000):
        w.append(step, timeout=t)
        if wait != "append" or i < 4 * QUEUE:
            w.create_item("q", 1, 1.0, timeout=t)
        if wait == "end_episode":
            w.end_episode(timeout=t)
        if wait in {"flush", "close", "exit"} and i == 4 * QUEUE:
            break
    if wait == "flush":
        w.flush(timeout=timeout)
    elif wait == "close":
        w.close(timeout=timeout)
    elif wait == "exit":
        return  # leaving the `with` block closes the writer: that waits
    raise AssertionError(f"{wait} did not block")


def main(kind: str, wait: str, how: str) -> None:
    # Python's own Ctrl-C handler, whatever this process inherited (a shell's background
    # job starts with SIGINT ignored, and the test is about a program that gets it).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    store, table, server, w, width = scenario(kind, wait)
    fired: list[float] = []
    if how == "sigint":
        def fire():
            # Wait until the writer is blocked: the table is full and stays so.
            deadline = time.monotonic() + 20
            while table.size < QUEUE and time.monotonic() < deadline:
                time.sleep(0.01)
            time.sleep(0.5)
            fired.append(time.monotonic())
            os.kill(os.getpid(), signal.SIGINT)
        threading.Thread(target=fire, daemon=True).start()
    start = time.monotonic()
    raised = None
    try:
        if wait == "exit":
            # The pattern of docs/remote.md: a flush that times out inside the block,
            # or (sigint) the close on leaving it, which waits for the limiter.
            with w:
                drive(w, "exit" if how == "sigint" else "flush", width, TIMEOUT)
        else:
            drive(w, wait, width, TIMEOUT if how == "timeout" else None)
    except KeyboardInterrupt:
        raised = "KeyboardInterrupt"
    except rp.errors.Timeout as e:
        raised = f"Timeout: {e}"
    after = (time.monotonic() - (fired[0] if fired else start)) * 1000
    w.abort()
    time.sleep(0.5)  # anything still arriving would show now
    size = table.size
    # Committed items stay, whole, and can be drawn; the aborted writer's blocks return.
    sample = table.sample(size, timeout=5) if size else None
    intact = sample is not None and bool((sample.data["obs"] == 0).all())
    del sample
    out = {"raised": raised, "ms": round(after, 1), "size": size, "intact": intact}
    if server is not None:
        server.stop()
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:4])
