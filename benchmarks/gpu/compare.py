"""Reprise's GPU path against TorchRL's, in one process and one run.

Run from the repository root on a machine with one NVIDIA GPU (reprise installed;
TorchRL 0.12 + tensordict importable, e.g. through PYTHONPATH):

    python -m benchmarks.gpu.compare                      # ~4-6 minutes on an H100
    python -m benchmarks.gpu.compare --only collect,sumtree --no-peers
    python -m benchmarks.gpu.compare --quick              # smoke test; numbers are noise

Without CUDA, ``--quick`` runs ``--device cpu-emulated`` (``reprise.torch.emulate_cuda``:
"cuda" mapped to the CPU, TorchRL on the CPU, no memcpy section) and says so; a full
run without CUDA stops with a message instead.

Sections (``--only`` takes a comma list of these names):

- ``memcpy``: pinned and pageable host->device ``copy_`` of 256 MB (non_blocking),
  median of 20; pinned also at every batch size the other sections move.
- ``collect``: host shared-memory store, one float32 field of 400 B / 4 KB / 40 KB /
  400 KB per item, N items with N*row ~ 4 GB (at least 4x the largest batch, at most
  8 GB); ``table.sample(b, device="cuda")`` end to end (host selection + zero-copy GPU
  gather from registered shared memory + synchronize) for b in 256/1024/4096; GB/s,
  ratio to pinned memcpy; the gather kernel alone; ``table.iterate(prefetch=2)``.
  Peer: TorchRL ``collect_host`` (CPU storage, pinned staging, async copy) at the same
  N, row and batch. With ``--huge-dir DIR`` (a hugetlbfs, or a tmpfs mounted
  ``huge=within_size``, big enough for one store), rows of 4 KB and up run again on a
  store there with ``huge_pages=True`` (``reprise_huge``): the same table on 2 MiB pages,
  which tests whether the GPU's TLB reach over 4 KiB host pages holds the gather back.
- ``latency``: ``sample(256, device="cuda")`` of 400 B items, 2000 calls: median, p99;
  the host-only sample for reference; ``iterate(prefetch=2)`` batches/s. Then
  ``resident``: the same items in a table with ``selection_device="cuda"`` (device-resident
  draws), ``sample(b, device="cuda")`` for b in 256/1024/4096, compared with TorchRL's
  400 B collect at the same batch; ``static_graph``: ``table.static_sample(256)``, each
  step ``admit()`` and the replay of a CUDA graph that captured ``draw()``; ``churn32``: 32
  inserts (32 changed slots for the mirror) before each resident ``sample(256)``; and ``transition``: 256 device-resident draws of
  five-field transitions (353 B) gathered by the fused kernel and by one
  ``index_select`` per field.
- ``sumtree``: ``reprise.torch.sum_tree.SumTree`` of 100,000,000 slots (random
  weights); one round = ``find`` of 65,536 targets u = rand * total, their
  probabilities, and ``set`` of 65,536 new weights at those slots; median of 50.
  Peer: TorchRL ``prioritized(1e8, 65536)`` (PrioritizedSampler sample + update_priority).
- ``table_prio``: the table API with GPU selection (``selection_device="cuda"``,
  Prioritized(0.6)) over 1,000,000 items of 4 B: ``sample(B, device="cuda")`` +
  ``update_priorities`` for B = 65,536 and 4,096; the same with host selection for
  reference. Peer: TorchRL ``prioritized(1e6, B)``.
- ``device``: ``Store(device="cuda")`` (columns in GPU memory), 4 KB and 400 KB rows,
  batches 1024 and 4096, ``sample(b, device="cuda")`` GB/s, with host selection
  (``reprise``) and device-resident draws (``reprise_resident``). Peer: TorchRL
  ``collect_device`` (LazyTensorStorage on the GPU) at the same N.

Timing: every timed call is closed by ``torch.cuda.synchronize()`` inside a host
``perf_counter`` timer (memcpy also with CUDA events); warm-up calls first; medians.
Payloads are random normals (random bytes for memcpy). Each section and each
configuration inside it is guarded: a failure is recorded in the JSON (``error``,
``traceback``) and the run goes on. The JSON (``--out``, default
``benchmarks/out/gpu-<timestamp>.json``) is rewritten after every section, so a run cut
short keeps what it measured; a markdown table is printed at the end and written beside
it (``.md``). ``--budget`` (seconds) skips whatever would start after it has passed.

The sections live in ``transfers.py`` (memcpy, collect, latency, device) and
``prioritized.py`` (sumtree, table_prio), what they share in ``context.py``, the table
in ``report.py``; TorchRL's side in ``peers/torchrl_gpu.py``.
"""

from __future__ import annotations

from __future__ import annotations

import argparse
import datetime as dt
import os
import time
import traceback

import torch

from benchmarks.common.driver import OUT
from benchmarks.gpu.context import Ctx, guarded, header, log
from benchmarks.gpu.prioritized import sec_sumtree, sec_table_prio
from benchmarks.gpu.report import markdown
from benchmarks.gpu.transfers import sec_collect, sec_device, sec_latency, sec_memcpy

