"""Remote comparison driver: Reprise's gRPC service against dm-reverb's server over
loopback, 1, 2, 4 and 8 client processes, with a plain-socket test as the limit.

    python3.11 -m benchmarks.remote.compare            # full run, ~20 minutes on 2 cores
    python3.11 -m benchmarks.remote.compare --quick    # smoke test (a minute); numbers are noise
    python3.11 -m benchmarks.remote.compare --ops sample256,iterate256 --clients 1,8
    python3.11 -m benchmarks.remote.compare --before /tmp/reprise-before   # + a frozen build

Run it from the repository root with the Python that has ``reprise`` installed; Reverb
runs from its venv (``bash benchmarks/setup_peers.sh reverb``) and is skipped (a line on
stderr and the table say so) when the venv is missing. Each system is a subprocess that
starts its own server process and 8 client processes (``--quick``: 2) and prints one
JSON object (see ``workloads.py`` for the points); the plain-socket test
(``loopback_socket.py``) runs first, in the same run. The run also measures single-core
memcpy, as the other drivers do.

``--ops``, ``--sizes`` and ``--clients`` choose a subset of the points (every system gets
them); ``--only`` keeps points whose key contains one of its substrings. ``--before DIR``
also runs Reprise's 4 KB points (those of ``--sizes`` if given) with ``PYTHONPATH=DIR`` (a
copy of ``python/reprise`` with its built ``_native`` from before a change), right after
Reprise, for issue 18's "nothing slower than today at 4 KB" in the same run.

Writes ``benchmarks/out/remote-<date>.json`` (everything) and ``.md`` (the tables), and
one ``.log`` per system; ``--out-dir`` elsewhere.
"""

from __future__ import annotations

import argparse
import os

from benchmarks.common.driver import (add_budget_args, add_common_args, run_systems, start_report,
                                      wanted_systems, write_outputs)
from benchmarks.common.report import (busy_lines, machine_lines, md_row, md_table, ran, si,
                                      status_cell, systems_lines)
from benchmarks.common.report import result as res
from benchmarks.remote.workloads import (CLIENTS, ITERATE_IN_FLIGHT, PIPELINED, SIZES,
                                         STEP_CHUNK, TABLE_ITEMS, WORKLOADS, key)

# name, module, venv (None: this interpreter), budget seconds in a full run
SYSTEMS = [
    ("socket", "benchmarks.remote.loopback_socket", None, 120),
    ("reprise", "benchmarks.remote.reprise_remote", None, 540),
    ("reverb", "benchmarks.peers.reverb_remote", "reverb", 480),
]
BEFORE = ("reprise_before", "benchmarks.remote.reprise_remote", None, 300)
QUICK_BUDGET = 120

# Issue 5's numbers for Reverb on this machine, and the goals (issues 5 and 18).
ISSUE_REF = {"insert_4KB_items_per_s": [24e3, 51e3], "sample_4KB_items_per_s": [49e3, 78e3],
             "400KB_gb_per_s": [0.7, 1.6]}
GOAL_RATIO = 3.0
GOAL_SOCKET_SHARE = 0.5
SLOWER = 0.95   # now / before below this counts as slower (rounds vary by a few %)


def clients_of(report: dict) -> list[int]:
    """The client counts of this run's points (fewer with --quick or --clients)."""
    return (report.get("config") or {}).get("clients", CLIENTS)


def ok(e: dict | None) -> bool:
    return bool(e) and ("items_per_s" in e or "gb_per_s" in e)


def reverb_key(k: str) -> str:
    """Reverb's point for a Reprise point: a pipelined one's serial twin (Reverb's
    sampler already is a pipelined stream), else the same key."""
    op, rest = k.split("[", 1)
    return f"{PIPELINED.get(op, op)}[{rest}"


def cell(report: dict, system: str, k: str) -> tuple[str, str]:
    """(rate text, latency text) of one system at one point."""
    e = res(report, system, k)
    status = status_cell(e, ran(report, system), unsupported="unsupported")
    if status:
        return status, ""
    lat = e.get("latency", {})
    lat_text = f"{lat['p50_ms']:.3g} / {lat['p99_ms']:.3g}" if lat.get("n") else "—"
    return f"{si(e['items_per_s'])} ({e['gb_per_s']:.2f} GB/s)", lat_text


