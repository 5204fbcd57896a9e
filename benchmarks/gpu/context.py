"""What every section of the GPU benchmark shares (``benchmarks.gpu.compare``): the
configuration, the run's context (device, budget, results, timing), guarded steps, the
machine header, and the host-store helpers (fill, checks)."""

from __future__ import annotations

import datetime as dt
import gc
import json
import math
import os
import platform
import resource
import socket
import subprocess
import sys
import time
import traceback

import numpy as np
import torch

from benchmarks.common.config import Config
from benchmarks.common.driver import host_info
from benchmarks.common.timing import call_times

MB = 1_000_000
GB = 1_000_000_000


def log(*a):
    print(*a, flush=True)


# --- configuration ----------------------------------------------------------------------
FULL = dict(rows=[400, 4_000, 40_000, 400_000], batches=[256, 1024, 4096],
            target_bytes=4 * GB, cap_bytes=8 * GB,
            memcpy_bytes=256 << 20, memcpy_repeats=20,
            call_budget_s=1.5, max_repeats=200,
            latency_items=1_000_000, latency_repeats=2000, iter_batches=2000,
            tree_slots=100_000_000, tree_batch=65_536, tree_repeats=50,
            prio_items=1_000_000, prio_batches=[65_536, 4_096], prio_repeats=50,
            dev_rows=[4_000, 400_000], dev_batches=[1024, 4096],
            peer_call_budget_s=2.0, peer_prio_repeats=20)
QUICK = dict(rows=[400, 40_000], batches=[64, 256],
             target_bytes=16 * MB, cap_bytes=512 * MB,
             memcpy_bytes=32 << 20, memcpy_repeats=5,
             call_budget_s=0.2, max_repeats=30,
             latency_items=20_000, latency_repeats=200, iter_batches=200,
             tree_slots=262_144, tree_batch=1_024, tree_repeats=5,
             prio_items=20_000, prio_batches=[1_024, 256], prio_repeats=5,
             dev_rows=[4_000, 40_000], dev_batches=[64, 256],
             peer_call_budget_s=0.2, peer_prio_repeats=5)


def make_config(quick: bool) -> Config:
    """The sizes of a full run or of ``--quick``; ``min_items``: 4x the largest batch
    (recompute it after overriding ``batches``)."""
    cfg = Config.choose(quick, None, FULL, QUICK)
    cfg.min_items = 4 * max(cfg.batches)
    return cfg


