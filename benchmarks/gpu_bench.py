#!/usr/bin/env python3
"""Reprise's GPU path against TorchRL's, in one process and one run.

Run on a machine with one NVIDIA GPU (reprise installed; TorchRL 0.12 + tensordict
importable, e.g. through PYTHONPATH):

    python benchmarks/gpu_bench.py                      # ~4-6 minutes on an H100
    python benchmarks/gpu_bench.py --only collect,sumtree --no-peers
    PYTHONPATH=python python3.11 benchmarks/gpu_bench.py --quick --device cpu-emulated   # CPU smoke

Sections (``--only`` takes a comma list of these names):

- ``memcpy``: pinned and pageable host->device ``copy_`` of 256 MB (non_blocking),
  median of 20; pinned also at every batch size the other sections move.
- ``collect``: host shared-memory store, one float32 field of 400 B / 4 KB / 40 KB /
  400 KB per item, N items with N*row ~ 4 GB (at least 4x the largest batch, at most
  8 GB); ``table.sample(b, device="cuda")`` end to end (host selection + zero-copy GPU
  gather from registered shared memory + synchronize) for b in 256/1024/4096; GB/s,
  ratio to pinned memcpy; the gather kernel alone; ``table.iterate(prefetch=2)``.
  Peer: TorchRL ``collect_host`` (CPU storage, pinned staging, async copy) at the same
  N, row and batch.
- ``latency``: ``sample(256, device="cuda")`` of 400 B items, 2000 calls: median, p99;
  the host-only sample for reference; ``iterate(prefetch=2)`` batches/s.
- ``sumtree``: ``reprise.torch.sum_tree.SumTree`` of 100,000,000 slots (random
  weights); one round = ``find`` of 65,536 targets u = rand * total, their
  probabilities, and ``set`` of 65,536 new weights at those slots; median of 50.
  Peer: TorchRL ``prioritized(1e8, 65536)`` (PrioritizedSampler sample + update_priority).
- ``table_prio``: the table API with GPU selection (``selection_device="cuda"``,
  Prioritized(0.6)) over 1,000,000 items of 4 B: ``sample(B, device="cuda")`` +
  ``update_priorities`` for B = 65,536 and 4,096; the same with host selection for
  reference. Peer: TorchRL ``prioritized(1e6, B)``.
- ``device``: ``Store(device="cuda")`` (columns in GPU memory), 4 KB and 400 KB rows,
  batches 1024 and 4096, ``sample(b, device="cuda")`` GB/s. Peer: TorchRL
  ``collect_device`` (LazyTensorStorage on the GPU) at the same N.

Timing: every timed call is closed by ``torch.cuda.synchronize()`` inside a host
``perf_counter`` timer (memcpy also with CUDA events); warm-up calls first; medians.
Payloads are random normals (random bytes for memcpy). Each section and each
configuration inside it is guarded: a failure is recorded in the JSON (``error``,
``traceback``) and the run goes on. The JSON (``--out``, default
``benchmarks/out/gpu-<timestamp>.json``) is rewritten after every section, so a run cut
short keeps what it measured; a markdown table is printed at the end and written beside
it (``.md``). ``--budget`` (seconds) skips whatever would start after it has passed.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import json
import math
import os
import platform
import resource
import socket
import statistics
import subprocess
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "peers"))

import numpy as np  # noqa: E402
import torch  # noqa: E402

MB = 1_000_000
GB = 1_000_000_000
SECTIONS = ("memcpy", "collect", "latency", "sumtree", "table_prio", "device")


def log(*a):
    print(*a, flush=True)


# --- configuration ----------------------------------------------------------------------
class Config:
    def __init__(self, quick: bool):
        self.quick = quick
        self.rows = [400, 4_000, 40_000, 400_000]
        if not quick:
            self.batches = [256, 1024, 4096]
            self.target_bytes, self.cap_bytes = 4 * GB, 8 * GB
            self.memcpy_bytes, self.memcpy_repeats = 256 << 20, 20
            self.call_budget_s, self.max_repeats = 1.5, 200
            self.latency_items, self.latency_repeats, self.iter_batches = 1_000_000, 2000, 2000
            self.tree_slots, self.tree_batch, self.tree_repeats = 100_000_000, 65_536, 50
            self.prio_items, self.prio_batches, self.prio_repeats = 1_000_000, [65_536, 4_096], 50
            self.dev_rows, self.dev_batches = [4_000, 400_000], [1024, 4096]
            self.peer_call_budget_s, self.peer_prio_repeats = 2.0, 20
        else:
            self.batches = [64, 256]
            self.target_bytes, self.cap_bytes = 16 * MB, 512 * MB
            self.memcpy_bytes, self.memcpy_repeats = 32 << 20, 5
            self.call_budget_s, self.max_repeats = 0.2, 30
            self.latency_items, self.latency_repeats, self.iter_batches = 20_000, 200, 200
            self.tree_slots, self.tree_batch, self.tree_repeats = 1_000_000, 4_096, 10
            self.prio_items, self.prio_batches, self.prio_repeats = 100_000, [4_096, 1_024], 10
            self.dev_rows, self.dev_batches = [4_000, 40_000], [64, 256]
            self.peer_call_budget_s, self.peer_prio_repeats = 0.2, 5
        self.min_items = 4 * max(self.batches)

    def n_items(self, row_bytes: int, space_bytes: float | None = None) -> int:
        """Items in a store of ``row_bytes`` rows: ~target bytes, >= 4x the largest
        batch, <= cap bytes (and what ``space_bytes`` of shared memory holds)."""
        n = max(self.min_items, math.ceil(self.target_bytes / row_bytes))
        n = min(n, max(self.min_items, self.cap_bytes // row_bytes))
        if space_bytes is not None:
            n = min(n, int(space_bytes // row_bytes))
        return int(n)


class Ctx:
    def __init__(self, args):
        self.args = args
        self.cfg = Config(args.quick)
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

    def free(self):
        gc.collect()
        if self.on_cuda:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()

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


# --- timing -----------------------------------------------------------------------------
def summary(times: list[float], nbytes: int | None = None) -> dict:
    ts = sorted(times)
    n = len(ts)
    med = statistics.median(ts)
    out = {"us_median": med * 1e6, "us_p10": ts[int(0.10 * (n - 1))] * 1e6,
           "us_p90": ts[int(0.90 * (n - 1))] * 1e6, "us_p99": ts[int(0.99 * (n - 1))] * 1e6,
           "us_min": ts[0] * 1e6, "us_mean": statistics.fmean(ts) * 1e6, "repeats": n}
    if nbytes is not None:
        out["bytes_per_call"] = nbytes
        out["gbps"] = nbytes / med / GB
    return out


def time_calls(ctx: Ctx, fn, warmup: int, repeats: int, budget_s: float | None = None,
               min_repeats: int = 5) -> list[float]:
    """Seconds per call, each closed by a device synchronize; stops after ``repeats``
    calls or once ``budget_s`` has passed (after at least ``min_repeats``)."""
    for _ in range(warmup):
        fn()
    ctx.sync()
    clock = time.perf_counter
    times = []
    start = clock()
    for i in range(repeats):
        t0 = clock()
        fn()
        ctx.sync()
        times.append(clock() - t0)
        if budget_s is not None and i + 1 >= min_repeats and clock() - start > budget_s:
            break
    return times


def event_times(fn, warmup: int, repeats: int) -> list[float]:
    """Seconds per call between two CUDA events on the current stream."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    return times


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
    try:
        with open("/proc/cpuinfo") as f:
            h["cpu_model"] = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), None)
        with open("/proc/meminfo") as f:
            h["mem_gib"] = next((round(int(ln.split()[1]) / 2**20, 1) for ln in f if ln.startswith("MemTotal:")), None)
    except OSError:
        pass
    store_dir = ctx.args.store_dir or "/dev/shm"
    try:
        st = os.statvfs(store_dir)
        h["store_dir"] = store_dir
        h["store_dir_free_gb"] = st.f_bavail * st.f_frsize / GB
    except OSError as e:
        h["store_dir"] = f"{store_dir}: {e}"
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


