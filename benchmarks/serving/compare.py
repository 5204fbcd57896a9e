"""Serving comparison driver: Reprise's same-host server against cpprb's multi-process
buffers, dm-reverb over loopback gRPC and a Redis baseline, on this machine.

    python3.11 -m benchmarks.serving.compare            # full run, ~7 minutes
    python3.11 -m benchmarks.serving.compare --quick    # smoke test (seconds); numbers are noise

Run it from the repository root with the Python that has ``reprise`` installed; the
peers run from their own venvs (``bash benchmarks/setup_peers.sh``), one system at a
time, each as a subprocess that starts its own server/writer/sampler processes and
prints one JSON object (see ``workloads.py``). A peer whose venv is missing is skipped
(a line on stderr says so) and the table says so. The same run measures single-core
memcpy bandwidth (as the core comparison does) for the 400 KB rows.

Writes ``benchmarks/out/serving-<date>.json`` (everything) and ``.md`` (the tables),
and one ``.log`` per system; ``--out-dir`` elsewhere.
"""

from __future__ import annotations

import argparse

from benchmarks.common.driver import (add_budget_args, add_common_args, run_systems, start_report,
                                      wanted_systems, write_outputs)
from benchmarks.common.report import (busy_lines, machine_lines, md_row, md_table, ran, si,
                                      status_cell, systems_lines)
from benchmarks.common.report import result as res

# name, module, venv (None: this interpreter), budget seconds in a full run
SYSTEMS = [
    ("reprise", "benchmarks.serving.reprise_serving", None, 180),
    ("cpprb", "benchmarks.peers.cpprb_serving", "cpprb", 180),
    ("reverb", "benchmarks.peers.reverb_serving", "reverb", 300),
    ("redis", "benchmarks.peers.redis_serving", "redis", 240),
]
PEERS = [s[0] for s in SYSTEMS if s[0] != "reprise"]
DISPLAY = {"reprise": "Reprise", "cpprb": "cpprb (MP buffers)", "reverb": "Reverb (gRPC)",
           "redis": "Redis baseline"}
SHORT = {"reprise": "Reprise", "cpprb": "cpprb", "reverb": "Reverb", "redis": "Redis"}

# The issue's reference numbers for Reverb and Redis on this machine (p50, ms).
ISSUE_REF = {"reverb": {"push": 86.0, "sample": 49.0}, "redis": {"push": 117.0, "sample": 12.0}}


# --- tables -----------------------------------------------------------------------------------
def fmt_ms(x: float) -> str:
    return f"{x:.3g}" if x < 100 else f"{x:.0f}"


def rate_row(report, label, key, field, unit, memcpy=None, gb=False, ref_only=False) -> str:
    """One row of a rate table: value per system, Reprise / best peer, % of memcpy."""
    systems = [n for n, *_ in SYSTEMS]
    cells = []
    vals = {}
    for n in systems:
        if ref_only and n != "reprise":
            cells.append("")
            continue
        e = res(report, n, key)
        st = status_cell(e, ran(report, n))
        if st or field not in e:
            cells.append(st or "—")
            continue
        v = e[field]
        vals[n] = v
        text = si(v)
        if gb and "gb_per_s" in e:
            text += f" ({e['gb_per_s']:.2f} GB/s)"
        if e.get("note"):
            text += " *"
        cells.append(text)
    mine = vals.get("reprise")
    peers = [(v, p) for p, v in vals.items() if p != "reprise" and v]
    ratio = f"{mine / max(peers)[0]:.2f}x vs {SHORT[max(peers)[1]]}" if mine and peers else ""
    pct = ""
    e = res(report, "reprise", key)
    if memcpy and e and "gb_per_s" in e:
        pct = f"{100 * e['gb_per_s'] / memcpy:.0f}%"
    return md_row([label, unit] + cells + [ratio, pct])


