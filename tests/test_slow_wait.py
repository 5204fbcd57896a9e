"""A blocking call that waits long says once, through the `logging` logger "reprise", what the
rate limiter waits for, with the numbers that would unblock it: in-process tables, and the
clients of a local (Unix socket) and a remote (gRPC) server, whose message comes from the
server's own figures. `REPRISE_SLOW_WAIT_SECONDS` sets how long "long" is (5 s by default);
it is read once per process, so each case runs in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent("""
    import logging, sys
    import numpy as np
    import reprise as rp

    mode = sys.argv[1]
    store = rp.Store({"x": rp.Field((), "float32")}, capacity=1024, block_steps=64)
    table = rp.Table("replay", store, rate_limiter=rp.rate_limiters.SampleToInsertRatio(8.0, 10, 8.0))
    server = None
    if mode == "in-process":
        target = table
    else:
        server = rp.Server([table], address="127.0.0.1:0" if mode == "remote" else None)
        target = rp.Client(server.address if mode == "remote" else server.local_address)
    what = sys.argv[2]
    if what == "sample":           # 4 items in a table that needs 10 before the first sample
        table.insert({"x": np.zeros((4, 1), np.float32)}, priorities=1.0)
        try:
            target.sample("replay", 2, timeout=1.5) if mode != "in-process" else target.sample(2, timeout=1.5)
        except rp.errors.Timeout:
            print("timed out", flush=True)
    else:                          # 11 items are allowed before any sample; 20 are written
        w = target.writer("replay") if mode != "in-process" else store.writer()
        for i in range(20):
            w.append({"x": float(i)})
            w.create_item("replay" if mode != "in-process" else table, 1, 1.0)
        try:
            w.flush(timeout=1.5) if mode != "in-process" else None
        except rp.errors.Timeout:
            print("timed out", flush=True)
    if server is not None:
        server.stop()
    store.close()
""")


def run(mode: str, what: str, seconds: str = "0.4", timeout_in_process: bool = False) -> subprocess.CompletedProcess:
    env = dict(os.environ, REPRISE_SLOW_WAIT_SECONDS=seconds)
    return subprocess.run([sys.executable, "-c", SCRIPT, mode, what], capture_output=True, text=True, timeout=120, env=env)


@pytest.mark.parametrize("mode", ["in-process", "local", "remote"])
def test_a_sample_that_waits_long_says_the_table_needs_more_items(mode):
    r = run(mode, "sample")
    assert r.returncode == 0, r.stderr
    assert "timed out" in r.stdout
    why = "sampling waits until the table holds min_size_to_sample = 10 items; it holds 4 (4 inserted so far)"
    # The table itself says it (in-process, or in the server's process) ...
    table_lines = [line for line in r.stderr.splitlines() if "table 'replay': a sample of 2 items has waited" in line]
    assert len(table_lines) == 1 and why in table_lines[0], r.stderr
    if mode != "in-process":
        # ... and the client, from the server's figures, naming the server.
        client_lines = [line for line in r.stderr.splitlines() if line.startswith("sample has waited")]
        assert len(client_lines) == 1, r.stderr
        assert "for the replay server at " + ("127.0.0.1:" if mode == "remote" else "unix://") in client_lines[0]
        assert why in client_lines[0], r.stderr


@pytest.mark.parametrize("mode", ["local", "remote"])
def test_a_flush_that_waits_long_says_inserts_wait_for_samples(mode):
    r = run(mode, "flush")
    assert r.returncode == 0, r.stderr
    assert "timed out" in r.stdout
    # 20 inserts at 8 samples per insert with max_diff = 8 * 10 + 8 = 88: the 12th insert needs
    # 12 * 8 - 88 = 8 samples.
    client = [line for line in r.stderr.splitlines() if line.startswith(("flush has waited", "a writer's commit has waited"))]
    assert len(client) >= 1, r.stderr
    assert ("table 'replay': inserts wait for samples: with samples_per_insert = 8 the next insert needs 8 more "
            "samples (11 inserts and 0 samples so far, 11 items in the table)") in client[0], r.stderr


def test_an_in_process_writer_blocked_in_create_item_says_it_once():
    script = SCRIPT.replace("w.flush(timeout=1.5) if mode != \"in-process\" else None", "pass")
    script = script.replace('w.create_item("replay" if mode != "in-process" else table, 1, 1.0)',
                            'w.create_item(table, 1, 1.0, timeout=1.5) if i < 12 else None')
    env = dict(os.environ, REPRISE_SLOW_WAIT_SECONDS="0.4")
    r = subprocess.run([sys.executable, "-c", script, "in-process", "flush"], capture_output=True, text=True,
                       timeout=120, env=env)
    assert "Timeout" in r.stderr or r.returncode == 0, r.stderr
    lines = [line for line in r.stderr.splitlines() if "table 'replay': an insert of 1 item has waited" in line]
    assert len(lines) == 1, r.stderr
    assert "the next insert needs 8 more samples" in lines[0]


def test_zero_turns_the_message_off():
    r = run("in-process", "sample", seconds="0")
    assert r.returncode == 0 and "timed out" in r.stdout
    assert "has waited" not in r.stderr, r.stderr
