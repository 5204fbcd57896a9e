"""Core comparison driver: Reprise against cpprb, TorchRL and Reverb on this machine.

    python3.11 -m benchmarks.core.compare            # full run, ~10-15 minutes
    python3.11 -m benchmarks.core.compare --quick    # smoke test (seconds); numbers are noise

Run it from the repository root with the Python that has ``reprise`` installed
(``pip install .``); the peers run from their own venvs (``bash
benchmarks/setup_peers.sh``), one system at a time, each as a subprocess printing one
JSON object (see ``workloads.py``). A peer whose venv is missing is skipped (a line
on stderr says so) and the table says so. The same run measures this
machine's single-core memcpy bandwidth (numpy copy of a 1 GiB buffer into a
preallocated one), so large-item GB/s can be read as a fraction of it.

Writes ``benchmarks/out/core-<date>.json`` (everything: host, memcpy, every system's
full output) and ``.md`` (the table printed at the end); ``--out-dir`` elsewhere.
"""

from __future__ import annotations

import argparse

from benchmarks.common.driver import (add_budget_args, add_common_args, run_systems, start_report,
                                      wanted_systems, write_outputs)
from benchmarks.common.report import (busy_lines, machine_lines, md_row, md_table, ran, result,
                                      si, status_cell, systems_lines)

# name, module, venv (None: this interpreter), budget seconds in a full run
SYSTEMS = [
    ("reprise", "benchmarks.core.reprise_core", None, 240),
    ("cpprb", "benchmarks.peers.cpprb_core", "cpprb", 240),
    ("torchrl", "benchmarks.peers.torchrl_core", "torchrl", 240),
    ("reverb", "benchmarks.peers.reverb_core", "reverb", 420),
]
PEERS = [s[0] for s in SYSTEMS if s[0] != "reprise"]
DISPLAY = {"reprise": "Reprise", "cpprb": "cpprb", "torchrl": "TorchRL", "reverb": "Reverb"}
SIZE_ORDER = ["400B", "4KB", "40KB", "400KB"]
LARGE = {"40KB", "400KB"}  # rows that get "% of memcpy"


# --- running systems ------------------------------------------------------------------
def _interesting(line: str) -> bool:
    # The system's own progress lines, and anything that looks like trouble; not the
    # thousands of lines of TensorFlow/Reverb chatter.
    return line.startswith("[") and ("/s" in line or "fail" in line.lower() or "skipped" in line) \
        or "Error" in line or "Traceback" in line


# --- table ----------------------------------------------------------------------------
def workload_keys() -> list[str]:
    keys = []
    for w in ("insert_batched", "insert_step", "sample_uniform"):
        keys += [f"{w}[{s}]" for s in SIZE_ORDER]
    return keys + ["prioritized_round"]


def rate_of(entry: dict | None) -> tuple[float | None, str | None]:
    if not entry:
        return None, None
    for unit in ("items", "samples", "rounds"):
        if f"{unit}_per_s" in entry:
            return entry[f"{unit}_per_s"], unit
    return None, None


def cell(entry: dict | None, system_ran: bool) -> str:
    status = status_cell(entry, system_ran)
    if status:
        return status
    rate, _ = rate_of(entry)
    text = si(rate)
    if "gb_per_s" in entry:
        text += f" ({entry['gb_per_s']:.2f} GB/s)"
    if entry.get("note"):
        text += " *"
    return text


def build_table(report: dict) -> str:
    memcpy = report["memcpy"]["gb_per_s"]
    present = [n for n, _, _, _ in SYSTEMS]
    lines = md_table(["workload", "unit"] + [DISPLAY[n] for n in present] +
                     ["Reprise / best peer", "Reprise % of 1-core memcpy"])
    for key in workload_keys():
        entries = {n: result(report, n, key) for n in present}
        unit = next((rate_of(e)[1] for e in entries.values() if rate_of(e)[1]), "")
        row = [key, f"{unit}/s" if unit else ""]
        row += [cell(entries[n], ran(report, n)) for n in present]
        mine, _ = rate_of(entries["reprise"])
        peers = [(rate_of(entries[p])[0], p) for p in PEERS if rate_of(entries[p])[0]]
        if mine and peers:
            best, who = max(peers)
            row.append(f"{mine / best:.2f}x vs {DISPLAY[who]}")
        else:
            row.append("—")
        size = key[key.find("[") + 1:-1] if "[" in key else None
        e = entries["reprise"]
        if size in LARGE and e and "gb_per_s" in e and memcpy:
            row.append(f"{100 * e['gb_per_s'] / memcpy:.0f}%")
        else:
            row.append("")
        lines.append(md_row(row))
    return "\n".join(lines)


def system_details(s: dict) -> list[str]:
    out = []
    paths = {}
    for key, e in s["results"].items():
        fam = key.split("[")[0]
        if "path" in e:
            paths.setdefault(fam, e["path"])
    for fam, path in paths.items():
        out.append(f"  - {fam}: {path}")
    for note in s.get("notes", []):
        out.append(f"  - note: {note}")
    for key, e in s["results"].items():
        if e.get("note"):
            out.append(f"  - {key}: {e['note']}")
        if "error" in e or "skipped" in e:
            out.append(f"  - {key}: {e.get('error') or e.get('skipped')}")
    return out


def build_markdown(report: dict) -> str:
    out = [f"# Core comparison, {report['date']}" + (" (QUICK: tiny tables, noisy)"
                                                     if report["quick"] else ""),
           "",
           *machine_lines(report),
           "",
           "Higher is better everywhere. GB/s is payload bytes (random float32, decimal GB). "
           "Items: one step of one float32 field; batches of 256; medians of "
           f"{report['config'].get('rounds', '?')} rounds after warm-up. "
           "`*` = see notes.",
           "",
           build_table(report),
           ""]
    out += busy_lines(report, 0.7, DISPLAY, "; on 2 cores that skews every number, TorchRL's (2 intra-op threads) most")
    out += systems_lines(report, [n for n, *_ in SYSTEMS], DISPLAY, system_details)
    return "\n".join(out) + "\n"


# --- main -----------------------------------------------------------------------------
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_args(ap, SYSTEMS, "tiny tables, short rounds: a smoke test, numbers are noise")
    add_budget_args(ap)
    args = ap.parse_args()
    wanted = wanted_systems(ap, args, SYSTEMS)

    stem, report = start_report("core", args.quick, args.out_dir)
    run_systems(report, stem, SYSTEMS, wanted, args, quick_budget=90, load_limit=0.7,
                load_warning=lambda name, load: (
                    f"WARNING: load average {load:.2f} before {name}: another process is busy; "
                    "numbers (TorchRL's especially) will be low"),
                timeout=lambda b: 2 * b + 180,
                echo=lambda name, line: _interesting(line), process_group=False)
    write_outputs(args.out_dir, stem, report, build_markdown(report))


if __name__ == "__main__":
    main()