def writer_table(report: dict) -> list[str]:
    memcpy = report["memcpy"]["gb_per_s"]
    lines = md_table(["workload", "unit"] + [SHORT[n] for n, *_ in SYSTEMS] +
                     ["Reprise / best peer", "Reprise % of 1-core memcpy"])
    rows = [
        ("400 B, one item per step", "writer1[400B,step]", False),
        ("400 B, batched (Reprise: extend + create_items)", "writer1[400B,batch]", False),
        ("400 KB, one item per step", "writer1[400KB,step]", True),
        ("400 KB, batched (Reprise: extend + create_items)", "writer1[400KB,batch]", True),
    ]
    for label, key, big in rows:
        lines.append(rate_row(report, label, key, "items_per_s", "items/s",
                              memcpy=memcpy if big else None, gb=True))
    for label, key, big in (("400 B, in-process writer, no server (reference)",
                             "writer1[400B,step-inproc]", False),
                            ("400 KB, in-process writer, no server (reference)",
                             "writer1[400KB,step-inproc]", True)):
        lines.append(rate_row(report, label, key, "items_per_s", "items/s",
                              memcpy=memcpy if big else None, gb=True, ref_only=True))
    return lines


def mixed_table(report: dict) -> list[str]:
    lines = md_table(["workload", "unit"] + [SHORT[n] for n, *_ in SYSTEMS] + ["Reprise / best peer", ""])
    for variant, what in (("step", "one item per step"), ("batch", "batched writes")):
        key = f"mixed[{variant}]"
        lines.append(rate_row(report, f"4 writers ({what}): items inserted", key,
                              "items_per_s", "items/s"))
        lines.append(rate_row(report, "… while 1 sampler draws 256 uniform", key,
                              "samples_per_s", "samples/s"))
    return lines


def apex_table(report: dict, key: str) -> list[str]:
    systems = [n for n, *_ in SYSTEMS]
    lines = md_table(["Ape-X", "unit"] + [SHORT[n] for n in systems] +
                     [f"{SHORT[p]} / Reprise" for p in PEERS])
    rows = [("push 200 transitions (11.3 MB), p50", "push", "p50_ms", "ms"),
            ("push, p99", "push", "p99_ms", "ms"),
            ("sample 512 + update 512 priorities, p50", "sample", "p50_ms", "ms"),
            ("sample + update, p99", "sample", "p99_ms", "ms"),
            ("transitions pushed (4 actors)", None, "transitions_per_s", "/s"),
            ("learner rounds", None, "learner_rounds_per_s", "/s")]
    for label, group, field, unit in rows:
        cells, vals = [], {}
        for n in systems:
            e = res(report, n, key)
            st = status_cell(e, ran(report, n))
            if st:
                cells.append(st)
                continue
            src = e.get(group, {}) if group else e
            if field not in src:
                cells.append("—")
                continue
            v = src[field]
            vals[n] = v
            cells.append((fmt_ms(v) if unit == "ms" else si(v)) + (" *" if e.get("note") else ""))
        ratios = []
        for p in PEERS:
            if "reprise" in vals and p in vals and vals["reprise"] and vals[p]:
                r = vals[p] / vals["reprise"] if unit == "ms" else vals["reprise"] / vals[p]
                ratios.append(f"{r:.2f}x")
            else:
                ratios.append("")
        lines.append(md_row([label, unit] + cells + ratios))
    return lines


def goals(report: dict) -> list[str]:
    out = []
    memcpy = report["memcpy"]["gb_per_s"]
    step = res(report, "reprise", "writer1[400B,step]") or {}
    batch = res(report, "reprise", "writer1[400B,batch]") or {}
    inproc = res(report, "reprise", "writer1[400B,step-inproc]") or {}
    if "items_per_s" in step:
        v = step["items_per_s"]
        line = (f"- 400 B items from one local writer process >= 1,000,000 items/s: "
                f"**{si(v)} items/s** with append + create_item per step "
                f"({'met' if v >= 1e6 else 'missed'})")
        if "items_per_s" in batch:
            line += (f"; **{si(batch['items_per_s'])} items/s** with extend(256) + "
                     f"create_items(1, 256 priorities), one item per step "
                     f"({'met' if batch['items_per_s'] >= 1e6 else 'missed'})")
        if "items_per_s" in inproc:
            line += (f"; the same step loop in process, no server: {si(inproc['items_per_s'])} "
                     "items/s")
        out.append(line + ".")
    big = res(report, "reprise", "writer1[400KB,step]") or {}
    bigb = res(report, "reprise", "writer1[400KB,batch]") or {}
    if "gb_per_s" in big and memcpy:
        pct = 100 * big["gb_per_s"] / memcpy
        line = (f"- 400 KB items >= 50% of single-core memcpy ({memcpy:.2f} GB/s): "
                f"**{big['gb_per_s']:.2f} GB/s = {pct:.0f}%** per step "
                f"({'met' if pct >= 50 else 'missed'})")
        if "gb_per_s" in bigb:
            line += f"; extend: {bigb['gb_per_s']:.2f} GB/s = {100 * bigb['gb_per_s'] / memcpy:.0f}%"
        out.append(line + ".")
    for key, how in (("apex", "back to back"), ("apex-paced", "paced")):
        out += apex_goal(report, key, how)
    apex = (report.get("config") or {}).get("apex")
    if apex and memcpy:
        push_mb = apex["push"] * apex["transition_bytes"] / 1e6
        sample_mb = apex["sample"] * apex["transition_bytes"] / 1e6
        out.append(f"- Floors: one push moves {push_mb:.1f} MB and one sample {sample_mb:.1f} MB "
                   f"of transitions; at this run's single-core memcpy ({memcpy:.2f} GB/s) the "
                   f"copies alone take {push_mb / memcpy:.1f} ms and {sample_mb / memcpy:.1f} ms. "
                   "The Redis baseline's learner samples from numpy arrays in its own process "
                   "(no IPC at sample time), so its sample latency is a local numpy gather")
        rs = (res(report, "redis", "apex-paced") or {}).get("sample", {})
        if rs.get("n"):
            out[-1] += (f" ({fmt_ms(rs['p50_ms'])} ms paced): 5x lower would be "
                        f"{rs['p50_ms'] / 5:.1f} ms"
                        + (", below the copy floor" if rs["p50_ms"] / 5 < sample_mb / memcpy
                           else ""))
        out[-1] += ("; what that design pays instead is ingest (its push -> sum tree lag and "
                    "transitions/s rows).")
    return out


