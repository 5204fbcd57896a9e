"""Functions that processes spawned by test_async_rl.py run (importable: tests/ is
on sys.path, and spawned children get the parent's sys.path). Every wait here is
bounded, so a child never outlives its test by long."""

from __future__ import annotations

import numpy as np

import reprise as rp


def write_groups(address: str, table: str, worker: int, groups: int, group_size: int, out) -> None:
    """Writes ``groups`` groups of ``group_size`` one-step items through a client,
    each tagged with the table's version as this worker last read it (some late:
    the version moves while it writes), members interleaved across two groups at a
    time. Puts ``(items written, keys committed)`` on ``out``."""
    written, committed = 0, []
    with rp.Client(address) as c:
        with c.writer(table) as w:
            for g in range(0, groups, 2):
                version = c.info()[table]["version"]
                ids = [worker * 1_000_000 + g + k for k in range(min(2, groups - g))]
                for _ in range(group_size):
                    for gid in ids:
                        w.append({"token": np.int32(gid % 1000), "logprob": np.float32(0), "mask": True})
                        w.create_item(table, num_steps=1, priority=1.0,
                                      attributes={"version": version, "reward": 0.0, "group": gid})
                        written += 1
                w.flush(timeout=30)
    out.put(written)
