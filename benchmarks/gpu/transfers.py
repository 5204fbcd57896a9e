"""The GPU benchmark's transfer sections (``benchmarks.gpu.compare``): host->device
memcpy (the baseline), collecting host-store samples onto the GPU, the latency of one
small sample, and device-resident stores; each with its TorchRL peer where it has one."""

from __future__ import annotations

import time

import numpy as np
import torch

from benchmarks.common.timing import call_summary
from benchmarks.gpu.context import (GB, Ctx, aligned_chunk, check_sample, fill_host_table,
                                    fill_table, guarded, host_store, log, n_items, pinned_gbps,
                                    repeats_for, space_for_stores, time_iterate)


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
    t = ctx.time_calls(lambda: dst.copy_(pinned, non_blocking=True), 3, cfg.memcpy_repeats)
    out["pinned"] = call_summary(t, n)
    t = event_times(lambda: dst.copy_(pinned, non_blocking=True), 3, cfg.memcpy_repeats)
    out["pinned_events"] = call_summary(t, n)
    t = ctx.time_calls(lambda: dst.copy_(pageable, non_blocking=True), 3, cfg.memcpy_repeats)
    out["pageable"] = call_summary(t, n)
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
        t = ctx.time_calls(lambda: d.copy_(p, non_blocking=True), 3, cfg.memcpy_repeats)
        by[str(s)] = call_summary(t, s)
    out["pinned_by_bytes"] = by
    del src, pinned, pageable, dst
    ctx.free()
    return out



def sec_collect(ctx: Ctx) -> dict:
    import reprise as rp
    cfg = ctx.cfg
    out = {"batches": cfg.batches, "rows": cfg.rows, "configs": {}}
    space = space_for_stores(ctx)
    rng = np.random.default_rng(0)
    for row in cfg.rows:
        k = row // 4
        n = n_items(cfg, row, space)
        rk = f"{row}B"
        cell = out["configs"][rk] = {"row_bytes": row, "n_items": n, "store_bytes": n * row}
        log(f"  row {row} B: N = {n:,} items ({n * row / GB:.2f} GB)")

        def reprise_row(huge=False):
            res = {}
            store = host_store(ctx, k, n, huge=huge)
            if huge:
                res["huge_page_bytes_after_fill"] = None
            table = rp.Table("t", store, sampler=rp.selectors.Uniform(), remover=rp.selectors.Fifo(),
                             max_size=n, seed=0)
            try:
                res["fill_s"] = fill_host_table(ctx, table, k, n, rng)
                res["fill_gbps"] = n * row / res["fill_s"] / GB
                if huge:
                    res["huge_page_bytes_after_fill"] = store.huge_page_bytes
                for b in cfg.batches:
                    guarded(ctx, res, f"b{b}", reprise_config, ctx, store, table, k, n, b)
            finally:
                del table
                ctx.close_store(store)
            return res

        guarded(ctx, cell, "reprise", reprise_row)
        ctx.save()
        if ctx.args.huge_dir and row >= 4000:
            # The same store on 2 MiB pages: does the GPU's TLB reach hold the 4 KB gather back?
            guarded(ctx, cell, "reprise_huge", reprise_row, True)
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
    t = ctx.time_calls(lambda: table.sample(b, device="cuda"), 5, cfg.max_repeats, cfg.call_budget_s)
    res["sample"] = call_summary(t, nbytes)
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
        t = ctx.time_calls(lambda: torch.index_select(view, 0, idx), 3, cfg.max_repeats, cfg.call_budget_s / 2)
        return call_summary(t, nbytes)
    guarded(ctx, res, "gather_only", gather_alone)

    # Prefetching iteration.
    m = repeats_for(res["sample"]["us_median"] / 1e6, cfg.call_budget_s, 10, 1000)
    guarded(ctx, res, "iterate_prefetch2", time_iterate, ctx, table, b, m, 5, row)
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
            t = ctx.time_calls(lambda: table.sample(b, device="cuda"), 100, cfg.latency_repeats)
            r = call_summary(t, b * 400)
            log(f"  sample({b}) -> GPU: median {r['us_median']:.1f} us, p99 {r['us_p99']:.1f} us")
            return r
        guarded(ctx, out, "sample_to_device", gpu)
        wait_released()

        def host():
            t = ctx.time_calls(lambda: table.sample(b), 100, cfg.latency_repeats)
            r = call_summary(t, b * 400)
            log(f"  sample({b}) host numpy: median {r['us_median']:.1f} us, p99 {r['us_p99']:.1f} us")
            return r
        guarded(ctx, out, "sample_host_numpy", host)

        r = guarded(ctx, out, "iterate_prefetch2", time_iterate, ctx, table, b, cfg.iter_batches, 50, 400)
        if "batches_per_s" in r:
            log(f"  iterate(prefetch=2): {r['batches_per_s']:,.0f} batches/s")
    finally:
        del table
        ctx.close_store(store)
    guarded(ctx, out, "resident", latency_resident, ctx, k, n)
    return out