SECTIONS = ("memcpy", "collect", "latency", "sumtree", "table_prio", "device")


# --- main -------------------------------------------------------------------------------
def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="tiny sizes: checks the script, numbers are noise")
    ap.add_argument("--device", choices=("cuda", "cpu-emulated"), default=None,
                    help="cpu-emulated: reprise.torch.emulate_cuda(True), TorchRL on 'cpu', "
                         "no memcpy (default: cuda; with --quick and no CUDA, cpu-emulated)")
    ap.add_argument("--out", default=None, help="JSON path (default benchmarks/out/gpu-<timestamp>.json)")
    ap.add_argument("--only", default=None, help=f"comma list of sections: {','.join(SECTIONS)}")
    ap.add_argument("--no-peers", action="store_true", help="skip TorchRL")
    ap.add_argument("--budget", type=float, default=540.0,
                    help="seconds; measurements that would start later are skipped (default 540)")
    ap.add_argument("--store-dir", default=None, help="directory of the host stores' files (default /dev/shm)")
    ap.add_argument("--huge-dir", default=None,
                    help="a hugetlbfs or huge=within_size tmpfs: collect also runs rows >= 4 KB on a "
                         "store there with huge_pages=True (the TLB-reach test of the 4 KB gather)")
    ap.add_argument("--rows", default=None, help="override the collect row sizes in bytes, e.g. 400,400000")
    ap.add_argument("--batches", default=None, help="override the collect batch sizes, e.g. 256,4096")
    args = ap.parse_args()
    if args.device is None:
        args.device = "cuda"
        if args.quick and not torch.cuda.is_available():
            args.device = "cpu-emulated"
            log("no CUDA: --quick runs --device cpu-emulated (GPU numbers skipped; "
                "the code paths run on the CPU)")
    if args.out is None:
        stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
        args.out = os.path.join(OUT, f"gpu-{stamp}{'-quick' if args.quick else ''}.json")
    sections = SECTIONS if args.only is None else tuple(s.strip() for s in args.only.split(",") if s.strip())
    unknown = [s for s in sections if s not in SECTIONS]
    if unknown:
        ap.error(f"unknown sections {unknown}; expected some of {list(SECTIONS)}")

    ctx = Ctx(args)
    if args.rows:
        ctx.cfg.rows = [int(x) for x in args.rows.split(",")]
    if args.batches:
        ctx.cfg.batches = [int(x) for x in args.batches.split(",")]
        ctx.cfg.min_items = 4 * max(ctx.cfg.batches)
    if ctx.emulated:
        import reprise.torch as rt
        rt.emulate_cuda(True)
    elif not torch.cuda.is_available():
        raise SystemExit("CUDA is not available to this process; use --device cpu-emulated for a CPU smoke run")
    if not args.no_peers:
        try:
            from benchmarks.peers import torchrl_gpu
            ctx.trl = torchrl_gpu
        except BaseException as e:  # noqa: BLE001 - record and go on without the peer
            ctx.trl_error = f"import torchrl_gpu failed: {type(e).__name__}: {e}"
            ctx.results["torchrl_import_error"] = {"error": ctx.trl_error, "traceback": traceback.format_exc()}
            log(f"TorchRL unavailable (its rows are skipped): {ctx.trl_error}")
    else:
        ctx.trl_error = "--no-peers"
    ctx.results["header"] = {}
    guarded(ctx, ctx.results, "header", header, ctx)
    h = ctx.results["header"]
    log(f"# {h.get('gpu')} | torch {h.get('torch')} | triton {h.get('triton')} | reprise {h.get('reprise')} | "
        f"torchrl {(h.get('torchrl') or {}).get('torchrl', ctx.trl_error)} | {h.get('hostname')} | "
        f"store dir free {h.get('store_dir_free_gb', 0):.1f} GB")
    ctx.results["config"] = {k: v for k, v in vars(ctx.cfg).items()}
    ctx.save()
    fns = {"memcpy": sec_memcpy, "collect": sec_collect, "latency": sec_latency, "sumtree": sec_sumtree,
           "table_prio": sec_table_prio, "device": sec_device}
    for name in sections:
        log(f"\n== {name} (t = {ctx.elapsed():.0f} s)")
        t0 = time.perf_counter()
        r = guarded(ctx, ctx.results, name, fns[name], ctx)
        if isinstance(r, dict):
            r["section_s"] = time.perf_counter() - t0
        ctx.save()
    ctx.results["total_s"] = ctx.elapsed()
    ctx.save()
    md = markdown(ctx.results)
    md_path = os.path.splitext(args.out)[0] + ".md"
    with open(md_path, "w") as f:
        f.write(md + "\n")
    log(f"\n{md}\n\nJSON: {args.out}\nmarkdown: {md_path}\ntotal {ctx.elapsed():.0f} s")


if __name__ == "__main__":
    main()
