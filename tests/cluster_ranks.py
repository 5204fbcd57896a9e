"""Cluster-mode tests' ranks: ``reprise.distributed.local_ranks.run_ranks`` with a
30 s collective timeout and a 55 s deadline per run (a test stays under 60 s)."""

from __future__ import annotations

from reprise.distributed.local_ranks import run_ranks as _run_ranks


def run_ranks(world: int, fn, *args, deadline: float = 55.0, **kw):
    return _run_ranks(world, fn, *args, deadline=deadline, timeout=30.0, **kw)