# --- sections ---------------------------------------------------------------------------
def sec_memcpy(ctx: Ctx) -> dict:
    if not ctx.on_cuda:
        return {"skipped": "no CUDA (emulated mode)"}
    cfg = ctx.cfg
    n = cfg.memcpy_bytes
    src = torch.randint(0, 256, (n,), dtype=torch.uint8)
    pinned = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    pinned.copy_(src)
    pageable = src
    dst = torch.empty(n, dtype=torch.uint8, device=ctx.dev)
    out = {"bytes": n, "repeats": cfg.memcpy_repeats}
    t = time_calls(ctx, lambda: dst.copy_(pinned, non_blocking=True), 3, cfg.memcpy_repeats)
    out["pinned"] = summary(t, n)
    t = event_times(lambda: dst.copy_(pinned, non_blocking=True), 3, cfg.memcpy_repeats)
    out["pinned_events"] = summary(t, n)
    t = time_calls(ctx, lambda: dst.copy_(pageable, non_blocking=True), 3, cfg.memcpy_repeats)
    out["pageable"] = summary(t, n)
    assert torch.equal(dst[:4096].cpu(), src[:4096])
    log(f"  pinned {out['pinned']['gbps']:.2f} GB/s (events {out['pinned_events']['gbps']:.2f}), "
        f"pageable {out['pageable']['gbps']:.2f} GB/s")
    # Pinned at the byte counts the other sections move per call (<= the buffer).
    sizes = sorted({b * r for r in cfg.rows for b in cfg.batches} | {b * r for r in cfg.dev_rows for b in cfg.dev_batches})
    by = {}
    for s in sizes:
        if s > n:
            continue
        d, p = dst[:s], pinned[:s]
        t = time_calls(ctx, lambda: d.copy_(p, non_blocking=True), 3, cfg.memcpy_repeats)
        by[str(s)] = summary(t, s)
    out["pinned_by_bytes"] = by
    del src, pinned, pageable, dst
    ctx.free()
    return out