def apex_goal(report: dict, key: str, how: str) -> list[str]:
    out = []
    ap = res(report, "reprise", key) or {}
    if ap.get("push", {}).get("n"):
        for peer in ("reverb", "redis"):
            pe = res(report, peer, key) or {}
            parts = []
            for k in ("push", "sample"):
                mine = ap[k]["p50_ms"]
                ref = ISSUE_REF[peer][k]
                txt = f"{k} p50 {fmt_ms(mine)} ms vs "
                if pe.get(k, {}).get("n"):
                    theirs = pe[k]["p50_ms"]
                    txt += (f"{fmt_ms(theirs)} ms in this run = **{theirs / mine:.1f}x** "
                            f"({'met' if theirs / mine >= 5 else 'missed'})")
                else:
                    txt += "(not measured in this run)"
                if key == "apex":
                    txt += f"; vs the issue's {ref:g} ms: {ref / mine:.1f}x"
                parts.append(txt)
            out.append(f"- Ape-X ({how}) p50 >= 5x lower than {SHORT[peer]}: " +
                       "; ".join(parts) + ".")
    return out


def system_details(s: dict) -> list[str]:
    out = [f"  - {note}" for note in s.get("notes", [])]
    for key, e in s["results"].items():
        if "path" in e:
            out.append(f"  - `{key}`: {e['path']}")
        for k in ("note", "error", "skipped", "unsupported"):
            if e.get(k):
                out.append(f"  - `{key}` {k}: {e[k]}")
        if key.startswith("apex") and "learner_commit_lag" in e and e["learner_commit_lag"].get("n"):
            lag = e["learner_commit_lag"]
            out.append(f"  - `{key}` push -> in the learner's sum tree: p50 "
                       f"{fmt_ms(lag['p50_ms'])} ms, p99 {fmt_ms(lag['p99_ms'])} ms; "
                       f"batches still queued in Redis at the end: "
                       f"{e.get('learner_backlog_at_end')}; actors throttled "
                       f"{sum(v for k, v in e.items() if k.endswith('_throttled_s')):.1f} s "
                       "in all (queue > 32 batches)")
    return out