def n_items(cfg: Config, row_bytes: int, space_bytes: float | None = None) -> int:
    """Items in a store of ``row_bytes`` rows: ~target bytes, >= 4x the largest
    batch, <= cap bytes (and what ``space_bytes`` of shared memory holds)."""
    n = max(cfg.min_items, math.ceil(cfg.target_bytes / row_bytes))
    n = min(n, max(cfg.min_items, cfg.cap_bytes // row_bytes))
    if space_bytes is not None:
        n = min(n, int(space_bytes // row_bytes))
    return int(n)


# --- the run ----------------------------------------------------------------------------
class Ctx:
    """One run: arguments, configuration, device, budget, results (saved after every step)."""

    def __init__(self, args):
        self.args = args
        self.cfg = make_config(args.quick)
        self.emulated = args.device == "cpu-emulated"
        self.on_cuda = not self.emulated
        self.dev = torch.device("cuda") if self.on_cuda else torch.device("cpu")
        self.peer_device = "cuda" if self.on_cuda else "cpu"
        self.t0 = time.perf_counter()
        self.deadline = self.t0 + args.budget
        self.results: dict = {}
        self.trl = None
        self.trl_error = None

    def sync(self):
        if self.on_cuda:
            torch.cuda.synchronize()

    def time_calls(self, fn, warmup: int, repeats: int, budget_s: float | None = None,
                   min_repeats: int = 5) -> list[float]:
        """Seconds per call, each closed by a device synchronize (see
        :func:`~benchmarks.common.timing.call_times`)."""
        return call_times(fn, warmup, repeats, sync=self.sync, budget_s=budget_s,
                          min_repeats=min_repeats)

    def free(self):
        gc.collect()
        if self.on_cuda:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()

    def close_store(self, store):
        """Closes ``store`` once the GPU has read every sample gathered from it,
        then frees device memory (drop the tables over it first)."""
        from reprise.torch.collect import wait_released
        wait_released()
        store.close()
        self.free()

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def over_budget(self) -> bool:
        return time.perf_counter() > self.deadline

    def save(self):
        os.makedirs(os.path.dirname(os.path.abspath(self.args.out)), exist_ok=True)
        tmp = self.args.out + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.results, f, indent=1, default=str)
        os.replace(tmp, self.args.out)



def guarded(ctx: Ctx, into: dict, key: str, fn, *a, **kw):
    """``into[key] = fn(...)``; on failure ``into[key] = {error, traceback}``; skipped
    once past the budget."""
    if ctx.over_budget():
        into[key] = {"skipped": f"past --budget {ctx.args.budget:.0f}s"}
        log(f"  {key}: skipped (past the budget)")
        return into[key]
    try:
        into[key] = fn(*a, **kw)
    except BaseException as e:  # noqa: BLE001 - a failure must not lose the other numbers
        if isinstance(e, KeyboardInterrupt):
            raise
        into[key] = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
        log(f"  {key}: FAILED {type(e).__name__}: {e}")
        try:
            ctx.free()
        except Exception:  # noqa: BLE001
            pass
    return into[key]



def repeats_for(est_s: float, budget_s: float, lo: int, hi: int) -> int:
    return int(min(hi, max(lo, budget_s / max(est_s, 1e-6))))



# --- machine ----------------------------------------------------------------------------
def header(ctx: Ctx) -> dict:
    import reprise as rp
    h = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
         "hostname": socket.gethostname(), "argv": sys.argv, "quick": ctx.args.quick,
         "mode": ctx.args.device, "python": platform.python_version(),
         "platform": platform.platform(), "cpus": os.cpu_count(),
         "torch": torch.__version__, "torch_cuda": torch.version.cuda,
         "torch_threads": torch.get_num_threads(),
         "reprise": getattr(rp, "__version__", None), "reprise_path": os.path.dirname(rp.__file__),
         "numpy": np.__version__}
    try:
        import triton
        h["triton"] = triton.__version__
    except Exception as e:  # noqa: BLE001
        h["triton"] = f"unavailable: {type(e).__name__}: {e}"
    machine = host_info()
    h.update(cpu_model=machine.get("cpu_model"), mem_gib=machine.get("mem_gib"))
    store_dir = ctx.args.store_dir or "/dev/shm"
    try:
        st = os.statvfs(store_dir)
        h["store_dir"] = store_dir
        h["store_dir_free_gb"] = st.f_bavail * st.f_frsize / GB
    except OSError as e:
        h["store_dir"] = f"{store_dir}: {e}"
    if ctx.args.huge_dir:
        import reprise as rp
        h["huge_dir"] = [ctx.args.huge_dir, *rp._native.page_backing(ctx.args.huge_dir)]
    soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    h["memlock_limit"] = {"soft": soft, "hard": hard}
    if ctx.on_cuda:
        p = torch.cuda.get_device_properties(0)
        h["gpu"] = torch.cuda.get_device_name(0)
        h["gpu_mem_gib"] = round(p.total_memory / 2**30, 1)
        h["gpu_capability"] = f"{p.major}.{p.minor}"
        try:
            r = subprocess.run(["nvidia-smi", "--query-gpu=driver_version,pcie.link.gen.current,"
                                "pcie.link.width.current", "--format=csv,noheader"],
                               capture_output=True, text=True, timeout=10)
            h["nvidia_smi"] = r.stdout.strip() or r.stderr.strip()
        except (OSError, subprocess.TimeoutExpired) as e:
            h["nvidia_smi"] = str(e)
    else:
        h["gpu"] = "none: reprise.torch.emulate_cuda(True), 'cuda' mapped to the CPU"
    if ctx.trl is not None:
        try:
            h["torchrl"] = ctx.trl.versions()
        except Exception as e:  # noqa: BLE001
            h["torchrl"] = {"error": f"{type(e).__name__}: {e}"}
    else:
        h["torchrl"] = {"error": ctx.trl_error}
    return h


def space_for_stores(ctx: Ctx) -> float | None:
    """Bytes a host store may take: 85% of what its directory has free."""
    try:
        st = os.statvfs(ctx.args.store_dir or "/dev/shm")
        return 0.85 * st.f_bavail * st.f_frsize
    except OSError:
        return None



# --- host stores ----------------------------------------------------------------------
def pinned_gbps(ctx: Ctx, nbytes: int) -> float | None:
    m = ctx.results.get("memcpy", {})
    by = m.get("pinned_by_bytes", {})
    if str(nbytes) in by:
        return by[str(nbytes)]["gbps"]
    return m.get("pinned", {}).get("gbps")


def fill_table(ctx: Ctx, table, src: dict, n: int) -> float:
    """Inserts n one-step items, one call per block of ``src`` ({field: [chunk, 1, ...]},
    numpy or torch, reused), priority 1; the seconds it took, closed by a synchronize."""
    chunk = len(next(iter(src.values())))
    ones = np.ones(chunk)
    ctx.sync()
    t0 = time.perf_counter()
    done = 0
    while done < n:
        m = min(chunk, n - done)
        table.insert({f: v[:m] for f, v in src.items()}, priorities=ones[:m])
        done += m
    ctx.sync()
    fill_s = time.perf_counter() - t0
    check_filled(table, n)
    return fill_s


def fill_host_table(ctx: Ctx, table, k: int, n: int, rng) -> float:
    """Inserts n one-step items of float32[k] (a reused block of random normals)."""
    chunk = aligned_chunk(n, 65_536, (64 << 20) // (4 * k))
    return fill_table(ctx, table, {"x": rng.standard_normal((chunk, 1, k), dtype=np.float32)}, n)


def time_iterate(ctx: Ctx, table, b: int, m: int, warmup: int, row_bytes: int) -> dict:
    """``table.iterate(batch_size=b, device="cuda", prefetch=2)``: ``warmup`` batches, then
    ``m`` timed, closed by a synchronize."""
    for _ in table.iterate(batch_size=b, device="cuda", prefetch=2, num_batches=warmup):
        pass
    ctx.sync()
    t0 = time.perf_counter()
    count = 0
    for _ in table.iterate(batch_size=b, device="cuda", prefetch=2, num_batches=m):
        count += 1
    ctx.sync()
    el = time.perf_counter() - t0
    assert count == m
    return {"batches": m, "seconds": el, "batches_per_s": m / el, "us_per_batch": el / m * 1e6,
            "gbps": m * b * row_bytes / el / GB}


def aligned_chunk(n: int, most: int, by_bytes: int) -> int:
    """Items per insert call: <= most, <= by_bytes, a multiple of the 64-step block when
    it can be (each device-store insert starts a fresh block, so an unaligned chunk
    would leave partial blocks behind and the store would evict)."""
    c = max(1, min(n, most, by_bytes))
    return c - c % 64 if c >= 64 and c < n else c


def check_filled(table, n: int):
    info = table.info()
    assert table.size == n, (f"table holds {table.size} of {n} items after the fill "
                             f"(store evictions: {info.get('num_store_evictions')})")


def check_sample(s, b: int, k: int, dev: torch.device):
    x = s.data["x"]
    assert isinstance(x, torch.Tensor), type(x)
    assert tuple(x.shape) == (b, 1, k) and x.dtype == torch.float32, (x.shape, x.dtype)
    assert x.device.type == dev.type, x.device
    assert float(x.abs().sum()) > 0, "sampled rows are all zero"


def host_store(ctx: Ctx, k: int, n: int, huge: bool = False):
    """A one-field host store of n + 64 rows of float32[k]; with ``huge``, on 2 MiB
    pages in ``--huge-dir``."""
    import reprise as rp
    return rp.Store({"x": rp.Field((k,), "float32")}, capacity=n + 64, block_steps=64,
                    directory=ctx.args.huge_dir if huge else ctx.args.store_dir, huge_pages=huge)