def ratio(report: dict, k: str, mine: str = "reprise", theirs: str = "reverb") -> float | None:
    a = res(report, mine, k)
    b = res(report, theirs, reverb_key(k) if theirs == "reverb" else k)
    if ok(a) and ok(b) and b["items_per_s"]:
        return a["items_per_s"] / b["items_per_s"]
    return None


def socket_gb(report: dict, n: int) -> float | None:
    e = res(report, "socket", f"socket[{n}c]")
    return e["gb_per_s"] if ok(e) else None


def measured(report: dict, k: str) -> bool:
    """Some system has an entry for this point (a --ops/--sizes subset leaves others out)."""
    return any(k in s.get("results", {}) for s in report["systems"].values())


def points(report: dict, ops=None, sizes=None) -> list[tuple[str, str, int, int]]:
    """(op, size, batch, n) of every point this run has, in WORKLOADS order."""
    return [(op, label, batch, n) for op, label, batch, _ in WORKLOADS
            for n in clients_of(report)
            if (ops is None or op in ops) and (sizes is None or label in sizes)
            and measured(report, key(op, label, n))]


def point_label(op: str, label: str, batch: int, n: int) -> str:
    size = label.replace("KB", " KB")
    what = {"step_insert": f"{batch} steps, append + create_item each",
            "iterate": f"{batch}, {ITERATE_IN_FLIGHT} in flight",
            "iterate256": f"{batch}, {ITERATE_IN_FLIGHT} in flight"}.get(op, str(batch))
    return f"{op} {size} x {what}, {n} client{'s' if n > 1 else ''}"


def ratio_text(r: float | None) -> str:
    return "" if r is None else (f"{r:.2f}x" if r >= GOAL_RATIO else f"**{r:.2f}x**")


def table(report: dict) -> list[str]:
    lines = md_table(["point", "Reprise items/s (GB/s)", "Reprise p50 / p99 ms",
                      "Reverb items/s (GB/s)", "Reverb p50 / p99 ms", "Reprise / Reverb",
                      "plain socket GB/s", "Reprise % of socket"])
    for op, label, batch, n in points(report):
        k = key(op, label, n)
        mine, mine_lat = cell(report, "reprise", k)
        theirs, theirs_lat = cell(report, "reverb", reverb_key(k))
        sock = socket_gb(report, n)
        e = res(report, "reprise", k)
        share = f"{100 * e['gb_per_s'] / sock:.0f}%" if sock and ok(e) else ""
        sock_text = "" if sock is None else f"{sock:.2f}"
        row = [point_label(op, label, batch, n), mine, mine_lat, theirs, theirs_lat,
               ratio_text(ratio(report, k)), sock_text, share]
        lines.append(md_row(row))
    return lines


def pipelined_table(report: dict) -> list[str]:
    """Reprise's Client.iterate against its serial Client.sample, same batches."""
    rows = []
    for op, label, batch, n in points(report, ops=PIPELINED):
        k, serial = key(op, label, n), key(PIPELINED[op], label, n)
        a, b = res(report, "reprise", k), res(report, "reprise", serial)
        if not (a or b):
            continue
        speed = (f"{a['items_per_s'] / b['items_per_s']:.2f}x"
                 if ok(a) and ok(b) and b["items_per_s"] else "")
        row = [f"{size_text(label)} x {batch}, {n} client{'s' if n > 1 else ''}",
               *cell(report, "reprise", serial), *cell(report, "reprise", k), speed]
        rows.append(md_row(row))
    if not rows:
        return []
    return ["## Pipelined (`Client.iterate`) against serial `Client.sample` (Reprise)", "",
            f"The same batches drawn one call after the other (`client.sample(table, n)`) and "
            f"through `client.iterate(table, n, max_in_flight={ITERATE_IN_FLIGHT})` (one stream "
            f"per client, {ITERATE_IN_FLIGHT} batch requests outstanding; made once and kept "
            "open across rounds). Reverb's sampler stream has "
            f"{ITERATE_IN_FLIGHT} batches in flight in its `sample` rows.", "",
            *md_table(["batch, clients", "serial items/s (GB/s)", "serial p50 / p99 ms",
                       "iterate items/s (GB/s)", "iterate p50 / p99 ms", "iterate / serial"]),
            *rows, ""]