def latency_resident(ctx: Ctx, k: int, n: int) -> dict:
    """The same store and items in a table with GPU selection, whose draws are
    device-resident (``reprise.torch.resident``): ``sample(b, device="cuda")`` for b in
    256/1024/4096, median and p99 of each."""
    import reprise as rp
    from reprise.torch.collect import wait_released
    cfg = ctx.cfg
    res = {}
    store = host_store(ctx, k, n)
    table = rp.Table("t", store, sampler=rp.selectors.Uniform(), remover=rp.selectors.Fifo(), max_size=n, seed=0,
                     selection_device="cuda")
    try:
        res["fill_s"] = fill_host_table(ctx, table, k, n, np.random.default_rng(1))
        for b in (256, 1024, 4096):
            def measure():
                s = table.sample(b, device="cuda")
                check_sample(s, b, k, ctx.dev)
                del s
                t = ctx.time_calls(lambda: table.sample(b, device="cuda"), 100, cfg.latency_repeats)
                r = call_summary(t, b * 400)
                log(f"  resident sample({b}) -> GPU: median {r['us_median']:.1f} us, p99 {r['us_p99']:.1f} us")
                return r
            guarded(ctx, res, f"b{b}", measure)
            wait_released()
        guarded(ctx, res, "static_graph", static_graph, ctx, table, k)
        wait_released()
        guarded(ctx, res, "churn32", resident_churn, ctx, table, k)
        wait_released()
    finally:
        del table
        ctx.close_store(store)
    guarded(ctx, res, "transition", resident_transition, ctx, n)
    return res


def resident_churn(ctx: Ctx, table, k: int) -> dict:
    """Actors at work: 32 inserts (evicting 32 items: 32 changed slots for the
    mirror) before each ``sample(256, device="cuda")``; the inserts alone for
    reference. Median and p99 of each."""
    b, m = 256, 32
    src = np.random.default_rng(3).standard_normal((m, 1, k), dtype=np.float32)
    ones = np.ones(m)

    def insert():
        table.insert({"x": src}, priorities=ones)

    def step():
        insert()
        table.sample(b, device="cuda")
    out = {"inserts_per_sample": m, "batch": b}
    for label, fn in (("insert_and_sample", step), ("insert", insert)):
        t = ctx.time_calls(fn, 100, ctx.cfg.latency_repeats)
        out[label] = call_summary(t, b * 4 * k)
        log(f"  resident churn, {label}: median {out[label]['us_median']:.1f} us, p99 {out[label]['us_p99']:.1f} us")
    return out


def static_graph(ctx: Ctx, table, k: int) -> dict:
    """``table.static_sample(256)``: ``admit()`` then the replay of a CUDA graph that
    captured ``draw()`` (emulated: ``admit().draw()``), median and p99 per step."""
    b = 256
    s = table.static_sample(b)
    try:
        if ctx.dev.type == "cuda":
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                s.admit().draw()
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = s.draw()

            def step():
                s.admit()
                graph.replay()
        else:
            out = s.admit().draw()

            def step():
                s.admit().draw()
        step()
        ctx.sync()
        assert tuple(out.data["x"].shape) == (b, 1, k) and float(out.data["x"].abs().sum()) > 0
        t = ctx.time_calls(step, 100, ctx.cfg.latency_repeats)
        r = call_summary(t, b * 4 * k)
        how = "admit + graph replay" if ctx.dev.type == "cuda" else "admit + draw (no graph)"
        log(f"  static sample({b}), {how}: median {r['us_median']:.1f} us, p99 {r['us_p99']:.1f} us")
        return r
    finally:
        s.close()


TRANSITION = {"observation": ((84,), "float32"), "action": ((), "int64"), "reward": ((), "float32"),
              "discount": ((), "float32"), "done": ((), "bool")}


