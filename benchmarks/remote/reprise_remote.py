"""Reprise side of the remote comparison; run with the python that has reprise installed:
``python -m benchmarks.remote.reprise_remote [--quick] [--only KEYS] [--budget S]
[--ops OPS] [--sizes SIZES] [--clients COUNTS]``.

The server is a child process (this module with ``--serve``): one store and one table
per (table kind, size) (``workloads.table_specs``: Uniform sampler, Fifo remover,
``max_size`` = the config's ``table_items``, MinSize(1)), every table filled to
``max_size`` with ``Table.insert`` (so inserts evict from the start and every page of the
store has been touched), served by
``rp.Server(tables, address="127.0.0.1:0")`` (the gRPC service; no token on loopback).
Clients are spawned processes with ``rp.Client("127.0.0.1:PORT")``. Paths:

* insert: ``client.writer(table, max_sequence_length=BATCH)``; one call = ``extend`` of
  BATCH steps + ``create_items(table, 1, priorities[BATCH])`` (one item per step) +
  ``flush()`` (returns once the server has applied them: the items are in the table).
* sample, sample256: ``client.sample(table, n).data["x"]`` (numpy ``[n, 1, floats]``).
* step_insert: ``client.writer(table, max_sequence_length=1)`` kept open (as Reverb's
  ``num_keep_alive_refs=1``; with the default, None, the writer holds its whole episode
  and fills the store); one call = STEP_CHUNK times ``append({"x": step})`` +
  ``create_item(table, 1, 1.0)``, then ``flush()``.
* iterate, iterate256: ``client.iterate(table, n, max_in_flight=ITERATE_IN_FLIGHT)`` made
  once per client (its stream stays open across rounds); one call = ``next()`` of it.

A point that fails (e.g. a 102 MB sample the server refuses) is recorded as an error
and the next point starts fresh client processes; a point finding the server process
dead records that as its error. Only the tables the selected points use are built.
"""

from __future__ import annotations

import json
import os

import numpy as np

from benchmarks.common.payload import payload
from benchmarks.common.processes import ServerProcess, ready_until_stdin_closes, serve_if_asked
from benchmarks.remote.workloads import (ITERATE_IN_FLIGHT, STEP_CHUNK, batch_of, batch_rows,
                                         floats, remote_bench, run_points, table_name, table_specs,
                                         used_tables)

FILL_CHUNK_BYTES = 16 << 20   # random rows generated once and inserted over and over


# --- the server process ------------------------------------------------------------------
def serve(spec_json: str) -> None:
    import reprise as rp

    stores, tables = [], []
    for s in json.loads(spec_json):
        k, items, batch = s["floats"], s["items"], s["batch"]
        block = 64 if k * 4 <= 64_000 else 16
        # Room beyond max_size for the blocks the writers hold: each client keeps two
        # writers open on an insert ring (insert's and step_insert's).
        margin = s["clients"] * (batch + STEP_CHUNK + 4 * block)
        store = rp.Store({"x": rp.Field((k,), "float32")}, capacity=items + margin,
                         block_steps=block)
        table = rp.Table(s["name"], store, sampler=rp.selectors.Uniform(),
                         remover=rp.selectors.Fifo(), max_size=items,
                         rate_limiter=rp.rate_limiters.MinSize(1))
        chunk = max(1, min(items, FILL_CHUNK_BYTES // (4 * k)))
        rows = payload(chunk, k, seed=7)
        for start in range(0, items, chunk):
            n = min(chunk, items - start)
            table.insert({"x": rows[:n, None]}, np.ones(n))
        stores.append(store)
        tables.append(table)
    server = rp.Server(tables, address="127.0.0.1:0")
    ready_until_stdin_closes(server.address)
    server.stop()
    for store in stores:
        store.close()


def client_setup(index: int, address: str):
    import reprise as rp

    client = rp.Client(address)

    def make(op: str, label: str):
        table, n = table_name(op, label), batch_of(op, label)
        if op == "insert":
            w = client.writer(table, max_sequence_length=n)
            steps = {"x": batch_rows(label, 100 + index)}
            priorities = np.ones(n)

            def insert() -> None:
                w.extend(steps)
                w.create_items(table, 1, priorities)
                w.flush()
            return insert, w.close
        if op == "step_insert":
            # Keeps only the last step, as Reverb's num_keep_alive_refs=1: with the default
            # (None) a writer kept open holds its whole episode and fills the store.
            w = client.writer(table, max_sequence_length=1)
            steps = [{"x": r} for r in batch_rows(label, 200 + index, n)]

            def step_insert() -> None:
                for step in steps:
                    w.append(step)
                    w.create_item(table, 1, 1.0)
                w.flush()
            return step_insert, w.close

        shape = (n, 1, floats(label))
        if op in ("iterate", "iterate256"):
            batches = client.iterate(table, n, max_in_flight=ITERATE_IN_FLIGHT)

            def iterate() -> None:
                x = next(batches).data["x"]
                assert x.shape == shape, x.shape
            return iterate, batches.close

        def sample() -> None:
            x = client.sample(table, n).data["x"]
            assert x.shape == shape, x.shape
        return sample, lambda: None
    return make


def path_of(op: str, label: str) -> str:
    n = batch_of(op, label)
    if op == "insert":
        return (f"Client.writer(max_sequence_length={n}): extend({n} steps) + "
                f"create_items(table, 1, {n} priorities) + flush() per call")
    if op == "step_insert":
        return (f"Client.writer(table, max_sequence_length=1) kept open: {n} x (append(step) + "
                "create_item(table, 1, 1.0)) + flush() per call")
    if op in ("iterate", "iterate256"):
        return (f"Client.iterate(table, {n}, max_in_flight={ITERATE_IN_FLIGHT}) kept open; "
                f"next().data['x'] per call (numpy [{n}, 1, floats])")
    return f"Client.sample(table, {n}).data['x'] (numpy [{n}, 1, floats])"


def main() -> None:
    if serve_if_asked(serve):
        return
    bench = remote_bench("reprise")
    import reprise as rp
    bench.versions["reprise"] = rp.__version__
    bench.versions["reprise_path"] = os.path.dirname(rp.__file__)
    bench.log("starting the server (filling its tables) ...")
    server = ServerProcess(__spec__.name, used_tables(bench.cfg, table_specs(bench.cfg)))
    clients = max(bench.cfg.clients)
    bench.notes.append(f"rp.Server(tables, address='127.0.0.1:0') in its own process at "
                       f"{server.address}; {clients} client processes with rp.Client(address)")
    try:
        run_points(bench, server, client_setup, path_of)
    finally:
        server.stop()
    bench.finish()


if __name__ == "__main__":
    main()