def size_text(label: str) -> str:
    return label.replace("KB", " KB")


def before_table(report: dict) -> list[str]:
    if not ran(report, "reprise_before"):
        return []
    rows = []
    for op, label, batch, n in points(report):
        k = key(op, label, n)
        if res(report, "reprise_before", k) is None:
            continue
        r = ratio(report, k, "reprise", "reprise_before")
        r_text = "" if r is None else (f"{r:.2f}x" if r >= SLOWER else f"**{r:.2f}x**")
        row = [f"`{k}`", cell(report, "reprise_before", k)[0],
               cell(report, "reprise", k)[0], r_text]
        rows.append(md_row(row))
    path = report["systems"]["reprise_before"].get("versions", {}).get("reprise_path", "?")
    return ["## Against the build before (same run)", "",
            f"`reprise_before` is `{path}` (`--before`), run right after Reprise with the same "
            f"points (4 KB unless `--sizes` says otherwise); bold where now / before < {SLOWER}.",
            "",
            *md_table(["point", "before items/s (GB/s)", "now items/s (GB/s)", "now / before"]),
            *rows, ""]


def goal_line(title: str, found: list[tuple[str, float | None]], target: float,
              fmt=lambda v: f"{v:.2f}x") -> str | None:
    """One goal: met at every point of ``found`` (key, value; None: no number there)."""
    if not found:
        return None
    missing = [k for k, v in found if v is None]
    have = [(k, v) for k, v in found if v is not None]
    missed = [(k, v) for k, v in have if v < target]
    met = not missed and not missing
    parts = [", ".join(f"`{k}` {fmt(v)}" for k, v in have)] if have else []
    if missing:
        parts.append("no number at " + ", ".join(f"`{k}`" for k in missing))
    return (f"- {title}: **{'met' if met else 'missed'}** (met at {len(have) - len(missed)} of "
            f"{len(found)} points: " + "; ".join(parts) + ").")