def resident_transition(ctx: Ctx, n: int) -> dict:
    """Device-resident ``sample(256, device="cuda")`` of transitions of five fields
    (353 B: observation float32[84], action, reward, discount, done), gathered by the
    fused kernel (two launches: int64 and int32 words, then uint8) and by one
    ``index_select`` per field, median and p99 of each."""
    import reprise as rp
    from reprise.torch import gather_kernels
    from reprise.torch.collect import wait_released
    cfg = ctx.cfg
    b, row = 256, sum(int(np.prod(s)) * np.dtype(d).itemsize for s, d in TRANSITION.values())
    res = {"row_bytes": row, "batch": b, "fields": list(TRANSITION)}
    store = rp.Store({k: rp.Field(s, d) for k, (s, d) in TRANSITION.items()}, capacity=n + 64, block_steps=64,
                     directory=ctx.args.store_dir)
    table = rp.Table("t", store, sampler=rp.selectors.Uniform(), remover=rp.selectors.Fifo(), max_size=n, seed=0,
                     selection_device="cuda")
    try:
        rng = np.random.default_rng(2)
        chunk = aligned_chunk(n, 65_536, (64 << 20) // row)
        fill_table(ctx, table, {k: rng.integers(0, 2, (chunk, 1, *s)).astype(d)
                                for k, (s, d) in TRANSITION.items()}, n)
        for label, enabled in (("fused", None), ("per_field", False)):
            def measure():
                gather_kernels.ENABLED = enabled
                s = table.sample(b, device="cuda")
                assert tuple(s.data["observation"].shape) == (b, 1, 84), s.data["observation"].shape
                del s
                t = ctx.time_calls(lambda: table.sample(b, device="cuda"), 100, cfg.latency_repeats)
                r = call_summary(t, b * row)
                log(f"  resident transition sample({b}), {label} gather: median {r['us_median']:.1f} us, "
                    f"p99 {r['us_p99']:.1f} us")
                return r
            try:
                guarded(ctx, res, label, measure)
            finally:
                gather_kernels.ENABLED = None
            wait_released()
    finally:
        del table
        ctx.close_store(store)
    return res



def sec_device(ctx: Ctx) -> dict:
    import reprise as rp
    from reprise.torch.collect import wait_released
    cfg = ctx.cfg
    out = {"rows": cfg.dev_rows, "batches": cfg.dev_batches, "configs": {}}
    for row in cfg.dev_rows:
        k = row // 4
        n = n_items(cfg, row)
        cell = out["configs"][f"{row}B"] = {"row_bytes": row, "n_items": n, "store_bytes": n * row}
        log(f"  device store row {row} B: N = {n:,} items ({n * row / GB:.2f} GB)")

        def reprise_row(selection_device=None):
            res = {}
            store = rp.Store({"x": rp.Field((k,), "float32")}, capacity=n + 64, block_steps=64, device="cuda",
                             directory=ctx.args.store_dir)
            table = rp.Table("d", store, sampler=rp.selectors.Uniform(), remover=rp.selectors.Fifo(),
                             max_size=n, seed=0, selection_device=selection_device)
            try:
                chunk = aligned_chunk(n, 65_536, (256 << 20) // row)
                gen = torch.Generator(device=ctx.dev).manual_seed(3)
                res["fill_s"] = fill_table(ctx, table, {"x": torch.randn(chunk, 1, k, device=ctx.dev,
                                                                         generator=gen)}, n)
                res["fill_gbps"] = n * row / res["fill_s"] / GB
                for b in cfg.dev_batches:
                    def measure():
                        s = table.sample(b, device="cuda")
                        ctx.sync()
                        check_sample(s, b, k, ctx.dev)
                        del s
                        t = ctx.time_calls(lambda: table.sample(b, device="cuda"), 5, cfg.max_repeats,
                                       cfg.call_budget_s)
                        r = call_summary(t, b * row)
                        log(f"    reprise device store b={b}: {r['gbps']:.2f} GB/s ({r['us_median']:.0f} us)")
                        return r
                    guarded(ctx, res, f"b{b}", measure)
                    wait_released()
            finally:
                del table
                ctx.close_store(store)
            return res

        guarded(ctx, cell, "reprise", reprise_row)
        guarded(ctx, cell, "reprise_resident", reprise_row, "cuda")  # GPU selection: device-resident draws
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
