"""Summaries and markdown of the aggregation benchmark (``aggregation.py``).

A round's latency is ``max(end) - max(start)`` over the workers (from the last worker's call to
the last worker's result); medians and p99 over the timed rounds (numpy, linear interpolation;
with 60 rounds p99 is close to the maximum). Goodput = gradient bytes x 8 / median latency.
"""

from __future__ import annotations

import numpy as np

from benchmarks.common.report import machine_lines, md_row, md_table

GOAL_LATENCY_RATIO = 0.5        # daemon <= 0.5 x gloo, gradients <= 158 KB, 4 workers
GOAL_LATENCY_MAX_BYTES = 158_000
GOAL_LATENCY_WORKERS = 4
GOAL_GB_PER_CORE = 1.0          # aggregated input GB/s per daemon core
GOAL_LOSS_RATIO = 3.0           # p99 with 1% loss <= 3 x lossless median
LABELS = {"daemon-f32": "daemon f32", "daemon-i32": "daemon i32", "ps": "TCP PS", "gloo": "gloo ring",
          "lossless": "lossless", "loss": "1% loss"}


def parse_size(text: str | int) -> int:
    """``40K`` -> 40000, ``3M`` -> 3000000 (decimal), rounded down to whole float32 values."""
    if isinstance(text, int):
        return text - text % 4
    t = text.strip().upper().removesuffix("B")
    mult = {"K": 1_000, "M": 1_000_000, "G": 1_000_000_000}.get(t[-1:], 1)
    n = int(float(t[:-1] if t[-1:] in "KMG" else t) * mult)
    return n - n % 4


def size_label(n: int | str) -> str:
    n = int(n)
    if n >= 1_000_000:
        return f"{n / 1e6:g} MB"
    if n >= 1_000:
        return f"{n / 1e3:g} KB"
    return f"{n} B"


def summarize_config(ranks: list[dict], systems: list[str], sizes: list[int]) -> dict:
    out = {}
    for name in systems:
        errs = [f"worker {r.get('rank')}: {r['errors'][k]}" for r in ranks for k in (name, "*")
                if k in r.get("errors", {})]
        s: dict = {"sizes": {}}
        if errs:
            s["error"] = "\n".join(errs)[:6000]
        for size in sizes:
            key = str(size)
            ts = [r.get("results", {}).get(name, {}).get(key, {}) for r in ranks]
            n = min((len(t.get("t", [])) for t in ts), default=0)
            checks = [r.get("checks", {}).get(name, {}).get(key) for r in ranks]
            entry: dict = {}
            if all(c is not None for c in checks) and checks:
                entry["max_abs_err"] = max(checks)
                if max(checks) != 0:
                    s.setdefault("error", f"wrong sum at {size_label(size)}: max |error| {max(checks)}")
            if n == 0:
                s["sizes"][key] = entry | {"n": 0}
                continue
            wrong = sum(t.get("wrong", 0) for t in ts)
            entry["wrong_results"] = wrong
            if wrong:
                s.setdefault("error", f"{wrong} of {n * len(ts)} timed results at {size_label(size)} were not the "
                                      "exact sum")
            t0 = np.array([[t["t"][k][0] for k in range(n)] for t in ts])
            t1 = np.array([[t["t"][k][1] for k in range(n)] for t in ts])
            lat = t1.max(axis=0) - t0.max(axis=0)
            p50 = float(np.percentile(lat, 50))
            entry.update(n=n, p50_us=p50 * 1e6, p99_us=float(np.percentile(lat, 99)) * 1e6,
                         p10_us=float(np.percentile(lat, 10)) * 1e6, mean_us=float(lat.mean()) * 1e6,
                         max_us=float(lat.max()) * 1e6, goodput_gbit_s=size * 8 / p50 / 1e9 if p50 > 0 else 0.0,
                         worker_cpu_us_per_call=float(np.mean([t.get("cpu_s", 0.0) for t in ts])) / n * 1e6)
            s["sizes"][key] = entry
        out[name] = s
    return out


# --- markdown -------------------------------------------------------------------------------
def _p50(entry: dict, system: str, size) -> float | None:
    st = entry.get("systems", {}).get(system, {}).get("sizes", {}).get(str(size), {})
    return st.get("p50_us")


