"""A wait that nothing could ever end fails at once instead of hanging (issue 33): in a
process with one Python thread, a table that no server serves cannot gain items (or
lose them) while that thread waits on it, so sampling an empty table, inserting into
a full queue or creating an item there with ``timeout=None`` raises ``Timeout`` saying
so. With another thread, a server, or a timeout of its own, the wait is the usual one.
Each case runs in a fresh process: pytest's own process may have other threads."""

import subprocess
import sys
import textwrap

import pytest

PRELUDE = """
import threading, time
import numpy as np
import reprise as rp
store = rp.Store({"x": rp.Field((), "int64")}, capacity=256, block_steps=8)
t0 = time.monotonic()
def report(e):
    print(f"{type(e).__name__} {time.monotonic() - t0:.2f}s {e}")
"""

CASES = {
    "empty sample": """
t = rp.Table("t", store)
try:
    t.sample(1)
except rp.errors.Timeout as e:
    report(e)
""",
    "full queue insert": """
q = rp.Table.queue("q", store, max_size=2)
q.insert({"x": np.zeros((2, 1), np.int64)}, priorities=1.0)
try:
    q.insert({"x": np.zeros((1, 1), np.int64)}, priorities=1.0)
except rp.errors.Timeout as e:
    report(e)
""",
    "full queue create_item": """
q = rp.Table.queue("q", store, max_size=2)
w = store.writer()
try:
    for i in range(3):
        w.append({"x": i})
        w.create_item("q", 1, 1.0)
except rp.errors.Timeout as e:
    report(e)
""",
}


def run(code: str) -> str:
    r = subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(code)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_wait_nothing_could_end_fails_at_once_and_says_why(case):
    out = run(CASES[case])
    kind, seconds, message = out.split(" ", 2)
    assert kind == "Timeout", out
    assert float(seconds[:-1]) < 5, out
    assert "would wait for ever" in message and "this is the only Python thread and no server serves it" in message, out
    assert "flushing" not in message and "is a learner" not in message, "the hint for other processes is meaningless here"


def test_with_another_thread_the_wait_is_the_usual_one():
    out = run("""
t = rp.Table("t", store)
def later():
    time.sleep(0.4)
    w = store.writer()
    w.append({"x": 7})
    w.create_item(t, 1, 1.0)
threading.Thread(target=later).start()
print(int(t.sample(1).data["x"][0, 0]))
""")
    assert out == "7"


def test_a_served_table_waits_for_its_timeout():
    out = run("""
t = rp.Table("t", store)
server = rp.Server([t])
try:
    t.sample(1, timeout=0.5)
except rp.errors.Timeout as e:
    report(e)
server.stop()
""")
    kind, seconds, message = out.split(" ", 2)
    assert kind == "Timeout" and float(seconds[:-1]) >= 0.45 and "would wait for ever" not in message, out
