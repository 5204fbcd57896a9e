"""Which gather moves sampled rows fastest on this GPU: ``index_select``, advanced
indexing (``cols[idx]``, what TorchRL's storages do) and Reprise's Triton gather kernel,
over columns in device memory and over pinned host memory read in place.

    python -m benchmarks.gpu.gather_variants [--repeats 200]

Needs CUDA. Each variant is timed two ways: the GPU time of the gather alone
(``triton.testing.do_bench``'s median, CUDA events) and the host wall time of one call
closed by a synchronize (median), which adds the launch's CPU cost. Columns are viewed
as int64 words, as ``reprise.torch.columns`` views them; indices are random, on the device.
"""

from __future__ import annotations

import argparse
import statistics

import torch

from benchmarks.common.timing import call_times
from reprise.torch import gather_kernels
from reprise.torch._device import mapped_view
from reprise.torch.columns import ColumnViews

CASES = (  # (where, row bytes, rows stored, batch)
    ("device", 400, 1_000_000, 256), ("device", 4096, 262_144, 1024), ("device", 4096, 262_144, 4096),
    ("device", 409_600, 4096, 1024), ("host", 400, 1_000_000, 256), ("host", 4096, 262_144, 4096),
)


class _Columns(ColumnViews):
    """One field ``x`` over a given ``[rows, words]`` tensor, for ``gather_kernels``."""

    def __init__(self, words_view):
        self.device = words_view.device
        self.fields = ["x"]
        self.field_shapes = {"x": ((words_view.shape[1] * 8,), "uint8")}
        self.views = {"x": words_view}
        self.gather_plans = {}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=200)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("needs CUDA")
    import triton.testing
    dev = torch.device("cuda", torch.cuda.current_device())
    gather_kernels.ENABLED = True
    print(f"{'where':6s} {'row':>8s} {'batch':>6s}  {'variant':14s} {'GPU us':>9s} {'GB/s':>8s} {'call us':>9s}")
    for where, row, stored, batch in CASES:
        words = row // 8
        if where == "device":
            cols = torch.randint(0, 1 << 62, (stored, words), dtype=torch.int64, device=dev)
        else:
            host = torch.randint(0, 1 << 62, (stored, words), dtype=torch.int64).pin_memory()
            cols = mapped_view(host, dev).view(stored, words)
        columns = _Columns(cols)
        idx = torch.randint(0, stored, (batch,), device=dev)
        ref = cols[idx]
        variants = {
            "index_select": lambda: torch.index_select(cols, 0, idx),
            "advanced_index": lambda: cols[idx],
            "triton_kernel": lambda: gather_kernels.gather(columns, ["x"], idx, batch)["x"],
        }
        for name, fn in variants.items():
            assert torch.equal(fn(), ref), name
            gpu = triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e3
            call = statistics.median(call_times(fn, 20, args.repeats, sync=torch.cuda.synchronize)) * 1e6
            print(f"{where:6s} {row:8d} {batch:6d}  {name:14s} {gpu:9.1f} {batch * row / gpu / 1e3:8.1f} {call:9.1f}",
                  flush=True)
        cols = columns = ref = variants = None  # freed before the next case
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
