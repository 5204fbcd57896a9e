"""What the Reverb scripts (``reverb_core.py``, ``reverb_serving.py``, ``reverb_remote.py``,
``reverb_checkpoint.py``) share: the server process, one ``reverb.Server`` holding every
table, in its own process (the calling module started with ``--serve SPECS`` through
:class:`~benchmarks.common.processes.ServerProcess`), reached over loopback gRPC; and the
write paths for one-step items (:func:`structured_writer`, :func:`step_writer`). Run with
the reverb venv's python.

A table spec is a dict: ``name``, ``sampler`` ("uniform" or "prioritized", then
``exponent``), ``max_size`` and ``fields`` ({field: [shape, tf dtype name]}); every
table evicts FIFO and has a ``MinSize(1)`` rate limiter.
"""

from __future__ import annotations

import json

from benchmarks.common.processes import ServerProcess, ready_until_stdin_closes

__all__ = ["ServerProcess", "serve", "step_writer", "structured_writer", "x_table"]


def x_table(name: str, floats: int, items: int) -> dict:
    """Spec of a uniform table of one-step items with one float32[1, floats] field."""
    return {"name": name, "sampler": "uniform", "max_size": items,
            "fields": {"x": [[1, floats], "float32"]}}


def structured_writer(client, table: str, priorities: list[float] | None = None):
    """Reverb's fastest write path for one-step items of field ``x``: a ``StructuredWriter``
    whose items are made in C++ from an ``x[-1:]`` pattern, priority 1; with
    ``priorities``, one config per value, applied round-robin over steps (its priorities
    are per config)."""
    from reverb import structured_writer as sw
    pattern = sw.pattern_from_transform({"x": None}, lambda ref: {"x": ref["x"][-1:]})
    if priorities is None:
        configs = [sw.create_config(pattern, table=table, priority=sw.constant_priority_fn(1.0))]
    else:
        n = len(priorities)
        configs = [sw.create_config(pattern, table=table,
                                    conditions=[sw.Condition.step_index() % n == j],
                                    priority=sw.constant_priority_fn(float(p)))
                   for j, p in enumerate(priorities)]
    return client.structured_writer(configs)


def step_writer(client, table: str, path: str = "structured", priorities: list[float] | None = None,
                keep_alive: int = 1):
    """(append(step), flush(**kw), close) of one-step items of field ``x`` into ``table``:
    ``path`` "structured" (:func:`structured_writer`) or "trajectory" (``TrajectoryWriter``
    with ``keep_alive`` refs: ``append`` + ``create_item``, priority 1, per step)."""
    if path == "trajectory":
        w = client.trajectory_writer(num_keep_alive_refs=keep_alive)

        def append(step: dict) -> None:
            w.append(step)
            w.create_item(table, priority=1.0, trajectory={"x": w.history["x"][-1:]})
        return append, w.flush, w.close
    w = structured_writer(client, table, priorities)
    return w.append, w.flush, lambda: None


def serve(spec_json: str) -> None:
    """Build the tables described by spec_json, print the port, serve until stdin closes."""
    import reverb
    import tensorflow as tf

    tables = []
    for t in json.loads(spec_json):
        sampler = (reverb.selectors.Prioritized(priority_exponent=t["exponent"])
                   if t["sampler"] == "prioritized" else reverb.selectors.Uniform())
        sig = {f: tf.TensorSpec(shape, getattr(tf, dtype)) for f, (shape, dtype) in t["fields"].items()}
        tables.append(reverb.Table(name=t["name"], sampler=sampler, remover=reverb.selectors.Fifo(),
                                   max_size=t["max_size"],
                                   rate_limiter=reverb.rate_limiters.MinSize(1), signature=sig))
    server = reverb.Server(tables=tables, port=None)
    ready_until_stdin_closes(server.port)  # the benchmark closes stdin (or dies): stop
    server.stop()
