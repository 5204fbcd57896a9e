"""The checkpoint benchmark's markdown report (``benchmarks.checkpoint.compare``): save
and load rates, writer and sampler throughput during a save, and dm-reverb's checkpoint
beside Reprise's."""

from __future__ import annotations

import statistics

import numpy as np
import reprise as rp


def gbs(x):
    return f"{x:.2f}"


def pct(x):
    return "—" if x is None else f"{100 * x:.0f}%"


def build_markdown(rep: dict) -> str:
    h, c = rep["host"], rep["config"]
    out = [f"# Checkpoints, {rep['date']}" + (" (QUICK: small, noisy)" if rep["quick"] else ""), "",
           f"Machine: {h.get('cpu_model', '?')}, {h['cpus']} cores, {h.get('mem_gib', '?')} GiB; "
           f"{h['platform']}; checkpoints in {c['dir']}.",
           f"Disk baseline (one {rep['disk']['bytes'] / 2**30:.3g} GiB file): write + fsync "
           f"{gbs(rep['disk']['write_fsync_gb_per_s'])} GB/s, cold read {gbs(rep['disk']['cold_read_gb_per_s'])} GB/s.",
           "Load average (1 min) at start / before Reverb / end: "
           + " / ".join(f"{v:.2f}" for v in rep["loadavg_1m"].values()) + ".",
           f"Versions: reprise {rp.__version__}, numpy {np.__version__}, zstandard {c.get('zstandard') or 'missing'}.",
           "", "## 1. Save and load", "",
           "GB/s = step data (steps x 4096 B) / seconds; median of "
           f"{c['rounds']} (zstd: {c['zstd_rounds']}). Save includes fsync. Cold load: the checkpoint's files dropped from the page "
           "cache first (resident fraction checked with fincore); warm: left cached.", "",
           "| data | compression | steps | on disk | save GB/s | load GB/s cold | load GB/s warm |",
           "|---|---|---|---|---|---|---|"]
    for key, e in rep["save_load"].items():
        s, lo = e["save"], e["load"]
        cold = lo.get("cold", {})
        warm = lo.get("warm", {})
        out.append(f"| {e['data']} | {e['compression'] or 'none'} | {e['steps']:,} | "
                   f"{s['bytes_on_disk'] / 1e9:.2f} GB ({s['bytes_on_disk'] / s['data_bytes']:.0%}) | "
                   f"{gbs(s['gb_per_s'])} ({s['median_s']:.1f} s) | "
                   + (f"{gbs(cold['gb_per_s'])} ({cold['median_s']:.1f} s; cached before: "
                      f"{max(cold['resident_before']):.0%})" if cold else "—") + " | "
                   + (f"{gbs(warm['gb_per_s'])} ({warm['median_s']:.1f} s)" if warm else "—") + " |")
    out += ["", "## 2. Writer and sampler throughput during a save", "",
            f"Threads in one process: writer `insert` 256 x 4 KB, sampler `sample(256)`; items/s over "
            f"{c['window']} s without a save, then over a save of the whole table; median of {c['rounds']} rounds.", "",
            "| store | writer without | writer during | writer % | sampler without | sampler during | sampler % | save s (idle) | writer: store full for | new items kept at the end / FIFO would keep | CPU cores busy without / during |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    for key, e in rep["during"].items():
        idle = rep["save_load"].get("random-none", {}).get("save", {}).get("median_s")
        out.append(f"| {e['label']} | {e['writer_items_per_s_without']:,.0f} | {e['writer_items_per_s_during']:,.0f} | "
                   f"**{pct(e['writer_ratio'])}** | {e['sampler_items_per_s_without']:,.0f} | "
                   f"{e['sampler_items_per_s_during']:,.0f} | **{pct(e['sampler_ratio'])}** | "
                   f"{e['save_s']:.1f} ({'—' if idle is None else f'{idle:.1f}'}) | "
                   f"{e['writer_store_full_span_s']:.1f} s | {e['new_items_kept']:,.0f} / {e['new_items_fifo_would_keep']:,.0f} | "
                   f"{e['cores_busy_without']:.2f} / {e['cores_busy_during']:.2f} |")
    rv = rep.get("reverb", {})
    out += ["", "## 3. dm-reverb", ""]
    if "checkpoint_idle" not in rv:
        out.append(f"not run: {rv.get('skipped') or rv.get('error')}")
    else:
        ci, d, rs = rv["checkpoint_idle"], rv["during"], rv.get("restore", {})
        scale = c["steps"] / rv["items"]
        mine = rep["save_load"].get("random-none", {})
        out += [f"{rv['items']:,} items of 4 KB ({rv['data_bytes'] / 1e9:.2f} GB; Reprise above: {c['steps']:,}). "
                f"Server in its own process, `DefaultCheckpointer`, `client.checkpoint()`; "
                f"writer: {rv['path']['fill']}; sampler: {rv['path']['sampler']}. "
                f"Versions: " + ", ".join(f"{k} {v}" for k, v in rv["versions"].items()) + ".", "",
                "| | Reverb | Reprise | Reprise / Reverb |", "|---|---|---|---|",
                f"| checkpoint GB/s (idle) | {gbs(ci['gb_per_s'])} ({ci['median_s']:.1f} s; "
                f"{scale:.0f}x the items: ~{ci['median_s'] * scale:.0f} s) | "
                + (f"{gbs(mine['save']['gb_per_s'])} ({mine['save']['median_s']:.1f} s) | "
                   f"{mine['save']['gb_per_s'] / ci['gb_per_s']:.0f}x |" if mine else "— | |"),
                f"| dirty page cache when the call returned | {ci['dirty_mib_after'][-1]:.0f} MiB (not fsynced) | every file fsynced | |"]
        if rs:
            out.append(f"| load GB/s, cold (Reverb: server constructor) | {gbs(rs['gb_per_s'])} ({rs['constructor_s']:.1f} s) | "
                       + (f"{gbs(mine['load']['cold']['gb_per_s'])} | {mine['load']['cold']['gb_per_s'] / rs['gb_per_s']:.0f}x |"
                          if mine and "cold" in mine["load"] else "— | |"))
        ref = rep["during"].get("headroom") or rep["during"].get("full") or {}
        out.append(f"| writer during checkpoint, % of without | {pct(d['writer_ratio'])} "
                   f"({d['writer_items_per_s_during']:,.0f} / {d['writer_items_per_s_without']:,.0f} items/s) | "
                   + "; ".join(f"{v['label'].split(' (')[0]}: {pct(v['writer_ratio'])}" for v in rep["during"].values()) + " | |")
        out.append(f"| sampler during checkpoint, % of without | {pct(d['sampler_ratio'])} "
                   f"({d['sampler_items_per_s_during']:,.0f} / {d['sampler_items_per_s_without']:,.0f} items/s) | "
                   + "; ".join(f"{v['label'].split(' (')[0]}: {pct(v['sampler_ratio'])}" for v in rep["during"].values()) + " | |")
        out.append(f"| longest writer / sampler pause during | {d['writer_longest_gap_during_s']:.2f} / "
                   f"{d['sampler_longest_gap_during_s']:.2f} s | "
                   + (f"{statistics.median(r['writer_longest_gap_during_s'] for r in ref['rounds']):.2f} / "
                      f"{statistics.median(r['sampler_longest_gap_during_s'] for r in ref['rounds']):.2f} s ({ref['label'].split(' (')[0]}) |"
                      if ref else "— |") + " |")
        out.append(f"| checkpoint under load | {d['checkpoint_s']:.1f} s | | |")
    out.append("")
    return "\n".join(out) + "\n"
