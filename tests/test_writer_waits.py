"""Every wait of a writer gives up on Ctrl-C (a real SIGINT) within about 50 ms and
honours its timeout, for in-process, local and remote writers, with the table's rate
limiter holding the writer's items back; leaving a `with` block on an exception waits
for nothing; what was committed stays. (Issue 30: a writer that hung for ever.)"""

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

import reprise as rp
from reprise.errors import InvalidArgument, Timeout
from reprise.rate_limiters import Queue
from reprise.selectors import Fifo

WORKER = os.path.join(os.path.dirname(__file__), "writer_waits_worker.py")
QUEUE = 10

# (kind, the call that waits). In process only create_item waits (on the limiter);
# flush and close return at once there (tested below).
WAITS = [("in_process", "create_item")] + [
    (kind, wait) for kind in ("local", "remote") for wait in ("append", "create_item", "end_episode", "flush", "close", "exit")
]


def run_worker(kind: str, wait: str, how: str) -> dict:
    proc = subprocess.run([sys.executable, WORKER, kind, wait, how], capture_output=True, text=True, timeout=90,
                          env={**os.environ, "REPRISE_SLOW_WAIT_SECONDS": "0"})
    assert proc.returncode == 0, f"worker failed:\n{proc.stdout}\n{proc.stderr}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("kind,wait", WAITS)
def test_ctrl_c_stops_every_writer_wait_at_once(kind, wait):
    out = run_worker(kind, wait, "sigint")
    assert out["raised"] == "KeyboardInterrupt", out
    # ~1–50 ms here; generous for a loaded CI machine, far below "for ever".
    assert out["ms"] < 1000, out
    assert out["size"] == QUEUE and out["intact"], f"committed items were lost or damaged: {out}"


@pytest.mark.parametrize("kind,wait", WAITS)
def test_every_writer_wait_honours_its_timeout(kind, wait):
    out = run_worker(kind, wait, "timeout")
    assert out["raised"] is not None and out["raised"].startswith("Timeout"), out
    assert 250 <= out["ms"] < 5000, out
    assert out["size"] == QUEUE and out["intact"], f"committed items were lost or damaged: {out}"


def queue_table(block_steps=4096):
    store = rp.Store({"obs": rp.Field((4,), "float32")}, capacity=2 * block_steps, block_steps=block_steps)
    table = rp.Table("q", store, sampler=Fifo(), remover=Fifo(), max_size=QUEUE, rate_limiter=Queue(QUEUE),
                     max_times_sampled=1, evict_when_store_full=False)
    return store, table


@pytest.fixture(params=["local", "remote"])
def served(request):
    store, table = queue_table()
    server = rp.Server([table], address="127.0.0.1:0" if request.param == "remote" else None)
    client = rp.Client(server.address if request.param == "remote" else server.local_address)
    yield store, table, client
    client.close()
    server.stop()


STEP = {"obs": np.zeros(4, np.float32)}


def test_leaving_a_with_block_on_an_error_waits_for_nothing_and_reraises(served):
    store, table, client = served
    t0 = time.monotonic()
    with pytest.raises(Timeout, match="not all committed"):
        with client.writer("q") as w:
            for _ in range(3 * QUEUE):
                w.append(STEP)
                w.create_item("q", 1, 1.0)
            w.flush(timeout=0.3)
    assert time.monotonic() - t0 < 5, "leaving the block waited for the limiter"
    time.sleep(0.3)  # the server notices the abort within its 50 ms poll
    assert table.size == QUEUE
    # The server let go of the aborted writer: its uncommitted items never appear,
    # and a later writer's items go in once there is room.
    table.sample(QUEUE, timeout=5)
    with client.writer("q") as w:
        w.append(STEP)
        w.create_item("q", 1, 1.0)
        w.flush(timeout=10)
    assert table.size == 1


def writer_past_the_limit(client):
    """A writer of twice what the queue takes, flushed with a timeout: QUEUE items
    committed, the rest waiting on the server's limiter."""
    w = client.writer("q")
    for _ in range(2 * QUEUE):
        w.append(STEP)
        w.create_item("q", 1, 1.0)
    with pytest.raises(Timeout):
        w.flush(timeout=0.2)
    return w


def test_a_flush_that_times_out_leaves_the_writer_usable(served):
    store, table, client = served
    w = writer_past_the_limit(client)
    assert table.size == QUEUE
    table.sample(QUEUE, timeout=5)  # room for the rest
    w.flush(timeout=10)
    assert table.size == QUEUE, "the items queued before the timeout were lost"
    w.close(timeout=10)


def test_abort_drops_what_is_not_committed_and_returns_the_writers_blocks(served):
    store, table, client = served
    w = writer_past_the_limit(client)  # sent: QUEUE committed, the rest wait on the limiter
    free = store.free_blocks
    w.abort()
    w.abort()  # idempotent
    with pytest.raises(InvalidArgument, match="closed"):
        w.append(STEP)
    time.sleep(0.3)  # the server notices the abort within its 50 ms poll
    assert table.size == QUEUE, "committed items were lost"
    table.sample(QUEUE, timeout=5)  # room: an item still waiting on the server would go in now
    time.sleep(0.5)
    assert table.size == 0, "the aborted writer's uncommitted items were committed after its abort"
    deadline = time.monotonic() + 10
    while store.free_blocks <= free and time.monotonic() < deadline:
        time.sleep(0.02)
    assert store.free_blocks == 2, "the aborted writer's block did not return to the store"


def test_a_bad_timeout_is_refused_and_changes_nothing(served):
    store, table, client = served
    with client.writer("q") as w:
        w.append(STEP)
        for call in (lambda: w.append(STEP, timeout=-1), lambda: w.extend({"obs": np.zeros((2, 4), np.float32)}, timeout=float("nan")),
                     lambda: w.end_episode(timeout=-0.5), lambda: w.flush(timeout=-1), lambda: w.close(timeout=-1)):
            with pytest.raises(InvalidArgument, match="timeout must be None or seconds >= 0"):
                call()
        assert w.episode_steps == 1
        w.create_item("q", 1, 1.0)
    assert table.size == 1


def test_in_process_writers_never_wait_to_flush_close_or_leave():
    store, table = queue_table()
    t0 = time.monotonic()
    with pytest.raises(Timeout):
        with store.writer() as w:
            for _ in range(QUEUE + 1):
                w.append(STEP)
                w.create_item(table, 1, 1.0, timeout=0.2)
    assert time.monotonic() - t0 < 5
    assert table.size == QUEUE
    w2 = store.writer()
    w2.append(STEP)
    w2.flush(timeout=0)
    w2.close(timeout=0)
    w2.abort()
