"""The GPU benchmark's summary table (``benchmarks.gpu.compare``): one row per workload,
Reprise against TorchRL, with the goal and whether it was met."""

from __future__ import annotations

from benchmarks.common.report import md_row


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
            huge = cell.get("reprise_huge")
            if isinstance(huge, dict) and huge:
                h = huge.get(f"b{b}", {})
                hg, hm = h.get("sample", {}).get("gbps"), h.get("ratio_to_pinned_memcpy")
                add(f"collect host->GPU {size_name(row)} x {b}, store on 2 MiB pages",
                    (fmt(hg, "GB/s") + (f" ({hm:.2f}x memcpy)" if hm else "")) if hg
                    else (cell_err(h) or cell_err(huge) or "-"),
                    fmt(pg, "GB/s") if pg else "-", f"{hg / pg:.2f}x" if hg and pg else "-",
                    ">= 0.90x memcpy" if b >= 1024 else "-",
                    verdict(None if not hm or b < 1024 else hm >= 0.9))

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
        rs = lat.get("resident", {})
        for b in (256, 1024, 4096):
            r = rs.get(f"b{b}", {}) if isinstance(rs, dict) else {}
            med = r.get("us_median")
            peer = (col.get("configs", {}).get("400B", {}).get("torchrl", {}) or {}).get(f"b{b}", {})
            pm = peer.get("us_median") if isinstance(peer, dict) else None
            goal, ok = ">= 1.5x", (None if not (med and pm) else pm / med >= 1.5)
            if b == 256:
                goal = ">= 1.5x, <= 50 us (p99 <= 100)"
                ok = None if med is None else ((ok is None or ok) and med <= 50 and r.get("us_p99", 1e9) <= 100)
            add(f"latency sample {b} x 400 B -> GPU, device-resident (median)",
                f"{fmt(med, 'us')} (p99 {fmt(r.get('us_p99'), 'us')})" if med else (cell_err(r) or cell_err(rs) or "-"),
                fmt(pm, "us") if pm else "-", f"{pm / med:.2f}x" if med and pm else "-", goal, verdict(ok))
        sg = rs.get("static_graph", {}) if isinstance(rs, dict) else {}
        if isinstance(sg, dict) and sg:
            med = sg.get("us_median")
            peer = (col.get("configs", {}).get("400B", {}).get("torchrl", {}) or {}).get("b256", {})
            pm = peer.get("us_median") if isinstance(peer, dict) else None
            add("static sample 256 x 400 B: admit + CUDA graph replay (median)",
                f"{fmt(med, 'us')} (p99 {fmt(sg.get('us_p99'), 'us')})" if med else (cell_err(sg) or "-"),
                fmt(pm, "us") if pm else "-", f"{pm / med:.2f}x" if med and pm else "-",
                "<= 50 us (p99 <= 100)", verdict(None if med is None else med <= 50 and sg.get("us_p99", 1e9) <= 100))
        ch = rs.get("churn32", {}) if isinstance(rs, dict) else {}
        if isinstance(ch, dict) and ch:
            both, ins = ch.get("insert_and_sample", {}), ch.get("insert", {})
            bm, im = both.get("us_median"), ins.get("us_median")
            add("latency 32 inserts + sample 256 x 400 B -> GPU, device-resident (median)",
                f"{fmt(bm, 'us')} (inserts alone {fmt(im, 'us')})" if bm and im else (cell_err(ch) or "-"),
                "-", "-", "-", "-")
        tr = rs.get("transition", {}) if isinstance(rs, dict) else {}
        if isinstance(tr, dict) and tr:
            fused, per = tr.get("fused", {}), tr.get("per_field", {})
            fm, pm = fused.get("us_median"), per.get("us_median")
            add(f"latency sample 256 x {tr.get('row_bytes', '?')} B transitions (5 fields), fused gather (median)",
                f"{fmt(fm, 'us')} (p99 {fmt(fused.get('us_p99'), 'us')})" if fm else (cell_err(fused) or cell_err(tr)
                                                                                   or "-"),
                "-", f"{pm / fm:.2f}x vs per field" if fm and pm else "-", "-", "-")
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
        peer = cell.get("torchrl", {})
        for key, label in (("reprise", ""), ("reprise_resident", ", device-resident")):
            rep = cell.get(key, {})
            for b in dv.get("batches", []):
                r = rep.get(f"b{b}", {}) if isinstance(rep, dict) else {}
                p = peer.get(f"b{b}", {}) if isinstance(peer, dict) else {}
                g, pg = r.get("gbps"), p.get("gbps")
                ratio = g / pg if g and pg else None
                add(f"device store {size_name(row)} x {b} (N={cell['n_items']:,}){label}",
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
    lines += [md_row(r) for r in summary_rows(results)]
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
