"""One system's side of the file-tier benchmark:
``python -m benchmarks.filetier.systems SYSTEM DIR ROWS ROW_BYTES`` fills a buffer of ROWS
rows of ROW_BYTES bytes whose data lives in files under DIR, then samples 256 rows
uniformly, fresh random rows each time (median of 30, after one). One JSON line; DIR is
removed at the end.

Systems: ``reprise`` (a file store, ``Store(..., backing="file")``, uniform table) and
``torchrl`` (``ReplayBuffer(LazyMemmapStorage(scratch_dir=DIR))``); the raw device is
measured by ``compare`` with fio."""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import time

import numpy as np

BATCH, ROUNDS, CHUNK_BYTES = 256, 30, 64 << 20


def timed(fn):
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def reprise(path: str, rows: int, row_bytes: int):
    import reprise as rp
    store = rp.Store({"x": rp.Field((row_bytes,), "uint8")}, capacity=rows, block_steps=64,
                     directory=path, backing="file")
    table = rp.Table("t", store, sampler=rp.selectors.Uniform(), remover=rp.selectors.Fifo(),
                     max_size=rows - 2 * 64, seed=0)
    per = max(1, CHUNK_BYTES // row_bytes)
    chunk = np.random.default_rng(0).integers(0, 255, (per, 1, row_bytes), dtype=np.uint8)
    done = 0
    while done < rows:
        n = min(per, rows - done)
        table.insert({"x": chunk[:n]}, np.ones(n))
        done += n
    store._native.sync()

    def sample():
        return table.sample(BATCH).data["x"]
    return sample, store.close, {"reprise": rp.__version__}


def torchrl(path: str, rows: int, row_bytes: int):
    import tensordict
    import torch
    import torchrl
    from torchrl.data import LazyMemmapStorage, ReplayBuffer
    rb = ReplayBuffer(storage=LazyMemmapStorage(rows, scratch_dir=path), batch_size=BATCH)
    per = max(1, CHUNK_BYTES // row_bytes)
    chunk = torch.randint(0, 255, (per, row_bytes), dtype=torch.uint8)
    done = 0
    while done < rows:
        n = min(per, rows - done)
        rb.extend(tensordict.TensorDict({"x": chunk[:n]}, batch_size=[n]))
        done += n

    def sample():
        return rb.sample()["x"]
    return sample, lambda: None, {"torchrl": torchrl.__version__, "torch": torch.__version__}


def main(argv=None) -> int:
    system, path, rows, row_bytes = (argv or sys.argv[1:])[:4]
    rows, row_bytes = int(rows), int(row_bytes)
    os.makedirs(path, exist_ok=True)
    target = os.path.join(path, "data")
    try:
        t0 = time.perf_counter()
        make = torchrl if system == "torchrl" else reprise
        sample, close, versions = make(target, rows, row_bytes)
        fill = time.perf_counter() - t0
        sample()
        times = [timed(sample) for _ in range(ROUNDS)]
        close()
        out = dict(system=system, rows=rows, row_bytes=row_bytes, data_bytes=rows * row_bytes, fill_s=fill,
                   fill_gb_s=rows * row_bytes / fill / 1e9, sample_us=statistics.median(times) * 1e6,
                   versions=versions)
        print(json.dumps(out))
    finally:
        shutil.rmtree(path, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