def build_markdown(report: dict) -> str:
    h = report["host"]
    cfg = report.get("config") or {}
    apex = cfg.get("apex", {})
    out = [f"# Serving comparison, {report['date']}" + (" (QUICK: tiny tables, noisy)"
                                                        if report["quick"] else ""),
           "",
           *machine_lines(report),
           "",
           "Every writer, sampler, actor and learner is its own spawned process; servers run "
           "in their own process (Reprise: the benchmark's main process; Reverb: a child "
           "process; Redis: redis-server). cpprb has no server: its MP buffers are shared "
           "memory that every process writes and reads directly. "
           f"On {h['cpus']} cores the concurrent rows run 6-7 busy processes: they measure "
           "contention as much as transport. `cannot` = the system has no such path; "
           "`*` = see notes.",
           "",
           "## 1. One writer process, nothing else running",
           "",
           "Higher is better. One-step items of one float32 field (random normals), "
           f"tables of {cfg.get('writer_capacity_items', {})} items, wrapped once before "
           f"timing; median of {cfg.get('rounds', '?')} rounds of >= {cfg.get('round_seconds', '?')} s, "
           "each ending with a flush (items committed, i.e. sampleable). "
           "GB/s is payload bytes (decimal).",
           "",
           *writer_table(report),
           "",
           "## 2. Four writer processes and one sampler process at once",
           "",
           f"400 B items into a table of {cfg.get('mixed_table_items', '?'):,} items (prefilled, "
           f"so writes evict), counted over {cfg.get('mixed_seconds', '?')} s after "
           f"{cfg.get('mixed_warmup_seconds', '?')} s of warm-up. Inserted = committed "
           "(Redis: stored in the sampler's memory, not merely pushed).",
           "",
           *mixed_table(report),
           "",
           "## 3. Ape-X (the in-network replay paper's workload)",
           "",
           f"{apex.get('actors', 4)} actor processes push batches of {apex.get('push', 200)} "
           f"Atari transitions (state and next_state uint8[4,84,84], action int64, reward "
           f"float32, one priority each: {apex.get('push_mb', 11.3):.1f} MB); "
           f"one learner samples {apex.get('sample', 512)} prioritized items (exponent 0.6) "
           f"and updates their {apex.get('sample', 512)} priorities. "
           "Push latency: from the first step handed to the system until the 200 items are "
           "committed (Reprise, Reverb: flush returned; cpprb: add returned; Redis: RPUSH "
           "returned, i.e. in Redis, not yet in the learner's memory). Sample latency: sample "
           "with all four fields as numpy + priority update. "
           f"Table: {cfg.get('apex_table_items', '?'):,} transitions (prefilled, FIFO "
           "eviction; the paper's 65,536 and the issue's 100k-200k do not fit this "
           f"machine's memory beside the peers: 200k x 56 KB = 11 GB), "
           f"{cfg.get('apex_seconds', '?')} s measured after {cfg.get('apex_warmup_seconds', '?')} s "
           "of warm-up. Latency in ms, lower is better; the ratio columns are peer / Reprise "
           "(> 1: Reprise is faster).",
           "",
           "### 3a. Back to back (every actor and the learner as fast as they can)",
           "",
           "What each system sustains decides how much work the others compete with on "
           f"{h['cpus']} cores: compare the throughput rows too.",
           "",
           *apex_table(report, "apex"),
           "",
           f"### 3b. Paced (each actor pushes every {apex.get('paced_actor_period_s', '?')} s, "
           f"staggered: {apex.get('actors', 4) * apex.get('push', 200) / apex.get('paced_actor_period_s', 1):,.0f} "
           f"transitions/s in all; the learner starts a round every "
           f"{1000 * apex.get('paced_learner_period_s', 0):.0f} ms)",
           "",
           "The same offered load for every system, below what every system's actors "
           "sustain: latency without the CPU saturation of 3a. A call that overruns its slot "
           "is followed at once by the next (the learner rounds row shows who could not keep "
           "the learner's pace).",
           "",
           *apex_table(report, "apex-paced"),
           "",
           "## Against the issue's goals",
           "",
           *goals(report),
           ""]
    out += busy_lines(report, 1.0, SHORT, "; part of that can be the previous system's own run")
    out += systems_lines(report, [n for n, *_ in SYSTEMS], DISPLAY, system_details)
    return "\n".join(out) + "\n"


# --- main -----------------------------------------------------------------------------------
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_args(ap, SYSTEMS, "tiny tables, short runs: a smoke test, numbers are noise")
    ap.add_argument("--only", default=None,
                    help="passed to every system: run only workloads whose key contains one "
                         "of these comma-separated substrings (writer1, mixed, apex, 400B, ...)")
    add_budget_args(ap)
    args = ap.parse_args()
    wanted = wanted_systems(ap, args, SYSTEMS)

    stem, report = start_report("serving", args.quick, args.out_dir,
                                issue_reference_p50_ms=ISSUE_REF)
    run_systems(report, stem, SYSTEMS, wanted, args, quick_budget=120,
                extra_args=["--only", args.only] if args.only else [])
    write_outputs(args.out_dir, stem, report, build_markdown(report))


if __name__ == "__main__":
    main()
