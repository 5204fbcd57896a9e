"""The GPU benchmark's prioritized sections (``benchmarks.gpu.compare``): the GPU sum
tree alone, and the table API with GPU selection; each with its TorchRL peer."""

from __future__ import annotations

import time

import numpy as np
import torch

from benchmarks.common.timing import call_summary
from benchmarks.gpu.context import Ctx, check_filled, guarded, log


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
        t = ctx.time_calls(rnd, 10, cfg.tree_repeats)
        res["round"] = call_summary(t)
        # Parts, for the record.
        u = torch.rand(b, dtype=torch.float64, device=ctx.dev, generator=gen) * tree.total()
        res["find_only"] = call_summary(ctx.time_calls(lambda: tree.find(u), 5, cfg.tree_repeats))
        sl = tree.find(u)
        res["set_only"] = call_summary(ctx.time_calls(lambda: tree.set(sl, pool[0]), 5, cfg.tree_repeats))
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
                    t = ctx.time_calls(rnd, 5, cfg.prio_repeats)
                    r = call_summary(t)
                    log(f"  table Prioritized(0.6) {n:,} items, selection={selection_device or 'host'}: "
                        f"sample({b}, device='cuda') + update_priorities: {r['us_median']:.0f} us median")
                    return r
                guarded(ctx, res, f"b{b}", measure)
                wait_released()
        finally:
            del table
            ctx.close_store(store)
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
