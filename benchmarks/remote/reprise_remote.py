"""Reprise side of the remote comparison; run with the python that has reprise installed:
``python -m benchmarks.remote.reprise_remote [--quick] [--only KEYS] [--budget S]``.

The server is a child process (this module with ``--serve``): one store and one table
per (op, size) (Uniform sampler, Fifo remover, ``max_size`` = the config's
``table_items``, MinSize(1)),
every table filled to ``max_size`` with ``Table.insert`` (so inserts evict from the
start and every page of the store has been touched), served by
``rp.Server(tables, address="127.0.0.1:0")`` (the gRPC service; no token on loopback).
Clients are spawned processes with ``rp.Client("127.0.0.1:PORT")``. Paths:

* insert: ``client.writer(table, max_sequence_length=BATCH)``; one call = ``extend`` of
  BATCH steps + ``create_items(table, 1, priorities[BATCH])`` (one item per step) +
  ``flush()`` (returns once the server has applied them: the items are in the table).
* sample: ``client.sample(table, BATCH).data["x"]`` (numpy ``[BATCH, 1, floats]``).
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np

from benchmarks.common.payload import payload
from benchmarks.common.processes import Pool, ServerProcess, serve_until_stdin_closes
from benchmarks.remote.workloads import (BATCH, batch_rows, floats, remote_bench, run_points,
                                         table_name, table_specs)

FILL_CHUNK_BYTES = 16 << 20   # random rows generated once and inserted over and over


# --- the server process ------------------------------------------------------------------
def serve(spec_json: str) -> None:
    import reprise as rp

    stores, tables = [], []
    for s in json.loads(spec_json):
        k, items, batch = s["floats"], s["items"], s["batch"]
        block = 64 if k * 4 <= 64_000 else 16
        # Room beyond max_size for the blocks the writers hold (one writer per client).
        margin = s["clients"] * (batch + 2 * block)
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

    def stop() -> None:
        server.stop()
        for store in stores:
            store.close()

    serve_until_stdin_closes(server.address, stop)


def client_setup(index: int, address: str):
    import reprise as rp

    client = rp.Client(address)

    def make(op: str, label: str):
        table, n = table_name(op, label), BATCH[label]
        if op == "insert":
            w = client.writer(table, max_sequence_length=n)
            steps = {"x": batch_rows(label, 100 + index)}
            priorities = np.ones(n)

            def insert() -> None:
                w.extend(steps)
                w.create_items(table, 1, priorities)
                w.flush()
            return insert, w.close

        shape = (n, 1, floats(label))

        def sample() -> None:
            x = client.sample(table, n).data["x"]
            assert x.shape == shape, x.shape
        return sample, lambda: None
    return make


def path_of(op: str, label: str) -> str:
    n = BATCH[label]
    if op == "insert":
        return (f"Client.writer(max_sequence_length={n}): extend({n} steps) + "
                f"create_items(table, 1, {n} priorities) + flush() per call")
    return f"Client.sample(table, {n}).data['x'] (numpy [{n}, 1, floats])"


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--serve":
        serve(sys.argv[2])
        return
    bench = remote_bench("reprise")
    import reprise as rp
    bench.versions["reprise"] = rp.__version__
    bench.versions["reprise_path"] = os.path.dirname(rp.__file__)
    bench.log("starting the server (filling its tables) ...")
    server = ServerProcess(__spec__.name, table_specs(bench.cfg))
    clients = max(bench.cfg.clients)
    bench.notes.append(f"rp.Server(tables, address='127.0.0.1:0') in its own process at "
                       f"{server.address}; {clients} client processes with rp.Client(address)")
    pool = None
    try:
        pool = Pool(clients, client_setup, (server.address,), bench.cfg)
        bench.log(f"{clients} client processes ready in {pool.start_s:.1f}s")
        run_points(bench, pool, path_of,
                   extra=lambda op, label: {"server_rss_mib": server.rss_mib()})
    finally:
        if pool is not None:
            pool.close()
        server.stop()
    bench.finish()


if __name__ == "__main__":
    main()
