"""The Reverb server process the Reverb scripts (``reverb_core.py``, ``reverb_serving.py``,
``reverb_remote.py``, ``reverb_checkpoint.py``) use: one ``reverb.Server`` holding every
table, in its own process (the calling module started with ``--serve SPECS`` through
:class:`~benchmarks.common.processes.ServerProcess`), reached over loopback gRPC. Run
with the reverb venv's python.

A table spec is a dict: ``name``, ``sampler`` ("uniform" or "prioritized", then
``exponent``), ``max_size`` and ``fields`` ({field: [shape, tf dtype name]}); every
table evicts FIFO and has a ``MinSize(1)`` rate limiter.
"""

from __future__ import annotations

import json
import sys

from benchmarks.common.processes import ServerProcess

__all__ = ["ServerProcess", "serve", "x_table"]


def x_table(name: str, floats: int, items: int) -> dict:
    """Spec of a uniform table of one-step items with one float32[1, floats] field."""
    return {"name": name, "sampler": "uniform", "max_size": items,
            "fields": {"x": [[1, floats], "float32"]}}


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
    print(f"READY {server.port}", flush=True)
    sys.stdin.read()  # the benchmark closes stdin (or dies): stop
    server.stop()
