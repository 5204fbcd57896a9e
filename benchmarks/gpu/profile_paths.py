"""Where the time of a small GPU sample goes: ``torch.profiler`` tables of the host-selection
path, the device-resident path (Triton kernels on and off) and a device store, with each
stage of the draw marked (``record_function``), and the medians of each variant.

    python -m benchmarks.gpu.profile_paths [--items 1000000] [--batch 256] [--row-bytes 400]
        [--variants host_selection,resident,device_store,device_store_resident] [--medians-only] [--out DIR]

Needs CUDA. Prints, per variant, the median of ``--repeats`` calls (each closed by a
synchronize), then the profiler's table (sorted by CPU time) of 50 calls; with ``--out``
also writes each table to a file there.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics

import numpy as np
import torch

import reprise as rp
from benchmarks.common.timing import call_times
from reprise.torch import collect, resident, resident_kernels

STAGES = [
    (resident.ResidentSelection, "admit"), (resident.ResidentSelection, "_apply"),
    (resident.ResidentSelection, "select"), (resident.ResidentSelection, "rows"),
    (resident.ResidentSelection, "draw_admitted"), (rp.Table, "_sample_rows"),
]


def mark_stages():
    """Wraps each stage in a ``record_function`` named for it."""
    def wrap(fn, name):
        @functools.wraps(fn)
        def marked(*a, **k):
            with torch.profiler.record_function(name):
                return fn(*a, **k)
        return marked
    for owner, name in STAGES:
        setattr(owner, name, wrap(getattr(owner, name), f"reprise.{owner.__name__}.{name}"))
    for mod, name in ((collect, "gather"), (collect, "release_after"), (resident, "gather"),
                      (resident, "release_after"), (resident_kernels, "fused_draw")):
        setattr(mod, name, wrap(getattr(mod, name), f"reprise.{mod.__name__.split('.')[-1]}.{name}"))


def median_us(fn, repeats: int) -> float:
    """Median microseconds per call, each closed by a synchronize, after 20 warm-up calls."""
    return statistics.median(call_times(fn, 20, repeats, sync=torch.cuda.synchronize)) * 1e6


def profile(name, fn, out_dir):
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(50):
            fn()
            torch.cuda.synchronize()
    table = prof.key_averages().table(sort_by="cpu_time_total", row_limit=28, max_name_column_width=60)
    if not out_dir:
        print(f"\n##### {name} (50 calls)\n{table}", flush=True)
    else:
        with open(os.path.join(out_dir, f"profile-{name}.txt"), "w") as f:
            f.write(table)


VARIANTS = {  # name -> (Table keyword arguments, store on the device)
    "host_selection": ({}, False),
    "resident": ({"selection_device": "cuda"}, False),
    "device_store": ({}, True),
    "device_store_resident": ({"selection_device": "cuda"}, True),
}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--items", type=int, default=1_000_000)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--row-bytes", type=int, default=400, help="bytes per item (one float32 field)")
    ap.add_argument("--variants", default="host_selection,resident,device_store_resident",
                    help=f"comma list of {', '.join(VARIANTS)}")
    ap.add_argument("--repeats", type=int, default=500)
    ap.add_argument("--medians-only", action="store_true", help="no profiler tables")
    ap.add_argument("--label", default="", help="printed before each median (an A/B run's side)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("needs CUDA")
    n, b, k = args.items, args.batch, args.row_bytes // 4
    sig = {"x": rp.Field((k,), "float32")}
    data = np.random.default_rng(0).standard_normal((min(n, 65536), 1, k), dtype=np.float32)
    medians = {}
    variants = []
    stores = []
    for label in args.variants.split(","):
        kwargs, dev_store = VARIANTS[label]
        store = rp.Store(sig, capacity=n + 256, device="cuda" if dev_store else None)
        table = rp.Table(label, store, max_size=n, seed=0, **kwargs)
        for lo in range(0, n, data.shape[0]):
            table.insert({"x": data[: min(data.shape[0], n - lo)]}, 1.0)
        stores.append((store, table))
        variants.append((label, table))
    if "host_selection" in args.variants.split(","):
        host_only = variants[0][1]
        medians["host_selection_numpy"] = median_us(lambda: host_only.sample(b), args.repeats)
    for label, table in variants:
        medians[label] = median_us(lambda: table.sample(b, device="cuda"), args.repeats)
        if getattr(table._selection, "resident", False):
            sel = table._selection
            sel.use_triton = sel.tree.use_triton = False
            medians[label + "_torch_ops"] = median_us(lambda: table.sample(b, device="cuda"), args.repeats)
            sel.use_triton = sel.tree.use_triton = True

            def admit_only():
                with sel.lock:
                    a = sel.admit(b, None)
                a.rows.release()
            medians[label + "_admit_only"] = median_us(admit_only, args.repeats)
        elif table._selection is None:
            def rows_only():
                table._native.sample_rows(b, None, pinned=True).release()
            medians[label + "_draw_only"] = median_us(rows_only, args.repeats)
    medians["empty_launch"] = median_us(lambda: torch.empty(1, device="cuda").add_(1), args.repeats)
    medians[f"rand_{b}"] = median_us(lambda: torch.rand(b, device="cuda", dtype=torch.float64), args.repeats)
    medians[f"d2h_5x{b}_int64"] = median_us(lambda: torch.empty((5, b), dtype=torch.int64, device="cuda").cpu(),
                                            args.repeats)
    print(f"medians (us), {b} x {args.row_bytes} B of {n} items:", flush=True)
    for key, v in medians.items():
        print(f"  {args.label}{key:36s} {v:9.1f}", flush=True)
    if not args.medians_only:
        mark_stages()
        for label, table in variants:
            profile(label, lambda: table.sample(b, device="cuda"), args.out)
    variants.clear()
    for store, _ in stores:
        store.close()


if __name__ == "__main__":
    main()
