"""Cluster mode on one GPU: ``ShardedTable(data_backend="nccl")`` at world size 1 against a
single-node ``Table`` holding the same items, both ``sample(b, device="cuda")``; and
``data_backend="gloo"``, where the rank reads its own shard's rows from host memory and the
GPU gathers them in place (same-host reads).

    python -m benchmarks.gpu.cluster_nccl [--rows 400,4096] [--batches 256,1024,4096]
    python -m benchmarks.gpu.cluster_nccl --quick        # smoke run (needs CUDA)

One process, a NCCL group of one rank (TCPStore on a free loopback port). Each
configuration: N items of one float32 field (N * row ~ 1 GB, at least 16x the largest
batch) inserted into both tables; warm-up, then the median of ``--repeats`` calls, each
closed by ``torch.cuda.synchronize()``. Reports both medians and their ratio (goal of
issue 38: the sharded table >= 95% of the single table's rate). Also checks that both
return the inserted rows (each row's first value is its index).
"""

from __future__ import annotations

import argparse
import json
import statistics

import numpy as np
import torch
import torch.distributed as dist

import reprise as rp
from benchmarks.common.timing import call_times
from reprise.distributed import ShardedTable


def timed(fn, repeats: int) -> float:
    """Median seconds per call, each closed by a synchronize, after 5 warm-up calls."""
    return statistics.median(call_times(fn, 5, repeats, sync=torch.cuda.synchronize))


def rows_filled(n: int, width: int) -> np.ndarray:
    data = np.random.default_rng(0).standard_normal((n, 1, width), dtype=np.float32)
    data[:, 0, 0] = np.arange(n, dtype=np.float32)
    return data


def check(sample, data) -> None:
    got = sample.data["x"][:, 0].float().cpu().numpy()
    idx = got[:, 0].astype(np.int64)
    if not np.array_equal(got, data[idx, 0]):
        raise SystemExit("rows differ from what was inserted")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="400,4096,40960", help="row sizes in bytes (multiples of 4)")
    ap.add_argument("--batches", default="256,1024,4096")
    ap.add_argument("--repeats", type=int, default=200)
    ap.add_argument("--bytes", type=float, default=1e9, help="bytes stored per configuration")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=None, help="JSON path")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("needs CUDA: cluster mode's NCCL path runs on a GPU")
    if args.quick:
        args.rows, args.batches, args.repeats, args.bytes = "4096", "256", 20, 1e7
    torch.cuda.set_device(0)
    store = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=__import__("datetime").timedelta(seconds=60))
    dist.init_process_group("nccl", store=store, rank=0, world_size=1, device_id=torch.device("cuda", 0))
    results = []
    try:
        for row in (int(r) for r in args.rows.split(",")):
            batches = [int(b) for b in args.batches.split(",")]
            n = max(int(args.bytes // row), 16 * max(batches))
            width = row // 4
            data = rows_filled(n, width)
            sig = {"x": rp.Field((width,), "float32")}
            store_ = rp.Store(sig, capacity=n + 4 * 64)
            single = rp.Table("single", store_, max_size=n)
            # nccl: rows through the NCCL exchange; gloo: the shard's rows read from its own host memory,
            # gathered in place by the GPU (same-host reads)
            sharded = {(backend, verify): ShardedTable(
                f"sharded-{backend}-{verify}", sig, capacity_per_shard=n + 4 * 64, max_size_per_shard=n,
                shards="rank", data_backend=backend, timeout=120, verify_rows=verify)
                for backend, verify in (("nccl", True), ("nccl", False), ("gloo", True))}
            for lo in range(0, n, 65536):
                part = {"x": data[lo:lo + 65536]}
                single.insert(part, 1.0)
                for t in sharded.values():
                    t.insert(part, 1.0)
            for b in batches:
                check(single.sample(b, device="cuda"), data)
                t_single = timed(lambda: single.sample(b, device="cuda"), args.repeats)
                for (backend, verify), table in sharded.items():
                    check(table.sample(b, device="cuda"), data)
                    t_sharded = timed(lambda: table.sample(b, device="cuda"), args.repeats)
                    r = {"row_bytes": row, "batch": b, "items": n, "data_backend": backend, "verify_rows": verify,
                         "single_us": t_single * 1e6, "sharded_us": t_sharded * 1e6,
                         "sharded_over_single_rate": t_single / t_sharded,
                         "single_GBps": b * row / t_single / 1e9, "sharded_GBps": b * row / t_sharded / 1e9}
                    results.append(r)
                    print(f"{row:>7} B x {b:>5}: single {r['single_us']:9.1f} us  sharded({backend}, verify_rows="
                          f"{verify!s:5}) {r['sharded_us']:9.1f} us  rate ratio {r['sharded_over_single_rate']:.2f}",
                          flush=True)
            for t in sharded.values():
                t.close()
            del single, store_
    finally:
        dist.destroy_process_group()
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(0), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
