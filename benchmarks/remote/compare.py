"""Remote comparison driver: Reprise's gRPC service against dm-reverb's server over
loopback, 1, 2, 4 and 8 client processes, with a plain-socket test as the limit.

    python3.11 -m benchmarks.remote.compare            # full run, ~7 minutes on 2 cores
    python3.11 -m benchmarks.remote.compare --quick    # smoke test (seconds); numbers are noise

Run it from the repository root with the Python that has ``reprise`` installed; Reverb
runs from its venv (``bash benchmarks/setup_peers.sh reverb``) and is skipped (a line on
stderr and the table say so) when the venv is missing. Each system is a subprocess that
starts its own server process and 8 client processes (``--quick``: 2) and prints one
JSON object (see ``workloads.py``); the plain-socket test (``loopback_socket.py``) runs
first, in the same run. The run also measures single-core memcpy, as the other drivers do.

Writes ``benchmarks/out/remote-<date>.json`` (everything) and ``.md`` (the table), and
one ``.log`` per system; ``--out-dir`` elsewhere.
"""

from __future__ import annotations

import argparse

from benchmarks.common.driver import (add_budget_args, add_common_args, busy_lines, machine_lines,
                                      run_systems, si, start_report, wanted_systems,
                                      write_outputs)
from benchmarks.remote.workloads import BATCH, CLIENTS, OPS, SIZES, TABLE_ITEMS, key

# name, module, venv (None: this interpreter), budget seconds in a full run
SYSTEMS = [
    ("socket", "benchmarks.remote.loopback_socket", None, 120),
    ("reprise", "benchmarks.remote.reprise_remote", None, 240),
    ("reverb", "benchmarks.peers.reverb_remote", "reverb", 300),
]
QUICK_BUDGET = 120

# The issue's numbers for Reverb on this machine, and its goals.
ISSUE_REF = {"insert_4KB_items_per_s": [24e3, 51e3], "sample_4KB_items_per_s": [49e3, 78e3],
             "400KB_gb_per_s": [0.7, 1.6]}
GOAL_RATIO = 3.0
GOAL_SOCKET_SHARE = 0.5


def clients_of(report: dict) -> list[int]:
    """The client counts of this run's points (fewer with --quick)."""
    return (report.get("config") or {}).get("clients", CLIENTS)


def res(report: dict, system: str, k: str) -> dict | None:
    return report["systems"].get(system, {}).get("results", {}).get(k)


def ok(e: dict | None) -> bool:
    return bool(e) and ("items_per_s" in e or "gb_per_s" in e)


def cell(report: dict, system: str, k: str) -> tuple[str, str]:
    """(rate text, latency text) of one system at one point."""
    e = res(report, system, k)
    if e is None:
        return ("n/a" if "results" not in report["systems"].get(system, {}) else "—"), ""
    for why in ("error", "skipped", "unsupported"):
        if why in e:
            return why, ""
    lat = e.get("latency", {})
    lat_text = f"{lat['p50_ms']:.3g} / {lat['p99_ms']:.3g}" if lat.get("n") else "—"
    return f"{si(e['items_per_s'])} ({e['gb_per_s']:.2f} GB/s)", lat_text


def ratio(report: dict, k: str) -> float | None:
    mine, theirs = res(report, "reprise", k), res(report, "reverb", k)
    if ok(mine) and ok(theirs) and theirs["items_per_s"]:
        return mine["items_per_s"] / theirs["items_per_s"]
    return None


def socket_gb(report: dict, n: int) -> float | None:
    e = res(report, "socket", f"socket[{n}c]")
    return e["gb_per_s"] if ok(e) else None


