"""The markdown the drivers print and write beside their JSON (standard library only).

- :func:`md_row` / :func:`md_table`: one table row, a header with its rule.
- :func:`si`: a rate with a k/M/G suffix and three significant digits.
- :func:`machine_lines`, :func:`busy_lines`: the machine and its memcpy baseline; a warning
  naming the systems that started on a busy machine.
- :func:`result`, :func:`ran`, :func:`status_cell`: one system's entry for one workload in
  a driver's report (``report["systems"][name]["results"][key]``) and what a table shows
  where that entry has no number (``n/a``: the system did not run; ``—``: no entry).
- :func:`systems_lines`: the "## Systems" list (versions, wall time, then each suite's
  own details of every system).
"""

from __future__ import annotations

from typing import Callable


# --- tables ---------------------------------------------------------------------------------
def md_row(cells) -> str:
    return "| " + " | ".join(cells) + " |"


def md_table(head: list[str], rows=()) -> list[str]:
    """The header, its rule and ``rows`` (each a list of cells) of a markdown table."""
    return [md_row(head), "|" + "---|" * len(head), *(md_row(r) for r in rows)]


def si(x: float) -> str:
    for div, suf in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if x >= div:
            return f"{x / div:.3g}{suf}"
    return f"{x:.3g}"


# --- the machine ----------------------------------------------------------------------------
def machine_lines(report: dict) -> list[str]:
    """The markdown lines describing the machine and its memcpy baseline."""
    h = report["host"]
    m = report["memcpy"]
    return [f"Machine: {h.get('cpu_model', '?')}, {h['cpus']} cores, {h.get('mem_gib', '?')} GiB, "
            f"GPU: {h['gpu'] or 'none'}; {h['platform']}.",
            f"Single-core memcpy (numpy, {m['bytes'] / 2**30:.3g} GiB buffer, median): "
            f"assign {m['numpy_assign']['gb_per_s']:.2f} GB/s, "
            f"np.copyto {m['np_copyto']['gb_per_s']:.2f} GB/s."]


def busy_lines(report: dict, threshold: float, names: dict | None = None, note: str = "") -> list[str]:
    """A markdown warning naming each system whose 1-minute load average before it started
    was above ``threshold`` (``names`` maps keys to display names), or nothing."""
    busy = {n: s["loadavg_1m_before"] for n, s in report["systems"].items()
            if s.get("loadavg_1m_before", 0) > threshold}
    if not busy:
        return []
    shown = ", ".join(f"{(names or {}).get(n, n)} {v}" for n, v in busy.items())
    return [f"**Warning:** the machine was busy (1-minute load average before the system started: "
            f"{shown}){note}.", ""]


# --- the systems' entries -------------------------------------------------------------------
def result(report: dict, system: str, key: str) -> dict | None:
    return report["systems"].get(system, {}).get("results", {}).get(key)


def ran(report: dict, system: str) -> bool:
    return "results" in report["systems"].get(system, {})


def status_cell(entry: dict | None, system_ran: bool, unsupported: str = "cannot") -> str | None:
    """What a cell shows instead of a number, or None where ``entry`` has its numbers."""
    if entry is None:
        return "—" if system_ran else "n/a"
    for why, shown in (("unsupported", unsupported), ("skipped", "skipped"), ("error", "error")):
        if why in entry:
            return shown
    return None


def systems_lines(report: dict, names: list[str], display: dict | None = None,
                  details: Callable[[dict], list[str]] = lambda s: [],
                  load: bool = False) -> list[str]:
    """"## Systems": per system its versions and wall time (``load``: and the load average
    before it started), then ``details(its entry)``; or why it did not run."""
    out = ["## Systems"]
    for name in names:
        s = report["systems"].get(name)
        if s is None:
            continue
        shown = (display or {}).get(name, name)
        if "results" not in s:
            out.append(f"- **{shown}**: not run: {s.get('skipped') or s.get('error')}")
            continue
        vers = ", ".join(f"{k} {v}" for k, v in s["versions"].items())
        before = f"; load average before {s.get('loadavg_1m_before', '?')}" if load else ""
        out.append(f"- **{shown}** ({vers}; {s.get('wall_s', '?')} s{before})")
        out += details(s)
    return out