def _cell(entry: dict, system: str, size, p99: bool = False) -> str:
    st = entry.get("systems", {}).get(system, {}).get("sizes", {}).get(str(size), {})
    if "p50_us" not in st:
        s = entry.get("systems", {}).get(system)
        return "error" if s and "error" in s else "n/a"
    text = f"{st['p50_us']:,.0f}"
    return text + (f" / {st['p99_us']:,.0f}" if p99 else "")


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a and b else "n/a"


def matrix_table(entries: list[dict], delay: bool = False) -> list[str]:
    head = (["relays hold (us/hop)"] if delay else []) + ["rate", "workers", "gradient", "daemon f32 p50 / p99 us", "daemon i32 p50 / p99 us",
            "TCP PS p50 / p99 us", "gloo p50 / p99 us", "daemon f32 / gloo", "daemon f32 / PS",
            "goodput Gbit/s: daemon f32 / PS / gloo"]
    lines = md_table(head)
    for e in entries:
        first = [f"{e.get('delay_us', 0):g}"] if delay else []
        if "error" in e:
            lines.append(md_row(first + [e["rate"], str(e["workers"]), f"(error: {e['error'][:120]})"])
                         + " |" * (len(head) - 3 - len(first)))
            continue
        for size in e["sizes"]:
            d, p, g = (_p50(e, s, size) for s in ("daemon-f32", "ps", "gloo"))
            good = " / ".join(f"{size * 8 / (x * 1e-6) / 1e9:.2f}" if x else "n/a" for x in (d, p, g))
            lines.append(md_row(first + [
                e["rate"], str(e["workers"]), size_label(size), _cell(e, "daemon-f32", size, True),
                _cell(e, "daemon-i32", size, True), _cell(e, "ps", size, True), _cell(e, "gloo", size, True),
                f"**{_ratio(d, g)}**", _ratio(d, p), good]))
    return lines


def relay_lines(entries: list[dict]) -> list[str]:
    out = []
    for e in entries:
        late = [x.get("late_us", {}).get("p50") for x in e.get("relays", []) if x.get("late_us")]
        if late:
            out.append(f"- relays holding {e.get('delay_us', 0):g} us/hop, {e['workers']} workers: timers late by "
                       f"{min(late):.0f}-{max(late):.0f} us (median per relay)")
    return out


def errors_lines(report: dict) -> list[str]:
    out = []
    for sec in ("matrix", "delay"):
        for e in report.get(sec, []):
            where = f"{sec}, {e['rate']}, {e['workers']} workers" + (
                f", relays holding {e.get('delay_us', 0):g} us/hop" if e.get("relay") else "")
            if "error" in e:
                out.append(f"- {where}: {e['error'].splitlines()[0][:300]}")
            for name, s in e.get("systems", {}).items():
                if "error" in s:
                    out.append(f"- {where}, {name}: {s['error'].strip().splitlines()[-1][:300]}")
    for sec in ("goodput", "loss"):
        e = report.get(sec) or {}
        if "error" in e:
            out.append(f"- {sec}: {e['error'][:300]}")
        for name, s in e.get("systems", {}).items():
            if "error" in s:
                out.append(f"- {sec}, {name}: {s['error'].strip().splitlines()[-1][:300]}")
    return out


def goal_lines(report: dict) -> list[str]:
    out = []
    for sec in ("matrix", "delay"):
        for e in report.get(sec, []):
            if e["workers"] != GOAL_LATENCY_WORKERS:
                continue
            what = ("no added delay" if sec == "matrix" else
                    f"relays holding {e.get('delay_us', 0):g} us per hop")
            for size in e["sizes"]:
                if size > GOAL_LATENCY_MAX_BYTES:
                    continue
                d, g = _p50(e, "daemon-f32", size), _p50(e, "gloo", size)
                if d and g:
                    ok = d <= GOAL_LATENCY_RATIO * g
                    out.append(f"- daemon latency <= 0.5x gloo ({what}, {e['rate']}, 4 workers, "
                               f"{size_label(size)}): {d:,.0f} us vs {g:,.0f} us = **{d / g:.2f}x** "
                               f"({'met' if ok else 'missed'})")
    gp = report.get("goodput") or {}
    for seg, e in gp.get("by_segment", {}).items():
        best = steady_goodput(e)
        if best:
            size, v = best
            out.append(f"- daemon goodput >= 1 GB/s of aggregated input per core (loopback, int32, "
                       f"{e['workers']} workers, {seg} values per packet, {size_label(size)}, timed rounds): "
                       f"**{v:.2f} GB per daemon CPU-second** ({'met' if v >= GOAL_GB_PER_CORE else 'missed'})")
    loss = report.get("loss") or {}
    for size, name, base, lossy in _loss_rows(loss):
        r = lossy["p99_us"] / base["p50_us"]
        out.append(f"- p99 with 1% loss <= 3x the lossless median ({size_label(size)}, {loss['workers']} workers, "
                   f"{_variant(name)}): {lossy['p99_us']:,.0f} us vs {base['p50_us']:,.0f} us = **{r:.2f}x** "
                   f"({'met' if r <= GOAL_LOSS_RATIO else 'missed'})")
    return out or ["- (no goal could be evaluated in this run)"]


