"""A/B of two Reprise builds on the core workloads (``core/reprise_core.py``), interleaved.

    python -m benchmarks.core.ab                                 # A: installed build, B: ./python
    python -m benchmarks.core.ab --pairs 7 --only insert_step,prioritized_round
    python -m benchmarks.core.ab --a "env -u PYTHONPATH python" \\
                                 --b "env PYTHONPATH=/path/to/new/python python"
    python -m benchmarks.core.ab --quick                         # smoke test; numbers are noise

The two sides are two command prefixes that start a python (``--a`` and ``--b``, split like a
shell line; ``-m benchmarks.core.reprise_core --only KEY [--quick]`` is appended). Defaults:
A = ``env -u PYTHONPATH <this python>`` (the ``reprise`` installed in site-packages) and B =
``env PYTHONPATH=<repo>/python <this python>`` (the tree's package). Every run starts in the
repository root, so ``benchmarks`` is this checkout's for both sides; only ``reprise`` differs.
The script checks that the two sides import ``reprise`` from different directories (each
child's JSON notes say where from) and stops otherwise (``--allow-same`` for an A/A run);
it records the size and mtime of each side's native module and Python files, and warns
(stderr, the markdown) if they change during the run (a rebuild or an edit mid-A/B).

Each workload runs in a fresh process per side (``reprise_core --only KEY``: the core suite's
own sizes, warm-up and rounds; its number is the median of its rounds), A and B next to each
other, for ``--pairs`` pairs; the order flips every pair (A B, B A, A B, ...) so that drift
and warm caches favour neither side. Per workload: the median of A's runs and of B's, the
ratio of the medians, and the per-pair ratios B/A (median, min, max); the verdict is the
median per-pair ratio against ``1 - --tolerance`` (default 3%: B no more than 3% slower).
Higher is better for every workload (items/s, samples/s, rounds/s).

Writes ``benchmarks/out/ab-<date>.json`` (every run's full entry, load averages, which
``reprise`` each side ran) and ``.md`` (the table, also on stdout); ``--out-dir`` elsewhere.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time

from benchmarks.common.driver import OUT, command_line, new_report, write_outputs
from benchmarks.common.processes import ROOT
from benchmarks.common.report import md_row, md_table, si

MODULE = "benchmarks.core.reprise_core"
SIZE_ORDER = ["400B", "4KB", "40KB", "400KB"]
KEYS = ([f"{w}[{s}]" for w in ("insert_batched", "insert_step", "sample_uniform")
         for s in SIZE_ORDER] + ["prioritized_round"])
UNITS = ("items", "samples", "rounds")


def rate_of(entry: dict) -> tuple[float | None, str | None]:
    for unit in UNITS:
        if f"{unit}_per_s" in entry:
            return entry[f"{unit}_per_s"], unit
    return None, None


def reprise_dir(out: dict) -> str | None:
    for note in out.get("notes", []):
        if "reprise from " in note:
            return note.split("reprise from ", 1)[1].strip()
    return None


def build_stamp(directory: str | None) -> dict:
    """Size and mtime of each file at the top of a reprise package directory (its native
    module and Python files): a rebuild or an edit in the middle of an A/B shows up."""
    if not directory or not os.path.isdir(directory):
        return {}
    out = {}
    for name in sorted(os.listdir(directory)):
        path = os.path.join(directory, name)
        if os.path.isfile(path) and name.endswith((".so", ".py")):
            st = os.stat(path)
            out[name] = [st.st_size, round(st.st_mtime, 3)]
    return out


def run_one(prefix: list[str], key: str, quick: bool, log, timeout: float) -> dict:
    """One fresh process of the core module on one workload: its JSON object, plus
    ``wall_s`` and the load average before it."""
    cmd = prefix + ["-m", MODULE, "--only", key] + (["--quick"] if quick else [])
    load = os.getloadavg()
    t0 = time.perf_counter()
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    wall = time.perf_counter() - t0
    log.write(f"$ {shlex.join(cmd)}\n{r.stderr}\n")
    log.flush()
    if r.returncode != 0:
        raise RuntimeError(f"{shlex.join(cmd)} exited {r.returncode}:\n{r.stderr[-3000:]}")
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        raise RuntimeError(f"{shlex.join(cmd)} printed no JSON:\n{r.stdout[-2000:]}")
    out = json.loads(lines[-1])
    out["wall_s"] = round(wall, 2)
    out["loadavg_before"] = [round(x, 2) for x in load]
    return out


def spread(xs: list[float]) -> dict:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def summarize(key: str, runs: dict, tolerance: float) -> dict:
    """``runs[side]``: that side's entries of ``key`` in pair order."""
    a = [rate_of(e)[0] for e in runs["a"]]
    b = [rate_of(e)[0] for e in runs["b"]]
    unit = rate_of(runs["a"][0])[1]
    pair_ratios = [y / x for x, y in zip(a, b)]
    med_ratio = statistics.median(pair_ratios)
    return {"unit": unit, "a": spread(a), "b": spread(b), "a_runs": a, "b_runs": b,
            "ratio_of_medians": statistics.median(b) / statistics.median(a),
            "pair_ratios": pair_ratios, "pair_ratio": spread(pair_ratios),
            "within_tolerance": med_ratio >= 1.0 - tolerance,
            "a_round_cv": statistics.median(cv(e["rounds"]) for e in runs["a"]),
            "b_round_cv": statistics.median(cv(e["rounds"]) for e in runs["b"])}


