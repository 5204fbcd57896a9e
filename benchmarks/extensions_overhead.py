"""What table extensions cost (issue 16): the core workloads and the served Ape-X benchmark
with every built-in extension on (``rp.Table(..., extensions=None)``, the default) against
none (``extensions=[]``).

    python -m benchmarks.extensions_overhead                    # core workloads, ~80 s on 2 cores
    python -m benchmarks.extensions_overhead --per-extension    # + one arm per built-in alone, ~5 minutes
    python -m benchmarks.extensions_overhead --only served_apex --apex-pairs 3   # the served Ape-X A/B
    python -m benchmarks.extensions_overhead --quick            # smoke test (both parts), ~15 s

Goal: with every built-in on, core insert and prioritized sample + update throughput within
5% of extensions off, and the served Ape-X latencies within 5%.

Core workloads: the factories of ``benchmarks.core.reprise_core`` with the core suite's full
sizes (``benchmarks.core.workloads``): ``insert_batched[400B]``, ``insert_batched[4KB]``,
``insert_step[400B]``, ``sample_uniform[400B]`` and ``prioritized_round`` (1M items,
batch 256, ``Prioritized(0.6)`` + ``update_priorities``), and a diagnostic outside the goal,
``insert_batched[400B,no-evict]``: the same inserts into a table reset (untimed) before it
would evict, so that no insert removes an item. Each arm gets its own store and
table, all set up and warmed up before timing; then ``pairs`` rounds of ``round_seconds``
per arm, interleaved in one process (round r runs the arms in an order rotated by r: on,
off / off, on / ...), so that the machine's noise and drift hit every arm alike. Reported
per arm: the median units/s; per extension arm: on/off as the median of the per-round
ratios (each round against the off round next to it; p25-p75 beside it) and the ratio of
the medians. The paired median is the verdict.

Served Ape-X (``--apex-pairs N``): ``python -m benchmarks.serving.reprise_serving --only apex
--extensions all|none`` run alternately N times each (a fresh server process per run), its
``apex`` and ``apex-paced`` push and sample p50/p99; medians per arm and on/off.

Writes ``benchmarks/out/extensions-<date>.json`` and ``.md`` (``--out-dir`` elsewhere);
the tables go to stdout.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time

import numpy as np
from reprise import extensions as ext

from benchmarks.common.config import Config
from benchmarks.common.driver import OUT, command_line, run_system, start_report, write_outputs
from benchmarks.common.payload import floats_for, step_payload
from benchmarks.common.report import machine_lines, si
from benchmarks.common.timing import now
from benchmarks.core import reprise_core as rc
from benchmarks.core.workloads import BATCH, PRIO_ITEM_BYTES, PRIORITY_EXPONENT, Workload
from benchmarks.core.workloads import make_config as core_config

GOAL = 0.95  # throughput with extensions on >= 95% of off; latency on <= off / 0.95
FULL = dict(pairs=15, round_seconds=0.4, warmup_seconds=0.3, apex_pairs=0)
QUICK = dict(pairs=3, round_seconds=0.02, warmup_seconds=0.02, apex_pairs=1)

DIAGNOSTIC = {"insert_batched[400B,no-evict]"}  # not a goal's workload: shows where insert costs go
BUILT_INS = [ext.PriorityHistogram, ext.SampledAge, ext.TimesSampled, ext.UniqueSamples, ext.Rates]


def log(msg: str) -> None:
    print(f"[extensions {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def arms(per_extension: bool) -> dict:
    """Arm name -> the table's ``extensions`` argument."""
    out = {"on": None, "off": []}
    if per_extension:
        out.update({c.__name__: [c()] for c in BUILT_INS})
    return out