def goodput_lines(report: dict) -> list[str]:
    gp = report.get("goodput") or {}
    if "skipped" in gp:
        return [f"Skipped: {gp['skipped']}"]
    head = ["values per packet", "gradient", "p50 / p99 us", "input GB/s (wall: workers x bytes / p50)",
            "daemon cores busy (timed rounds)", "**input GB per daemon CPU-second** (timed rounds)",
            "worker CPU us / call"]
    lines = md_table(head)
    totals = []
    for seg, e in gp.get("by_segment", {}).items():
        if not e.get("systems"):
            lines.append(f"| {seg} | error: {e.get('error', '?')[:200]} |" + " |" * 5)
            continue
        for size in e["sizes"]:
            st = e["systems"]["daemon-i32"]["sizes"].get(str(size), {})
            ps = e.get("per_size", {}).get(str(size))
            if "p50_us" not in st or not ps:
                continue
            per_cpu = f"**{ps['window_gb_per_cpu_s']:.2f}**" if ps.get("window_gb_per_cpu_s") else "n/a"
            cores = f"{ps['window_daemon_cores']:.2f}" if ps.get("window_daemon_cores") else "n/a"
            lines.append(f"| {seg} | {size_label(size)} | {st['p50_us']:,.0f} / {st['p99_us']:,.0f} | "
                         f"{ps['input_gb_per_wall_s']:.2f} | {cores} | {per_cpu} | "
                         f"{st['worker_cpu_us_per_call']:,.0f} |")
        if e.get("gb_per_cpu_s"):
            busy = (f"; by the daemon's own `busy_ns` counter (time spent handling packets, no waiting): "
                    f"{e['stats_gb_per_busy_s']:.2f} GB per busy second" if e.get("stats_gb_per_busy_s") else "")
            totals.append(f"- {seg} values per packet, whole launch (warm-up, start-up and idle included): "
                          f"{e['input_bytes'] / 1e9:.3g} GB of input in {e['daemon_cpu_s']:.2f} CPU-seconds of the "
                          f"daemon's process ({e['wall_s']:.1f} s wall): {e['gb_per_cpu_s']:.2f} GB/s per core"
                          f"{busy}.")
    return lines + ["", "Timed rounds: the daemon's CPU (all its threads, `/proc/PID/task/*/schedstat`, sampled "
                    "every 10 ms) between the first timed call and the last result of that size.", ""] + totals


def steady_goodput(e: dict) -> tuple[int, float] | None:
    """(size, GB per daemon CPU-second over its timed rounds) of the largest size measured."""
    best = None
    for size in e.get("sizes", []):
        ps = e.get("per_size", {}).get(str(size), {})
        if ps.get("window_gb_per_cpu_s"):
            best = (size, ps["window_gb_per_cpu_s"])
    return best


def _loss_rows(loss: dict):
    """(size, variant, lossless entry, lossy entry) for every lossy variant with numbers."""
    for size in loss.get("sizes", []):
        base = loss.get("systems", {}).get("lossless", {}).get("sizes", {}).get(str(size), {})
        for name, s in loss.get("systems", {}).items():
            if name == "lossless":
                continue
            lossy = s.get("sizes", {}).get(str(size), {})
            if "p50_us" in base and "p50_us" in lossy:
                yield size, name, base, lossy


def _variant(name: str) -> str:
    return "1% loss, rto 10 ms (default)" if name == "loss" else \
        "1% loss, rto " + name.removeprefix("loss-rto")