def goals(report: dict) -> list[str]:
    clients = clients_of(report)
    out = []

    def keys(op: str, label: str) -> list[str]:
        return [key(op, label, n) for n in clients if measured(report, key(op, label, n))]

    def ratios(op: str, label: str):
        return [(k, ratio(report, k)) for k in keys(op, label)]

    def shares(op: str, label: str):
        found = []
        for n, k in zip(clients, [key(op, label, n) for n in clients]):
            if not measured(report, k):
                continue
            e, sock = res(report, "reprise", k), socket_gb(report, n)
            found.append((k, e["gb_per_s"] / sock if ok(e) and sock else None))
        return found

    pct = lambda v: f"{100 * v:.0f}%"  # noqa: E731
    candidates = [
        goal_line(f"400 KB inserts >= {GOAL_RATIO:g}x Reverb at every client count",
                  ratios("insert", "400KB"), GOAL_RATIO),
        goal_line(f"400 KB samples >= {GOAL_RATIO:g}x Reverb at every client count",
                  ratios("sample", "400KB"), GOAL_RATIO),
        goal_line(f"400 KB inserts >= {100 * GOAL_SOCKET_SHARE:.0f}% of the plain socket "
                  "(same number of streams, same run)", shares("insert", "400KB"),
                  GOAL_SOCKET_SHARE, pct),
        goal_line(f"400 KB samples >= {100 * GOAL_SOCKET_SHARE:.0f}% of the plain socket",
                  shares("sample", "400KB"), GOAL_SOCKET_SHARE, pct),
        goal_line(f"4 KB samples >= {GOAL_RATIO:g}x Reverb at every point",
                  ratios("sample", "4KB"), GOAL_RATIO),
        goal_line(f"256 x 400 KB samples work at every client count and are >= {GOAL_RATIO:g}x "
                  "Reverb's", ratios("sample256", "400KB"), GOAL_RATIO),
    ]
    out += [c for c in candidates if c]
    if ran(report, "reprise_before"):
        found = [(key(op, label, n), ratio(report, key(op, label, n), "reprise", "reprise_before"))
                 for op, label, _, n in points(report, sizes=["4KB"])
                 if res(report, "reprise_before", key(op, label, n)) is not None]
        line = goal_line(f"nothing slower than before at 4 KB (now / before >= {SLOWER})", found,
                         SLOWER)
        if line:
            out.append(line)
    # The new user's harness (issue 18) and the pipelined points: ratios, no separate goal.
    for op, label in (("step_insert", "4KB"), ("step_insert", "400KB"),
                      ("iterate", "4KB"), ("iterate", "400KB"), ("iterate256", "400KB")):
        found = [(k, r) for k, r in ratios(op, label) if r is not None]
        if found:
            what = ("a writer's append + create_item per step" if op == "step_insert"
                    else "pipelined Client.iterate against Reverb's sampler stream")
            out.append(f"- `{op}` {size_text(label)} ({what}): " + ", ".join(
                f"`{k}` {r:.2f}x" for k, r in found) + " Reverb.")
    allr = [r for op, label, _, n in points(report) if op not in PIPELINED
            if (r := ratio(report, key(op, label, n))) is not None]
    if allr:
        met = sum(r >= GOAL_RATIO for r in allr)
        out.append(f"- Every point but the pipelined ones: >= {GOAL_RATIO:g}x Reverb at {met} of "
                   f"{len(allr)} (ratios {min(allr):.2f}x to {max(allr):.2f}x).")
    rv = {(op, n): res(report, "reverb", key(op, "4KB", n))
          for op in ("insert", "sample") for n in clients}
    if rv and all(ok(e) for e in rv.values()):
        ins = [rv[("insert", n)]["items_per_s"] for n in clients]
        smp = [rv[("sample", n)]["items_per_s"] for n in clients]
        big = [res(report, "reverb", key(op, "400KB", n)) for op in ("insert", "sample")
               for n in clients]
        big = [e["gb_per_s"] for e in big if ok(e)]
        ref_ins, ref_smp = ISSUE_REF["insert_4KB_items_per_s"], ISSUE_REF["sample_4KB_items_per_s"]
        ref_big = ISSUE_REF["400KB_gb_per_s"]
        line = (f"- Reverb in this run: {si(min(ins))}–{si(max(ins))} inserts/s and "
                f"{si(min(smp))}–{si(max(smp))} samples/s of 4 KB items")
        if big:
            line += f", {min(big):.2f}–{max(big):.2f} GB/s with 400 KB items"
        out.append(line + f" (issue 5 measured {si(ref_ins[0])}–{si(ref_ins[1])}, "
                   f"{si(ref_smp[0])}–{si(ref_smp[1])} and {ref_big[0]}–{ref_big[1]} GB/s).")
    return out


def system_details(s: dict) -> list[str]:
    out = [f"  - {note}" for note in s.get("notes", [])]
    paths = {}
    for k, e in s["results"].items():
        if "path" in e:
            paths.setdefault(e["path"], []).append(k)
        for why in ("error", "skipped", "unsupported"):
            if e.get(why):   # the first line: a client's traceback stays in the JSON
                out.append(f"  - `{k}` {why}: {str(e[why]).splitlines()[0]}")
    for path, keys in paths.items():
        out.append(f"  - {path} ({len(keys)} point{'s' if len(keys) > 1 else ''})")
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
           "items are in the table when it returns); step_insert = "
           f"{cfg.get('step_chunk', STEP_CHUNK)} steps, each one `append` + one `create_item` "
           "on a writer kept open (Reverb: `TrajectoryWriter`), then a flush; sample = a "
           "uniform batch with its data as numpy (sample256: 256 x 400 KB, 102 MB, above "
           "both servers' 64 MiB message limit); iterate = Reprise's pipelined "
           "`Client.iterate`, whose Reverb column is Reverb's sample point (its sampler is "
           f"already a stream). Per point: {cfg.get('rounds', '?')} rounds of "
           f"{cfg.get('window_seconds', '?')} s after {cfg.get('warmup_seconds', '?')} s of "
           "warm-up; items/s is the median round (all clients together), p50/p99 are per "
           "call over every round. GB/s is payload bytes (decimal). The plain-socket column "
           "is n sender/receiver process pairs over loopback (the transport limit with as "
           "many streams); the ratio column is bold where it misses the 3x goal.",
           "",
           *table(report),
           "",
           *pipelined_table(report),
           *before_table(report),
           "## Against the issues' goals",
           "",
           *goals(report),
           ""]
    out += busy_lines(report, 1.0, note="; part of it can be the previous system's own processes")
    out += systems_lines(report, [n for n, *_ in SYSTEMS + [BEFORE]], details=system_details,
                         load=True)
    return "\n".join(out) + "\n"