def table(report: dict) -> list[str]:
    head = ["point", "Reprise items/s (GB/s)", "Reprise p50 / p99 ms", "Reverb items/s (GB/s)",
            "Reverb p50 / p99 ms", "Reprise / Reverb", "plain socket GB/s", "Reprise % of socket"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for op in OPS:
        for label, _ in SIZES:
            for n in clients_of(report):
                k = key(op, label, n)
                mine, mine_lat = cell(report, "reprise", k)
                theirs, theirs_lat = cell(report, "reverb", k)
                r = ratio(report, k)
                r_text = "" if r is None else (f"{r:.2f}x" if r >= GOAL_RATIO else f"**{r:.2f}x**")
                sock = socket_gb(report, n)
                e = res(report, "reprise", k)
                share = (f"{100 * e['gb_per_s'] / sock:.0f}%" if sock and ok(e) else "")
                point = f"{op} {label} x {BATCH[label]}, {n} client{'s' if n > 1 else ''}"
                sock_text = "" if sock is None else f"{sock:.2f}"
                row = [point, mine, mine_lat, theirs, theirs_lat, r_text, sock_text, share]
                lines.append("| " + " | ".join(row) + " |")
    return lines


def goals(report: dict) -> list[str]:
    out = []
    clients = clients_of(report)
    ratios = {key(op, label, n): ratio(report, key(op, label, n))
              for op in OPS for label, _ in SIZES for n in clients}
    have = {k: r for k, r in ratios.items() if r is not None}
    if have:
        missed = {k: r for k, r in have.items() if r < GOAL_RATIO}
        lo, hi = min(have.values()), max(have.values())
        line = (f"- >= {GOAL_RATIO:g}x Reverb at every point: "
                f"**{'met' if not missed else 'missed'}** (met at {len(have) - len(missed)} "
                f"of {len(have)} points; ratios {lo:.2f}x to {hi:.2f}x)")
        if missed:
            line += "; missed at " + ", ".join(f"`{k}` {r:.2f}x" for k, r in missed.items())
        out.append(line + ".")
    shares = []
    for op in OPS:
        for n in clients:
            k = key(op, "400KB", n)
            e, sock = res(report, "reprise", k), socket_gb(report, n)
            if ok(e) and sock:
                shares.append((k, e["gb_per_s"] / sock))
    if shares:
        missed = [(k, s) for k, s in shares if s < GOAL_SOCKET_SHARE]
        out.append(f"- 400 KB items >= {100 * GOAL_SOCKET_SHARE:.0f}% of the plain-socket "
                   f"bandwidth (same number of streams): **{'met' if not missed else 'missed'}** "
                   f"(met at {len(shares) - len(missed)} of {len(shares)} points: "
                   + ", ".join(f"`{k}` {100 * s:.0f}%" for k, s in shares) + ").")
    rv = [res(report, "reverb", key(op, "4KB", n)) for op in OPS for n in clients]
    if all(ok(e) for e in rv):
        ins = [res(report, "reverb", key("insert", "4KB", n))["items_per_s"] for n in clients]
        smp = [res(report, "reverb", key("sample", "4KB", n))["items_per_s"] for n in clients]
        big = [res(report, "reverb", key(op, "400KB", n)) for op in OPS for n in clients]
        big = [e["gb_per_s"] for e in big if ok(e)]
        ref_ins, ref_smp = ISSUE_REF["insert_4KB_items_per_s"], ISSUE_REF["sample_4KB_items_per_s"]
        ref_big = ISSUE_REF["400KB_gb_per_s"]
        out.append(f"- Reverb in this run: {si(min(ins))}–{si(max(ins))} inserts/s and "
                   f"{si(min(smp))}–{si(max(smp))} samples/s of 4 KB items, "
                   f"{min(big):.2f}–{max(big):.2f} GB/s with 400 KB items (the issue measured "
                   f"{si(ref_ins[0])}–{si(ref_ins[1])}, {si(ref_smp[0])}–{si(ref_smp[1])} and "
                   f"{ref_big[0]}–{ref_big[1]} GB/s).")
    return out


def build_markdown(report: dict) -> str:
    cfg = report.get("config") or {}
    counts = [str(n) for n in clients_of(report)]
    counts = counts[0] if len(counts) == 1 else ", ".join(counts[:-1]) + " or " + counts[-1]
    out = [f"# Remote service over loopback, {report['date']}"
           + (" (QUICK: short windows, noisy)" if report["quick"] else ""),
           "",
           *machine_lines(report),
           "",
           f"Each system: its server in its own process and {counts} client processes "
           "(spawned once, reused for every point), all over TCP on 127.0.0.1. One-step "
           "items of one float32 field (random normals); tables of "
           + ", ".join(f"{cfg.get('table_items', TABLE_ITEMS)[lbl]:,} items of {lbl}"
                       for lbl, _ in SIZES)
           + " (Uniform sampler, Fifo remover, MinSize(1)), full before timing, so every "
           "insert evicts. A call is one batch: insert = the batch written + flushed (the "
           "items are in the table when it returns); sample = a uniform batch with its data "
           f"as numpy. Per point: {cfg.get('rounds', '?')} rounds of "
           f"{cfg.get('window_seconds', '?')} s after {cfg.get('warmup_seconds', '?')} s of "
           "warm-up; items/s is the median round (all clients together), p50/p99 are per "
           "call over every round. GB/s is payload bytes (decimal). The plain-socket column "
           "is n sender/receiver process pairs over loopback (the transport limit with as "
           "many streams); the ratio column is bold where it misses the 3x goal.",
           "",
           *table(report),
           "",
           "## Against the issue's goals",
           "",
           *goals(report),
           ""]
    out += busy_lines(report, 1.0, note="; part of it can be the previous system's own processes")
    out.append("## Systems")
    for name, *_ in SYSTEMS:
        s = report["systems"].get(name, {})
        if "results" not in s:
            out.append(f"- **{name}**: not run: {s.get('skipped') or s.get('error')}")
            continue
        vers = ", ".join(f"{k} {v}" for k, v in s["versions"].items())
        out.append(f"- **{name}** ({vers}; {s.get('wall_s', '?')} s; load average before "
                   f"{s.get('loadavg_1m_before', '?')})")
        for note in s.get("notes", []):
            out.append(f"  - {note}")
        paths = {}
        for k, e in s["results"].items():
            if "path" in e:
                paths.setdefault(e["path"], []).append(k)
            for why in ("error", "skipped", "unsupported"):
                if e.get(why):
                    out.append(f"  - `{k}` {why}: {e[why]}")
        for path, keys in paths.items():
            out.append(f"  - {path} ({len(keys)} point{'s' if len(keys) > 1 else ''})")
    return "\n".join(out) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_args(ap, SYSTEMS, "small tables, 1 and 2 clients, short windows, 1 round: "
                                 "a smoke test, numbers are noise")
    ap.add_argument("--only", default=None,
                    help="passed to every system: run only points whose key contains one of "
                         "these comma-separated substrings (insert, 400KB, sample[4KB/8c], ...)")
    ap.add_argument("--budget", type=float, default=None,
                    help="seconds for each system (default: its own budget; points past it "
                         "are skipped)")
    add_budget_args(ap)
    args = ap.parse_args()
    wanted = wanted_systems(ap, args, SYSTEMS)
    systems = SYSTEMS if args.budget is None else [(n, s, v, args.budget) for n, s, v, _ in SYSTEMS]

    stem, report = start_report("remote", args.quick, args.out_dir, issue_reference=ISSUE_REF)
    run_systems(report, stem, systems, wanted, args,
                quick_budget=args.budget or QUICK_BUDGET,
                extra_args=["--only", args.only] if args.only else [],
                load_limit=1.5,
                load_warning=lambda name, load: f"WARNING: load average {load:.2f} before {name}",
                timeout=lambda b: b + 240,
                echo=lambda name, line: line.startswith(f"[{name} ") or "Traceback" in line,
                process_group=True)
    write_outputs(args.out_dir, stem, report, build_markdown(report))


if __name__ == "__main__":
    main()