def loss_lines(report: dict) -> list[str]:
    loss = report.get("loss") or {}
    if "skipped" in loss:
        return [f"Skipped: {loss['skipped']}"]
    if not loss.get("systems"):
        return [f"No result: {loss.get('error', '?')}"]
    head = ["gradient", "variant", "lossless p50 / p99 us", "with loss p50 / p99 us", "p99 (loss) / p50 (lossless)",
            "goal <= 3x", "exact sums under loss"]
    lines = md_table(head)
    for size, name, a, b in _loss_rows(loss):
        r = b["p99_us"] / a["p50_us"]
        exact = "yes" if b.get("max_abs_err") == 0 else f"NO (max error {b.get('max_abs_err')})"
        lines.append(f"| {size_label(size)} | {_variant(name)} | {a['p50_us']:,.0f} / {a['p99_us']:,.0f} | "
                     f"{b['p50_us']:,.0f} / {b['p99_us']:,.0f} | **{r:.2f}x** | "
                     f"{'met' if r <= GOAL_LOSS_RATIO else '**missed**'} | {exact} |")
    dp = loss.get("daemon_processes", {}).get("loss", {}).get("stats")
    if dp:
        keep = {k: v for k, v in dp.items() if v and k in ("packets_received", "dropped_seeded", "duplicates",
                                                              "retransmits_received", "results_resent")}
        lines += ["", f"The lossy daemon's counters (both lossy jobs): `{keep}`."]
    return lines


def _build(b: dict) -> str:
    if not b:
        return "n/a"
    return f"commit {b.get('git_head', '?')}, native {b.get('native_sha256', '?')} of {b.get('native_mtime', '?')} UTC"


def build_markdown(report: dict) -> str:
    cfg = report["config"]
    net = report.get("network", {})
    mode = ("network namespaces + veth, `tc tbf` on both ends of every leaf link (burst max(64 KB, "
            "100 us at the rate))" if net.get("namespaced") else
            f"**no namespaces ({net.get('reason', '?')}): loopback addresses, links not shaped**")
    out = [f"# In-network gradient aggregation, {report['date']}"
           + (" (QUICK: few rounds, numbers are noise)" if report["quick"] else ""), "",
           *machine_lines(report), "",
           f"Command: `{report['command']}`; daemon module `{report.get('module')}` "
           f"(build: {_build(report.get('build', {}))}). Topology: {mode}. "
           "Daemon in the hub (1 link each way), PS on its own leaf (4 link crossings per round), gloo "
           "ring across the worker leaves (2 links per ring step). Every worker runs every system, "
           f"interleaved ({cfg['blocks']} blocks, order rotating); {cfg['rounds_small']} timed rounds "
           f"below 1 MB, {cfg['rounds_large']} from 1 MB, after {cfg['warmup']} warm-up calls (the first "
           "checked against the exact sum). Latency of a round: last worker's call to last worker's "
           "result. Goodput: gradient bits / median latency. Wall time "
           f"{report.get('wall_s', '?')} s.", ""]
    for name, why in report.get("skipped", {}).items():
        out.append(f"- {name}: SKIPPED: {why}")
    errs = errors_lines(report)
    if errs:
        out += ["**Errors:**", *errs, ""]
    out += ["## 1. Aggregation latency, no added delay", "", *matrix_table(report.get("matrix", [])), ""]
    out += ["## 2. With a per-hop delay", ""]
    if report.get("delay"):
        out += [f"Each link crossing held D = {cfg['delay_us']:g} +- {cfg['jitter_us']:g} us by `relay.py` in "
                "every worker's namespace (daemon UDP: 1 hop each way; TCP to another leaf through the hub, "
                "PS and gloo: 2 hops each way, via an nftables redirect to the transparent relay). The "
                "relay's timers are late by the `late_us` it reports (JSON, `relays`; below). The 0 us rows "
                "are the control: the same relays in the path holding nothing, so their own cost (Python, "
                "per datagram for the daemon's UDP, per chunk for TCP) is visible apart from the delay.", "",
                *relay_lines(report["delay"]), "",
                *matrix_table(report["delay"], delay=True), ""]
    else:
        out += [f"Not run: {report.get('delay_skipped', 'not selected')}.", ""]
    out += ["## 3. Daemon goodput per core (loopback, int32, no namespaces)", "", *goodput_lines(report), "",
            "## 4. Loss: 1% of the daemon's received packets dropped (seeded), loopback, int32", "",
            *loss_lines(report), "",
            "## Against the issue's goals", "", *goal_lines(report), ""]
    return "\n".join(out)