def cv(xs: list[float]) -> float:
    return statistics.pstdev(xs) / statistics.mean(xs) if len(xs) > 1 else 0.0


def build_markdown(report: dict) -> str:
    names = report["names"]
    tol = report["tolerance"]
    out = [f"# Core A/B, {report['date']}" + (" (QUICK: tiny tables, noisy)"
                                              if report["quick"] else ""), "",
           machine_line(report["host"]), "",
           f"- A ({names['a']}): `{report['commands']['a']}` -> reprise from "
           f"`{report['reprise_dirs']['a']}`",
           f"- B ({names['b']}): `{report['commands']['b']}` -> reprise from "
           f"`{report['reprise_dirs']['b']}`",
           *[f"- **Warning:** side {side.upper()}'s reprise files changed during the run "
             f"(first seen at {where}): its runs mix two builds."
             for side, where in report["reprise_changed_during_run"].items()],
           f"- {report['pairs']} pairs, one fresh process per workload and side, order flipped "
           "every pair (A B, B A, ...); each run's number is the median of the core suite's "
           f"rounds. Load average (1 min) from {report['load']['min_1m']:.2f} to "
           f"{report['load']['max_1m']:.2f} before the runs; "
           f"`uptime` before: {report['uptime_before']}; after: {report['uptime_after']}.",
           f"- Verdict: median per-pair ratio B/A >= {1 - tol:.2f} (B no more than "
           f"{100 * tol:.0f}% slower). Higher is better.", "",
           *md_table(["workload", "unit", f"A median (min-max)", f"B median (min-max)",
                      "B/A of medians", "B/A per pair: median [min, max]",
                      "round CV A / B", f"within {100 * tol:.0f}%"])]
    for key, s in report["summary"].items():
        a, b, p = s["a"], s["b"], s["pair_ratio"]
        out.append(md_row([
            key, f"{s['unit']}/s",
            f"{si(a['median'])} ({si(a['min'])}-{si(a['max'])})",
            f"{si(b['median'])} ({si(b['min'])}-{si(b['max'])})",
            f"{s['ratio_of_medians']:.3f}",
            f"{p['median']:.3f} [{p['min']:.3f}, {p['max']:.3f}]",
            f"{100 * s['a_round_cv']:.1f}% / {100 * s['b_round_cv']:.1f}%",
            "yes" if s["within_tolerance"] else "**NO**"]))
    for key, err in report.get("errors", {}).items():
        out.append(f"- {key}: {err}")
    return "\n".join(out) + "\n"


def machine_line(h: dict) -> str:
    return (f"Machine: {h.get('cpu_model', '?')}, {h['cpus']} cores, {h.get('mem_gib', '?')} GiB; "
            f"{h['platform']}; driver python {h['python']}.")


def uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--a", default=f"env -u PYTHONPATH {shlex.quote(sys.executable)}",
                    help="command prefix that starts side A's python (default: the installed "
                         "reprise, PYTHONPATH unset)")
    ap.add_argument("--b", default=f"env PYTHONPATH={shlex.quote(os.path.join(ROOT, 'python'))} "
                                   f"{shlex.quote(sys.executable)}",
                    help="command prefix that starts side B's python (default: PYTHONPATH="
                         "<repo>/python)")
    ap.add_argument("--a-name", default="A")
    ap.add_argument("--b-name", default="B")
    ap.add_argument("--pairs", type=int, default=None, help="A/B pairs (default 5; --quick 2)")
    ap.add_argument("--only", default=None,
                    help="comma-separated substrings of workload keys (default: all 13)")
    ap.add_argument("--tolerance", type=float, default=0.03,
                    help="B may be this fraction slower than A (default 0.03)")
    ap.add_argument("--quick", action="store_true",
                    help="the core suite's tiny tables and short rounds: a smoke test")
    ap.add_argument("--allow-same", action="store_true",
                    help="run even if both sides import reprise from the same directory")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per run")
    ap.add_argument("--out-dir", default=OUT)
    args = ap.parse_args()
    pairs = args.pairs or (2 if args.quick else 5)
    only = [s for s in (args.only or "").split(",") if s]
    keys = [k for k in KEYS if not only or any(s in k for s in only)]
    if not keys:
        ap.error(f"--only {args.only!r} selects no workload of {KEYS}")
    prefixes = {"a": shlex.split(args.a), "b": shlex.split(args.b)}

    stem, report = new_report("ab", args.quick, args.out_dir,
                              command=command_line("benchmarks.core.ab"),
                              commands={"a": args.a, "b": args.b},
                              names={"a": args.a_name, "b": args.b_name},
                              pairs=pairs, tolerance=args.tolerance, keys=keys,
                              uptime_before=uptime())
    print(f"uptime before: {report['uptime_before']}", file=sys.stderr, flush=True)
    runs = {k: {"a": [], "b": []} for k in keys}
    sequence = []
    dirs: dict[str, str | None] = {}
    errors: dict[str, str] = {}
    stamps: dict[str, dict] = {}
    changed: dict[str, str] = {}
    log_path = os.path.join(args.out_dir, stem + ".log")
    t_start = time.perf_counter()
    with open(log_path, "w") as log:
        for p in range(pairs):
            order = ("a", "b") if p % 2 == 0 else ("b", "a")
            for key in keys:
                if key in errors:
                    continue
                for side in order:
                    try:
                        out = run_one(prefixes[side], key, args.quick, log, args.timeout)
                    except (RuntimeError, subprocess.TimeoutExpired) as exc:
                        errors[key] = f"{side}: {exc}"
                        print(f"{key} {side}: FAILED: {exc}", file=sys.stderr, flush=True)
                        break
                    d = reprise_dir(out)
                    if dirs.setdefault(side, d) != d:
                        raise SystemExit(f"side {side} imported reprise from {d}, "
                                         f"earlier from {dirs[side]}")
                    stamp = build_stamp(d)
                    if stamps.setdefault(side, stamp) != stamp and side not in changed:
                        changed[side] = f"pair {p + 1}, {key}"
                        print(f"WARNING: side {side}'s reprise files in {d} changed during the "
                              f"run (first seen at pair {p + 1}, {key})", file=sys.stderr, flush=True)
                    if len(dirs) == 2 and dirs["a"] == dirs["b"] and not args.allow_same:
                        raise SystemExit(f"both sides import reprise from {dirs['a']}; "
                                         "pass --allow-same for an A/A run")
                    entry = out["results"].get(key, {})
                    rate, unit = rate_of(entry)
                    if rate is None:
                        errors[key] = f"{side}: no rate in {json.dumps(entry)[:300]}"
                        print(f"{key} {side}: {errors[key]}", file=sys.stderr, flush=True)
                        break
                    entry["loadavg_before"] = out["loadavg_before"]
                    entry["process_wall_s"] = out["wall_s"]
                    runs[key][side].append(entry)
                    sequence.append({"pair": p, "key": key, "side": side, "rate": rate,
                                     "load_1m": out["loadavg_before"][0]})
                    print(f"[{time.perf_counter() - t_start:7.1f}s] pair {p + 1}/{pairs} {key:24s} "
                          f"{side.upper()} {rate:14,.0f} {unit}/s  (load {out['loadavg_before'][0]:.2f})",
                          file=sys.stderr, flush=True)
    report["uptime_after"] = uptime()
    print(f"uptime after: {report['uptime_after']}", file=sys.stderr, flush=True)
    loads = [s["load_1m"] for s in sequence] or [0.0]
    report["load"] = {"min_1m": min(loads), "max_1m": max(loads),
                      "median_1m": statistics.median(loads)}
    report["reprise_dirs"] = {"a": dirs.get("a"), "b": dirs.get("b")}
    report["reprise_files"] = stamps
    report["reprise_changed_during_run"] = changed
    report["elapsed_s"] = round(time.perf_counter() - t_start, 1)
    report["sequence"] = sequence
    report["runs"] = runs
    report["errors"] = errors
    report["summary"] = {k: summarize(k, runs[k], args.tolerance) for k in keys
                         if runs[k]["a"] and len(runs[k]["a"]) == len(runs[k]["b"])}
    write_outputs(args.out_dir, stem, report, build_markdown(report))
    if errors:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