def run_before(report: dict, stem: str, args, extra_args: list[str], common: dict) -> None:
    """Reprise's points again with ``PYTHONPATH=args.before`` (a frozen earlier build), as
    system ``reprise_before``."""
    name, module, venv, budget = BEFORE
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.path.abspath(args.before)
    try:
        run_systems(report, stem, [(name, module, venv, args.budget or budget)], [name], args,
                    extra_args=extra_args, **common)
    finally:
        if old is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = old
    b = report["systems"][name]
    now_path = report["systems"].get("reprise", {}).get("versions", {}).get("reprise_path")
    if now_path and b.get("versions", {}).get("reprise_path") == now_path:
        b.setdefault("notes", []).append(
            f"WARNING: imported the same reprise as the current run ({now_path})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_args(ap, SYSTEMS, "small tables, 1 and 2 clients, short windows, 1 round: "
                                 "a smoke test, numbers are noise")
    ap.add_argument("--only", default=None,
                    help="passed to every system: run only points whose key contains one of "
                         "these comma-separated substrings (insert, 400KB, sample[4KB/8c], ...)")
    ap.add_argument("--ops", default=None,
                    help="passed to every system: comma-separated operations (insert, sample, "
                         "step_insert, iterate, sample256, iterate256; default all)")
    ap.add_argument("--sizes", default=None,
                    help="passed to every system: comma-separated sizes (4KB, 400KB)")
    ap.add_argument("--clients", default=None,
                    help="passed to every system: comma-separated client counts (default "
                         "1,2,4,8; --quick 1,2)")
    ap.add_argument("--before", default=None, metavar="DIR",
                    help="also run Reprise's 4 KB points (those of --sizes if given) with "
                         "PYTHONPATH=DIR (a copy of python/reprise with its _native from before "
                         "a change), right after Reprise")
    ap.add_argument("--budget", type=float, default=None,
                    help="seconds for each system (default: its own budget; points past it "
                         "are skipped)")
    add_budget_args(ap)
    args = ap.parse_args()
    wanted = wanted_systems(ap, args, SYSTEMS)
    systems = SYSTEMS if args.budget is None else [(n, s, v, args.budget) for n, s, v, _ in SYSTEMS]
    if args.before and not os.path.isdir(os.path.join(args.before, "reprise")):
        ap.error(f"--before {args.before}: no reprise package in it (expected "
                 f"{os.path.join(args.before, 'reprise')})")

    def passed(**override) -> list[str]:
        """The point filters every system gets (``override`` replaces some)."""
        values = {opt: getattr(args, opt) for opt in ("only", "ops", "sizes", "clients")}
        values.update(override)
        return [a for opt, v in values.items() if v for a in (f"--{opt}", v)]
    stem, report = start_report("remote", args.quick, args.out_dir, issue_reference=ISSUE_REF)
    common = dict(quick_budget=args.budget or QUICK_BUDGET, load_limit=1.5)
    first, rest = systems[:2], systems[2:]
    run_systems(report, stem, first, wanted, args, extra_args=passed(), **common)
    if args.before:
        run_before(report, stem, args, passed(sizes=args.sizes or "4KB"), common)
    run_systems(report, stem, rest, wanted, args, extra_args=passed(), **common)
    write_outputs(args.out_dir, stem, report, build_markdown(report))


if __name__ == "__main__":
    main()