def pinned_gbps(ctx: Ctx, nbytes: int) -> float | None:
    m = ctx.results.get("memcpy", {})
    by = m.get("pinned_by_bytes", {})
    if str(nbytes) in by:
        return by[str(nbytes)]["gbps"]
    return m.get("pinned", {}).get("gbps")


def fill_host_table(ctx: Ctx, table, k: int, n: int, rng) -> float:
    """Inserts n one-step items of float32[k] (a reused block of random normals)."""
    row = 4 * k
    chunk = aligned_chunk(n, 65_536, (64 << 20) // row)
    src = rng.standard_normal((chunk, 1, k), dtype=np.float32)
    ones = np.ones(chunk)
    t0 = time.perf_counter()
    done = 0
    while done < n:
        m = min(chunk, n - done)
        table.insert({"x": src[:m]}, priorities=ones[:m])
        done += m
    fill_s = time.perf_counter() - t0
    check_filled(table, n)
    return fill_s


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


def host_store(ctx: Ctx, k: int, n: int):
    import reprise as rp
    return rp.Store({"x": rp.Field((k,), "float32")}, capacity=n + 64, block_steps=64,
                    directory=ctx.args.store_dir)


def sec_collect(ctx: Ctx) -> dict:
    import reprise as rp
    import reprise.torch as rt
    from reprise.torch.collect import wait_released
    cfg = ctx.cfg
    out = {"batches": cfg.batches, "rows": cfg.rows, "configs": {}}
    space = space_for_stores(ctx)
    rng = np.random.default_rng(0)
    for row in cfg.rows:
        k = row // 4
        n = cfg.n_items(row, space)
        rk = f"{row}B"
        cell = out["configs"][rk] = {"row_bytes": row, "n_items": n, "store_bytes": n * row}
        log(f"  row {row} B: N = {n:,} items ({n * row / GB:.2f} GB)")

        def reprise_row():
            res = {}
            store = host_store(ctx, k, n)
            table = rp.Table("t", store, sampler=rp.selectors.Uniform(), remover=rp.selectors.Fifo(),
                             max_size=n, seed=0)
            try:
                res["fill_s"] = fill_host_table(ctx, table, k, n, rng)
                res["fill_gbps"] = n * row / res["fill_s"] / GB
                for b in cfg.batches:
                    guarded(ctx, res, f"b{b}", reprise_config, ctx, store, table, k, n, b)
            finally:
                wait_released()
                del table
                store.close()
                ctx.free()
            return res

        guarded(ctx, cell, "reprise", reprise_row)
        ctx.save()
        if ctx.trl is not None and not ctx.args.no_peers:
            peer = cell["torchrl"] = {}
            for b in cfg.batches:
                est = b * row / 3e9 + 300e-6
                reps = repeats_for(est, cfg.peer_call_budget_s, 5 if cfg.quick else 10, 200)
                r = guarded(ctx, peer, f"b{b}", ctx.trl.collect_host, row, b, n, ctx.peer_device, reps)
                if "gbps" in r:
                    log(f"    torchrl collect_host b={b}: {r['gbps']:.2f} GB/s ({r['us_median']:.0f} us)")
        ctx.save()
    return out


def reprise_config(ctx: Ctx, store, table, k: int, n: int, b: int) -> dict:
    import reprise.torch as rt
    from reprise.torch.collect import wait_released
    cfg = ctx.cfg
    row = 4 * k
    nbytes = b * row
    res = {"batch": b, "bytes_per_call": nbytes}
    t0 = time.perf_counter()
    s = table.sample(b, device="cuda")
    ctx.sync()
    res["first_call_s"] = time.perf_counter() - t0  # includes registering the store with CUDA
    check_sample(s, b, k, ctx.dev)
    del s
    t = time_calls(ctx, lambda: table.sample(b, device="cuda"), 5, cfg.max_repeats, cfg.call_budget_s)
    res["sample"] = summary(t, nbytes)
    mc = pinned_gbps(ctx, nbytes)
    if mc:
        res["pinned_memcpy_gbps_same_bytes"] = mc
        res["ratio_to_pinned_memcpy"] = res["sample"]["gbps"] / mc
    wait_released()

    # The gather kernel alone: index_select from the registered host column.
    def gather_alone():
        cols = store._columns_for(rt.resolve("cuda"))
        view = cols.views["x"]
        idx = torch.randint(0, min(n, view.shape[0]), (b,), device=ctx.dev)
        t = time_calls(ctx, lambda: torch.index_select(view, 0, idx), 3, cfg.max_repeats, cfg.call_budget_s / 2)
        return summary(t, nbytes)
    guarded(ctx, res, "gather_only", gather_alone)

    # Prefetching iteration.
    def iterate():
        for _ in table.iterate(batch_size=b, device="cuda", prefetch=2, num_batches=5):
            pass
        ctx.sync()
        m = repeats_for(res["sample"]["us_median"] / 1e6, cfg.call_budget_s, 10, 1000)
        t0 = time.perf_counter()
        count = 0
        for s in table.iterate(batch_size=b, device="cuda", prefetch=2, num_batches=m):
            count += 1
        ctx.sync()
        el = time.perf_counter() - t0
        del s
        assert count == m
        return {"batches": m, "seconds": el, "batches_per_s": m / el, "gbps": m * nbytes / el / GB}
    guarded(ctx, res, "iterate_prefetch2", iterate)
    wait_released()
    g = res.get("gather_only", {}).get("gbps")
    it = res.get("iterate_prefetch2", {}).get("gbps")
    log(f"    reprise b={b}: sample {res['sample']['gbps']:.2f} GB/s ({res['sample']['us_median']:.0f} us)"
        + (f", {res['ratio_to_pinned_memcpy']:.2f}x pinned memcpy" if mc else "")
        + (f"; gather alone {g:.2f} GB/s" if g else "") + (f"; iterate {it:.2f} GB/s" if it else ""))
    return res


def sec_latency(ctx: Ctx) -> dict:
    import reprise as rp
    from reprise.torch.collect import wait_released
    cfg = ctx.cfg
    k, b, n = 100, 256, cfg.latency_items
    out = {"row_bytes": 400, "batch": b, "n_items": n}
    store = host_store(ctx, k, n)
    table = rp.Table("t", store, sampler=rp.selectors.Uniform(), remover=rp.selectors.Fifo(), max_size=n, seed=0)
    try:
        out["fill_s"] = fill_host_table(ctx, table, k, n, np.random.default_rng(1))
        s = table.sample(b, device="cuda")
        check_sample(s, b, k, ctx.dev)
        del s

        def gpu():
            t = time_calls(ctx, lambda: table.sample(b, device="cuda"), 100, cfg.latency_repeats)
            r = summary(t, b * 400)
            log(f"  sample({b}) -> GPU: median {r['us_median']:.1f} us, p99 {r['us_p99']:.1f} us")
            return r
        guarded(ctx, out, "sample_to_device", gpu)
        wait_released()

        def host():
            t = time_calls(ctx, lambda: table.sample(b), 100, cfg.latency_repeats)
            r = summary(t, b * 400)
            log(f"  sample({b}) host numpy: median {r['us_median']:.1f} us, p99 {r['us_p99']:.1f} us")
            return r
        guarded(ctx, out, "sample_host_numpy", host)

        def iterate():
            for _ in table.iterate(batch_size=b, device="cuda", prefetch=2, num_batches=50):
                pass
            ctx.sync()
            m = cfg.iter_batches
            t0 = time.perf_counter()
            count = 0
            for _ in table.iterate(batch_size=b, device="cuda", prefetch=2, num_batches=m):
                count += 1
            ctx.sync()
            el = time.perf_counter() - t0
            assert count == m
            log(f"  iterate(prefetch=2): {m / el:,.0f} batches/s")
            return {"batches": m, "seconds": el, "batches_per_s": m / el, "us_per_batch": el / m * 1e6,
                    "gbps": m * b * 400 / el / GB}
        guarded(ctx, out, "iterate_prefetch2", iterate)
    finally:
        wait_released()
        del table
        store.close()
        ctx.free()
    return out


def sec_sumtree(ctx: Ctx) -> dict:
    from reprise.torch.sum_tree import SumTree
    cfg = ctx.cfg
    n, b = cfg.tree_slots, cfg.tree_batch
    out = {"slots": n, "batch": b}

    def ours():
        res = {}
        tree = SumTree(n, ctx.dev)
        res["capacity"], res["levels"], res["use_triton"] = tree.capacity, tree.levels, tree.use_triton
        gen = torch.Generator(device=ctx.dev).manual_seed(0)
        chunk = 1 << 24
        ctx.sync()
        t0 = time.perf_counter()
        for start in range(0, n, chunk):
            stop = min(n, start + chunk)
            slots = torch.arange(start, stop, dtype=torch.int64, device=ctx.dev)
            w = torch.rand(stop - start, dtype=torch.float64, device=ctx.dev, generator=gen).add_(1e-3)
            tree.set(slots, w)
        ctx.sync()
        res["fill_s"] = time.perf_counter() - t0
        del slots, w
        total = float(tree.total())
        res["total"] = total
        assert total > 0
        pool = [torch.rand(b, dtype=torch.float64, device=ctx.dev, generator=gen).add_(1e-3) for _ in range(16)]
        state = {"k": 0}

        def rnd():
            tot = tree.total()
            u = torch.rand(b, dtype=torch.float64, device=ctx.dev, generator=gen) * tot
            slots = tree.find(u)
            probs = tree.get(slots) / tot
            k = state["k"] = (state["k"] + 1) % len(pool)
            tree.set(slots, pool[k])
            return slots, probs

        slots, probs = rnd()
        ctx.sync()
        assert int(slots.min()) >= 0 and int(slots.max()) < n, (int(slots.min()), int(slots.max()))
        assert float(probs.min()) > 0
        del slots, probs
        t = time_calls(ctx, rnd, 10, cfg.tree_repeats)
        res["round"] = summary(t)
        # Parts, for the record.
        u = torch.rand(b, dtype=torch.float64, device=ctx.dev, generator=gen) * tree.total()
        res["find_only"] = summary(time_calls(ctx, lambda: tree.find(u), 5, cfg.tree_repeats))
        sl = tree.find(u)
        res["set_only"] = summary(time_calls(ctx, lambda: tree.set(sl, pool[0]), 5, cfg.tree_repeats))
        res["what"] = (f"u = rand({b}) * total (device) -> find -> probabilities get/total -> set({b} new f64 "
                       "weights at the found slots) + synchronize; per-round host perf_counter")
        log(f"  SumTree({n:,}) round of {b}: {res['round']['us_median']:.0f} us median "
            f"(find {res['find_only']['us_median']:.0f} us, set {res['set_only']['us_median']:.0f} us; "
            f"fill {res['fill_s']:.1f} s)")
        del tree, pool, u, sl
        ctx.free()
        return res

    guarded(ctx, out, "reprise", ours)
    ctx.save()
    if ctx.trl is not None and not ctx.args.no_peers:
        r = guarded(ctx, out, "torchrl", ctx.trl.prioritized, n, b, ctx.peer_device, cfg.peer_prio_repeats)
        if "us_median" in r:
            log(f"  torchrl prioritized({n:,}, {b}): {r['us_median']:.0f} us median (fill {r.get('fill_s', 0):.1f} s)")
    return out


def sec_table_prio(ctx: Ctx) -> dict:
    import reprise as rp
    from reprise.torch.collect import wait_released
    cfg = ctx.cfg
    n = cfg.prio_items
    out = {"n_items": n, "batches": cfg.prio_batches, "exponent": 0.6, "field": "float32[1]"}
    rng = np.random.default_rng(2)
    prios = rng.random(n) + 1e-3
    data = rng.standard_normal((n, 1, 1), dtype=np.float32)

    def run(selection_device):
        res = {}
        store = rp.Store({"x": rp.Field((1,), "float32")}, capacity=n + 64, block_steps=64,
                         directory=ctx.args.store_dir)
        table = rp.Table("p", store, sampler=rp.selectors.Prioritized(0.6), remover=rp.selectors.Fifo(),
                         max_size=n, seed=0, selection_device=selection_device)
        try:
            t0 = time.perf_counter()
            for start in range(0, n, 65_536):
                stop = min(n, start + 65_536)
                table.insert({"x": data[start:stop]}, priorities=prios[start:stop])
            res["fill_s"] = time.perf_counter() - t0
            check_filled(table, n)
            t0 = time.perf_counter()
            s = table.sample(16, device="cuda")  # the first draw mirrors all n items
            ctx.sync()
            res["first_sample_s"] = time.perf_counter() - t0
            del s
            for b in cfg.prio_batches:
                pool = [rng.random(b) + 1e-3 for _ in range(16)]
                state = {"k": 0}

                def rnd():
                    s = table.sample(b, device="cuda")
                    k = state["k"] = (state["k"] + 1) % len(pool)
                    table.update_priorities(s.keys, pool[k])
                    return s

                def measure():
                    s = rnd()
                    ctx.sync()
                    assert tuple(s.data["x"].shape) == (b, 1, 1) and s.data["x"].device.type == ctx.dev.type
                    assert len(s.keys) == b
                    del s
                    t = time_calls(ctx, rnd, 5, cfg.prio_repeats)
                    r = summary(t)
                    log(f"  table Prioritized(0.6) {n:,} items, selection={selection_device or 'host'}: "
                        f"sample({b}, device='cuda') + update_priorities: {r['us_median']:.0f} us median")
                    return r
                guarded(ctx, res, f"b{b}", measure)
                wait_released()
        finally:
            wait_released()
            del table
            store.close()
            ctx.free()
        return res

    guarded(ctx, out, "reprise_gpu_selection", run, "cuda")
    guarded(ctx, out, "reprise_host_selection", run, None)
    ctx.save()
    if ctx.trl is not None and not ctx.args.no_peers:
        peer = out["torchrl"] = {}
        for b in cfg.prio_batches:
            r = guarded(ctx, peer, f"b{b}", ctx.trl.prioritized, n, b, ctx.peer_device, cfg.prio_repeats)
            if "us_median" in r:
                log(f"  torchrl prioritized({n:,}, {b}): {r['us_median']:.0f} us median")
    return out


def sec_device(ctx: Ctx) -> dict:
    import reprise as rp
    from reprise.torch.collect import wait_released
    cfg = ctx.cfg
    out = {"rows": cfg.dev_rows, "batches": cfg.dev_batches, "configs": {}}
    for row in cfg.dev_rows:
        k = row // 4
        n = cfg.n_items(row)
        cell = out["configs"][f"{row}B"] = {"row_bytes": row, "n_items": n, "store_bytes": n * row}
        log(f"  device store row {row} B: N = {n:,} items ({n * row / GB:.2f} GB)")

        def reprise_row():
            res = {}
            store = rp.Store({"x": rp.Field((k,), "float32")}, capacity=n + 64, block_steps=64, device="cuda",
                             directory=ctx.args.store_dir)
            table = rp.Table("d", store, sampler=rp.selectors.Uniform(), remover=rp.selectors.Fifo(),
                             max_size=n, seed=0)
            try:
                chunk = aligned_chunk(n, 65_536, (256 << 20) // row)
                gen = torch.Generator(device=ctx.dev).manual_seed(3)
                src = torch.randn(chunk, 1, k, device=ctx.dev, generator=gen)
                ones = np.ones(chunk)
                ctx.sync()
                t0 = time.perf_counter()
                done = 0
                while done < n:
                    m = min(chunk, n - done)
                    table.insert({"x": src[:m]}, priorities=ones[:m])
                    done += m
                ctx.sync()
                res["fill_s"] = time.perf_counter() - t0
                res["fill_gbps"] = n * row / res["fill_s"] / GB
                check_filled(table, n)
                del src
                for b in cfg.dev_batches:
                    def measure():
                        s = table.sample(b, device="cuda")
                        ctx.sync()
                        check_sample(s, b, k, ctx.dev)
                        del s
                        t = time_calls(ctx, lambda: table.sample(b, device="cuda"), 5, cfg.max_repeats,
                                       cfg.call_budget_s)
                        r = summary(t, b * row)
                        log(f"    reprise device store b={b}: {r['gbps']:.2f} GB/s ({r['us_median']:.0f} us)")
                        return r
                    guarded(ctx, res, f"b{b}", measure)
                    wait_released()
            finally:
                wait_released()
                del table
                store.close()
                ctx.free()
            return res

        guarded(ctx, cell, "reprise", reprise_row)
        ctx.save()
        if ctx.trl is not None and not ctx.args.no_peers:
            peer = cell["torchrl"] = {}
            for b in cfg.dev_batches:
                est = b * row / 500e9 + 200e-6
                reps = repeats_for(est, cfg.peer_call_budget_s / 2, 5 if cfg.quick else 20, 200)
                r = guarded(ctx, peer, f"b{b}", ctx.trl.collect_device, row, b, n, ctx.peer_device, reps)
                if "gbps" in r:
                    log(f"    torchrl collect_device b={b}: {r['gbps']:.2f} GB/s ({r['us_median']:.0f} us)")
        ctx.save()
    return out


# --- summary table ----------------------------------------------------------------------
def fmt(x, unit=""):
    if x is None:
        return "-"
    a = abs(x)
    s = f"{x:,.0f}" if a >= 100 else f"{x:.1f}" if a >= 10 else f"{x:.2f}"
    return f"{s} {unit}".strip()


def size_name(row: int) -> str:
    return f"{row // 1000} KB" if row >= 1000 else f"{row} B"


def cell_err(d) -> str | None:
    if isinstance(d, dict):
        if "error" in d:
            return "error: " + d["error"].splitlines()[0][:60]
        if "skipped" in d:
            return "skipped"
    return None


def summary_rows(results: dict) -> list[list[str]]:
    rows = []

    def add(workload, ours, peer, ratio, goal, met):
        rows.append([workload, ours, peer, ratio, goal, met])

    quick = results.get("header", {}).get("quick")
    emulated = results.get("header", {}).get("mode") == "cpu-emulated"

    def verdict(ok):
        if quick or emulated:
            return "n/a (quick)" if quick else "n/a (CPU)"
        return "-" if ok is None else ("yes" if ok else "NO")

    m = results.get("memcpy", {})
    for kind in (("pinned", "pageable") if "memcpy" in results else ()):
        v = m.get(kind, {}).get("gbps")
        add(f"H2D memcpy {kind}" + (f" {m['bytes'] >> 20} MiB" if m.get("bytes") else ""),
            fmt(v, "GB/s") if v else (cell_err(m) or "-"),
            "-", "-", "baseline", "-")

    col = results.get("collect", {})
    for rk, cell in col.get("configs", {}).items():
        row = cell["row_bytes"]
        rep, peer = cell.get("reprise", {}), cell.get("torchrl", {})
        for b in col.get("batches", []):
            r = rep.get(f"b{b}", {}) if isinstance(rep, dict) else {}
            p = peer.get(f"b{b}", {}) if isinstance(peer, dict) else {}
            g = r.get("sample", {}).get("gbps")
            pg = p.get("gbps")
            ours = fmt(g, "GB/s") if g else (cell_err(r) or cell_err(rep) or "-")
            if g and r.get("ratio_to_pinned_memcpy"):
                ours += f" ({r['ratio_to_pinned_memcpy']:.2f}x memcpy)"
            ratio = g / pg if g and pg else None
            add(f"collect host->GPU {size_name(row)} x {b} (N={cell['n_items']:,})", ours,
                fmt(pg, "GB/s") if pg else (cell_err(p) or ("-" if not peer else cell_err(peer) or "-")),
                f"{ratio:.2f}x" if ratio else "-", ">= 3x", verdict(None if ratio is None else ratio >= 3))

    if "latency" in results:
        lat = results.get("latency", {})
        r = lat.get("sample_to_device", {})
        med = r.get("us_median")
        peer = (col.get("configs", {}).get("400B", {}).get("torchrl", {}) or {}).get("b256", {})
        pm = peer.get("us_median") if isinstance(peer, dict) else None
        add("latency sample 256 x 400 B -> GPU (median)",
            f"{fmt(med, 'us')} (p99 {fmt(r.get('us_p99'), 'us')})" if med else (cell_err(r) or cell_err(lat) or "-"),
            fmt(pm, "us") if pm else "-", f"{pm / med:.2f}x" if med and pm else "-", "<= 50 us",
            verdict(None if med is None else med <= 50))
        it = lat.get("iterate_prefetch2", {})
        add("iterate prefetch=2, 256 x 400 B", fmt(it.get("batches_per_s"), "batches/s") if it.get("batches_per_s")
            else (cell_err(it) or "-"), "-", "-", "-", "-")

    if "sumtree" in results:
        st = results.get("sumtree", {})
        r, p = st.get("reprise", {}), st.get("torchrl", {})
        us = r.get("round", {}).get("us_median") if isinstance(r, dict) else None
        pus = p.get("us_median") if isinstance(p, dict) else None
        ratio = pus / us if us and pus else None
        ok = None if us is None else (us <= 1000 and (ratio is None or ratio >= 3))
        add(f"prioritized {st.get('slots', 0):,} slots: find+set {st.get('batch', 0):,} (SumTree)",
            fmt(us, "us") if us else (cell_err(r) or cell_err(st) or "-"),
            fmt(pus, "us") if pus else (cell_err(p) or "-"), f"{ratio:.2f}x" if ratio else "-",
            "<= 1 ms, >= 3x", verdict(ok))

    tp = results.get("table_prio", {})
    peer = tp.get("torchrl", {})
    for b in tp.get("batches", []):
        for key, label in (("reprise_gpu_selection", "GPU selection"), ("reprise_host_selection", "host selection")):
            rr = tp.get(key, {})
            r = rr.get(f"b{b}", {}) if isinstance(rr, dict) else {}
            us = r.get("us_median")
            p = peer.get(f"b{b}", {}) if isinstance(peer, dict) else {}
            pus = p.get("us_median")
            ratio = pus / us if us and pus else None
            add(f"table prioritized {tp.get('n_items', 0):,} items, {label}: sample {b:,} + update",
                fmt(us, "us") if us else (cell_err(r) or cell_err(rr) or "-"),
                fmt(pus, "us") if pus else (cell_err(p) or "-"), f"{ratio:.2f}x" if ratio else "-", "report", "-")

    dv = results.get("device", {})
    for rk, cell in dv.get("configs", {}).items():
        row = cell["row_bytes"]
        rep, peer = cell.get("reprise", {}), cell.get("torchrl", {})
        for b in dv.get("batches", []):
            r = rep.get(f"b{b}", {}) if isinstance(rep, dict) else {}
            p = peer.get(f"b{b}", {}) if isinstance(peer, dict) else {}
            g, pg = r.get("gbps"), p.get("gbps")
            ratio = g / pg if g and pg else None
            add(f"device store {size_name(row)} x {b} (N={cell['n_items']:,})",
                fmt(g, "GB/s") if g else (cell_err(r) or cell_err(rep) or "-"),
                fmt(pg, "GB/s") if pg else (cell_err(p) or "-"), f"{ratio:.2f}x" if ratio else "-", ">= 1x",
                verdict(None if ratio is None else ratio >= 1))
    return rows


def markdown(results: dict) -> str:
    h = results.get("header", {})
    lines = [f"GPU benchmark {h.get('date', '')} on {h.get('hostname', '?')}: {h.get('gpu', '?')}; "
             f"torch {h.get('torch')}, triton {h.get('triton')}, reprise {h.get('reprise')}, "
             f"torchrl {(h.get('torchrl') or {}).get('torchrl', 'n/a')}"
             + (" (QUICK: numbers are noise)" if h.get("quick") else ""), "",
             "| workload | reprise | peer (TorchRL) | ratio | goal | met? |",
             "|---|---|---|---|---|---|"]
    for r in summary_rows(results):
        lines.append("| " + " | ".join(r) + " |")
    lines += ["", "collect: `table.sample(b, device=\"cuda\")` from a host shared-memory store (host selection, "
              "GPU gather from registered memory, synchronize) vs TorchRL `ReplayBuffer(LazyTensorStorage(cpu), "
              "pin_memory=True).sample().to(\"cuda\", non_blocking=True)`; same N, rows, batches. "
              "device store: `Store(device=\"cuda\")` vs `LazyTensorStorage(device=\"cuda\")`. "
              "SumTree: find + probabilities + set of the batch on the GPU vs TorchRL `PrioritizedSampler` "
              "sample + `update_priority` (see `path` in the JSON). Times are medians, each call closed by "
              "a synchronize."]
    errors = {k: v["error"] for k, v in results.items() if isinstance(v, dict) and "error" in v}
    if errors:
        lines.append("")
        for k, e in errors.items():
            lines.append(f"- {k}: {e}")
    return "\n".join(lines)


# --- main -------------------------------------------------------------------------------
def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="tiny sizes: checks the script, numbers are noise")
    ap.add_argument("--device", choices=("cuda", "cpu-emulated"), default="cuda",
                    help="cpu-emulated: reprise.torch.emulate_cuda(True), TorchRL on 'cpu', no memcpy")
    ap.add_argument("--out", default=None, help="JSON path (default benchmarks/out/gpu-<timestamp>.json)")
    ap.add_argument("--only", default=None, help=f"comma list of sections: {','.join(SECTIONS)}")
    ap.add_argument("--no-peers", action="store_true", help="skip TorchRL")
    ap.add_argument("--budget", type=float, default=540.0,
                    help="seconds; measurements that would start later are skipped (default 540)")
    ap.add_argument("--store-dir", default=None, help="directory of the host stores' files (default /dev/shm)")
    ap.add_argument("--rows", default=None, help="override the collect row sizes in bytes, e.g. 400,400000")
    ap.add_argument("--batches", default=None, help="override the collect batch sizes, e.g. 256,4096")
    args = ap.parse_args()
    if args.out is None:
        stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
        args.out = os.path.join(HERE, "out", f"gpu-{stamp}{'-quick' if args.quick else ''}.json")
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
            import torchrl_gpu
            ctx.trl = torchrl_gpu
        except BaseException as e:  # noqa: BLE001 - record and go on without the peer
            ctx.trl_error = f"import torchrl_gpu failed: {type(e).__name__}: {e}"
            ctx.results["torchrl_import_error"] = {"error": ctx.trl_error, "traceback": traceback.format_exc()}
            log(f"TorchRL unavailable: {ctx.trl_error}")
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