def workloads(cfg: Config) -> list[tuple]:
    """(key, unit, factory(extensions) -> Workload): the core workloads the goal names."""
    k400, k4k = floats_for(400), floats_for(4_000)
    cap = cfg.insert_capacity_items
    return [
        ("insert_batched[400B]", "items", lambda e: rc.insert_batched(k400, cap["400B"], BATCH, e)),
        ("insert_batched[4KB]", "items", lambda e: rc.insert_batched(k4k, cap["4KB"], BATCH, e)),
        ("insert_step[400B]", "items", lambda e: rc.insert_step(k400, cap["400B"], e)),
        ("sample_uniform[400B]", "samples",
         lambda e: rc.sample_uniform(k400, cfg.sample_table_items_by_size["400B"], BATCH, e)),
        ("prioritized_round", "rounds",
         lambda e: rc.prioritized(floats_for(PRIO_ITEM_BYTES), cfg.prio_table_items, BATCH,
                                  PRIORITY_EXPONENT, e)),
        ("insert_batched[400B,no-evict]", "items", lambda e: insert_no_evict(k400, cap["400B"], e)),
    ]


def insert_no_evict(floats: int, capacity: int, extensions) -> Workload:
    """Diagnostic: ``insert_batched`` into a table that never fills (reset, untimed, before
    the batch that would evict), so no insert removes an item."""
    store, table = rc.make_table("insert_no_evict", floats, capacity, BATCH, extensions=extensions)
    src = step_payload(BATCH, floats)
    prios = np.ones(BATCH)
    excluded = [0.0]

    def call() -> None:
        if table.size + BATCH > capacity:
            t = now()
            table.reset()
            excluded[0] += now() - t
        table.insert({"x": src}, priorities=prios)

    for _ in range(-(-store.capacity // BATCH) + 1):  # touch every page, as insert_batched does
        call()
    return Workload(call=call, units_per_call=BATCH,
                    path="Table.insert({'x': float32[256,1,k]}, priorities) into a table reset "
                         "(untimed) before it would evict", close=rc.closer(store, table),
                    extra={"excluded_s": excluded})


def one_round(wl: Workload, seconds: float) -> float:
    """Units/s of ``wl.call`` back to back for at least ``seconds`` and two calls (less
    any time the workload reports as untimed in ``wl.extra["excluded_s"]``)."""
    excluded = wl.extra.get("excluded_s", [0.0])
    calls = 0
    before = excluded[0]
    t0 = now()
    deadline = t0 + seconds
    while calls < 2 or now() < deadline:
        wl.call()
        calls += 1
    return calls * wl.units_per_call / (now() - t0 - (excluded[0] - before))


def quartiles(xs: list[float]) -> tuple[float, float, float]:
    if len(xs) < 2:
        return xs[0], xs[0], xs[0]
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return q[0], q[1], q[2]


def measure_workload(cfg: Config, key: str, unit: str, factory, arm_specs: dict) -> dict:
    """Every arm's table set up and warmed up, then ``cfg.pairs`` interleaved rounds."""
    load_before = os.getloadavg()[0]
    setups = {}
    wls = {}
    try:
        for name, spec in arm_specs.items():
            t = time.perf_counter()
            wls[name] = factory(spec)
            setups[name] = round(time.perf_counter() - t, 2)
        for wl in wls.values():
            one_round(wl, cfg.warmup_seconds)
        names = list(wls)
        rates = {n: [] for n in names}
        for r in range(cfg.pairs):
            for n in names[r % len(names):] + names[:r % len(names)]:
                rates[n].append(one_round(wls[n], cfg.round_seconds))
        path = wls["off"].path
    finally:
        for wl in wls.values():
            wl.close()
        wls.clear()
        gc.collect()
    entry = {"unit": unit, "path": path, "setup_s": setups, "loadavg_1m_before": round(load_before, 2),
             "loadavg_1m_after": round(os.getloadavg()[0], 2), "arms": {}}
    off = rates["off"]
    for n, rs in rates.items():
        a = {f"{unit}_per_s": statistics.median(rs), "rounds": rs}
        if n != "off":
            paired = [x / y for x, y in zip(rs, off)]
            p25, p50, p75 = quartiles(paired)
            a.update(ratio_paired=p50, ratio_p25=p25, ratio_p75=p75,
                     ratio_of_medians=statistics.median(rs) / statistics.median(off))
        entry["arms"][n] = a
    entry["met"] = None if key in DIAGNOSTIC else entry["arms"]["on"]["ratio_paired"] >= GOAL
    return entry


# --- served Ape-X ---------------------------------------------------------------------------
APEX_METRICS = [("push", "p50_ms"), ("push", "p99_ms"), ("sample", "p50_ms"), ("sample", "p99_ms")]
APEX_RATES = ["transitions_per_s", "learner_rounds_per_s"]


def run_apex(pairs: int, quick: bool, out_dir: str, stem: str, only: str = "apex") -> dict:
    """``reprise_serving --only ONLY`` with ``--extensions all`` and ``none``, alternating."""
    runs = {"all": [], "none": []}
    for i in range(pairs):
        for arm in (("all", "none") if i % 2 == 0 else ("none", "all")):
            log(f"served Ape-X, pair {i + 1}/{pairs}: extensions {arm} ...")
            res = run_system(f"apex-{arm}-{i}", sys.executable, "benchmarks.serving.reprise_serving",
                             ["--only", only, "--extensions", arm] + (["--quick"] if quick else []),
                             timeout=600, log_path=os.path.join(out_dir, f"{stem}-apex-{arm}-{i}.log"),
                             echo=lambda line: "apex" in line)
            runs[arm].append(res)
    return summarize_apex(runs, pairs)


def summarize_apex(runs: dict, pairs: int) -> dict:
    """Medians per arm and on/off (of the medians, and per pair of adjacent runs)."""
    out = {"pairs": pairs, "runs": runs, "variants": {}}
    for variant in ("apex", "apex-paced"):
        got = {arm: [r["results"][variant] for r in rs if "results" in r and variant in r["results"]
                     and r["results"][variant].get("push", {}).get("n")] for arm, rs in runs.items()}
        if not any("results" in r and variant in r["results"] for rs in runs.values() for r in rs):
            continue  # not asked for (--apex-only)
        if len(got["all"]) != pairs or len(got["none"]) != pairs:
            out["variants"][variant] = {"error": "a run has no result; see the logs"}
            continue
        v = {}
        for part, stat in APEX_METRICS:
            med = {arm: statistics.median(e[part][stat] for e in es) for arm, es in got.items()}
            paired = [a[part][stat] / b[part][stat] for a, b in zip(got["all"], got["none"])]
            v[f"{part}_{stat}"] = {"off": med["none"], "on": med["all"],
                                   "on_over_off": med["all"] / med["none"],
                                   "paired": paired, "paired_median": statistics.median(paired),
                                   "met": med["all"] <= med["none"] / GOAL}
        for key in APEX_RATES:
            med = {arm: statistics.median(e[key] for e in es) for arm, es in got.items()}
            v[key] = {"off": med["none"], "on": med["all"],
                      "on_over_off": med["all"] / med["none"] if med["none"] else None}
        out["variants"][variant] = v
    return out


# --- report --------------------------------------------------------------------------------
def verdict(met: bool | None) -> str:
    return "(diagnostic)" if met is None else ("yes" if met else "**no**")


def build_markdown(report: dict) -> str:
    lines = ["# Table extensions: every built-in on vs none (issue 16)", ""]
    lines += machine_lines(report) + [""]
    cfg = report["config"]
    lines += [f"{cfg['pairs']} rounds of {cfg['round_seconds']} s per arm, interleaved (order rotated "
              f"each round), after {cfg['warmup_seconds']} s of warm-up; medians. on/off: median of "
              "the per-round ratios [p25-p75], and the ratio of the medians. Goal: on/off >= "
              f"{GOAL:.2f}.", ""]
    lines += ["| workload | unit | off | on | on/off (paired) [p25-p75] | on/off (medians) | within 5%? |",
              "|---|---|---|---|---|---|---|"]
    for key, e in report["core"].items():
        if "error" in e:
            lines.append(f"| {key} | | error: {e['error']} | | | | |")
            continue
        u, on, off = e["unit"], e["arms"]["on"], e["arms"]["off"]
        lines.append(f"| {key} | {u}/s | {si(off[f'{u}_per_s'])} | {si(on[f'{u}_per_s'])} | "
                     f"{on['ratio_paired']:.3f} [{on['ratio_p25']:.3f}-{on['ratio_p75']:.3f}] | "
                     f"{on['ratio_of_medians']:.3f} | {verdict(e['met'])} |")
    singles = [c.__name__ for c in BUILT_INS]
    if any(s in e.get("arms", {}) for e in report["core"].values() for s in singles):
        lines += ["", "Each built-in alone against none (on/off, paired median):", "",
                  "| workload | " + " | ".join(singles) + " |", "|---|" + "---|" * len(singles)]
        for key, e in report["core"].items():
            if "arms" in e:
                lines.append(f"| {key} | " + " | ".join(
                    f"{e['arms'][s]['ratio_paired']:.3f}" if s in e["arms"] else "" for s in singles) + " |")
    apex = report.get("apex")
    if apex:
        lines += ["", f"Served Ape-X (`benchmarks.serving.reprise_serving --only apex`), "
                      f"{apex['pairs']} run(s) per arm, alternating; medians over runs:", "",
                  "| variant | metric | off | on | on/off (medians) | on/off per pair | within 5%? |",
                  "|---|---|---|---|---|---|---|"]
        for variant, v in apex["variants"].items():
            if "error" in v:
                lines.append(f"| {variant} | | error: {v['error']} | | | | |")
                continue
            for part, stat in APEX_METRICS:
                m = v[f"{part}_{stat}"]
                pairs = ", ".join(f"{x:.2f}" for x in m["paired"])
                lines.append(f"| {variant} | {part} {stat[:3]} (ms) | {m['off']:.2f} | {m['on']:.2f} | "
                             f"{m['on_over_off']:.3f} | {pairs} | {'yes' if m['met'] else '**no**'} |")
            for key in APEX_RATES:
                m = v[key]
                ratio = "" if m["on_over_off"] is None else f"{m['on_over_off']:.3f}"
                lines.append(f"| {variant} | {key} | {m['off']:.1f} | {m['on']:.1f} | {ratio} | | |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="tiny tables, short rounds: a smoke test")
    ap.add_argument("--only", default=None,
                    help="comma-separated substrings of workload keys (served_apex: the Ape-X A/B)")
    ap.add_argument("--per-extension", action="store_true",
                    help="also one arm per built-in extension alone (which one costs what)")
    ap.add_argument("--pairs", type=int, default=None, help="rounds per arm (default 15; --quick 3)")
    ap.add_argument("--apex-pairs", type=int, default=None,
                    help="served Ape-X runs per arm (default 0: not run; --quick 1)")
    ap.add_argument("--apex-only", default="apex",
                    help="the served runs' --only (default apex: apex and apex-paced; apex-paced: that one)")
    ap.add_argument("--out-dir", default=OUT, help="where the .json and .md go (default benchmarks/out)")
    args = ap.parse_args()
    cfg = Config.choose(args.quick, None, FULL, QUICK).override(args, "pairs", "apex_pairs")
    core = core_config(args.quick, None)
    cfg.insert_capacity_items = core.insert_capacity_items
    cfg.sample_table_items_by_size = core.sample_table_items_by_size
    cfg.prio_table_items = core.prio_table_items
    stem, report = start_report("extensions", args.quick, args.out_dir,
                                command=command_line(__spec__.name))
    report["config"] = cfg.as_dict()
    report["goal"] = {"ratio_min": GOAL}
    report["core"] = {}
    only = [s for s in (args.only or "").split(",") if s]
    t0 = time.perf_counter()
    for key, unit, factory in workloads(cfg):
        if only and not any(s in key for s in only):
            continue
        log(f"{key} ...")
        try:
            e = measure_workload(cfg, key, unit, factory, arms(args.per_extension))
        except Exception as exc:  # recorded; the other workloads still run
            log(f"{key}: FAILED: {type(exc).__name__}: {exc}")
            report["core"][key] = {"error": f"{type(exc).__name__}: {exc}"}
            continue
        on = e["arms"]["on"]
        log(f"{key}: off {si(e['arms']['off'][f'{unit}_per_s'])} on {si(on[f'{unit}_per_s'])} {unit}/s, "
            f"on/off {on['ratio_paired']:.3f} [{on['ratio_p25']:.3f}-{on['ratio_p75']:.3f}]")
        report["core"][key] = e
    if cfg.apex_pairs and (not only or any(s in "served_apex" for s in only)):
        report["apex"] = run_apex(cfg.apex_pairs, args.quick, args.out_dir, stem, args.apex_only)
    report["wall_s"] = round(time.perf_counter() - t0, 1)
    write_outputs(args.out_dir, stem, report, build_markdown(report))


if __name__ == "__main__":
    main()
