"""One system's run of one suite: ``Bench`` (numpy and the standard library only).

Every system script (``core/reprise_core.py``, ``peers/cpprb_serving.py``, ...) makes one
``Bench``, which parses the arguments every system script takes (``--quick``,
``--budget SECONDS``, ``--only SUBSTRINGS``), picks the suite's configuration, runs
each workload under the time budget (``run``), and prints one JSON object on stdout at
the end (``finish``); progress goes to stderr as ``[system  12.3s] key: ...`` lines.

JSON: ``system``, ``versions``, ``quick``, ``config``, ``host``, ``elapsed_s``, ``notes``,
``results`` ({workload key: entry}); an entry is the workload's numbers, or
``{"error": ...}``, ``{"skipped": ...}`` (budget spent) or ``{"unsupported": ...}``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import traceback
from typing import Callable

import numpy as np


class Unsupported(Exception):
    """A workload this system cannot do (the table says so)."""


class Bench:
    """Collects one system's results and prints its JSON object on stdout.

    ``make_config(quick, budget)`` returns the suite's :class:`~benchmarks.common.config.Config`;
    ``add_arguments(parser)``, if given, adds a system's own options (read from ``self.args``).
    """

    def __init__(self, system: str, suite: str, make_config: Callable,
                 add_arguments: Callable[[argparse.ArgumentParser], None] | None = None) -> None:
        ap = argparse.ArgumentParser(description=f"{system} side of the {suite} benchmark")
        ap.add_argument("--quick", action="store_true",
                        help="tiny tables and short runs: checks the script, numbers are noise")
        ap.add_argument("--budget", type=float, default=None,
                        help="seconds for this system; workloads past it are skipped")
        ap.add_argument("--only", default=None,
                        help="comma-separated substrings: run only workloads whose key "
                             "contains one")
        if add_arguments is not None:
            add_arguments(ap)
        self.args = ap.parse_args()
        self.cfg = make_config(self.args.quick, self.args.budget)
        self.system = system
        self.t0 = time.perf_counter()
        self.results: dict[str, dict] = {}
        self.notes: list[str] = []
        self.versions = {"numpy": np.__version__, "python": platform.python_version()}
        self.only = [s for s in (self.args.only or "").split(",") if s]

    def log(self, msg: str) -> None:
        print(f"[{self.system} {self.elapsed():6.1f}s] {msg}", file=sys.stderr, flush=True)

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def over_budget(self) -> bool:
        return self.elapsed() > self.cfg.budget_seconds

    def wanted(self, key: str) -> bool:
        return not self.only or any(s in key for s in self.only)

    def run(self, key: str, fn, *args) -> None:
        """``fn(*args)`` returns the result dict of one workload (or raises
        :class:`Unsupported`, or fails: recorded, and the run goes on)."""
        if not self.wanted(key):
            return
        if self.over_budget():
            self.results[key] = {"skipped": f"time budget {self.cfg.budget_seconds:.0f}s spent"}
            self.log(f"{key}: skipped (budget)")
            return
        t = time.perf_counter()
        try:
            entry = fn(*args)
        except Unsupported as exc:
            self.results[key] = {"unsupported": str(exc)}
            self.log(f"{key}: not supported: {exc}")
            return
        except Exception as exc:  # a system that cannot do a workload: say so, go on
            self.results[key] = {"error": f"{type(exc).__name__}: {exc}"}
            self.log(f"{key}: FAILED: {type(exc).__name__}: {exc}")
            traceback.print_exc(file=sys.stderr)
            return
        entry["wall_s"] = round(time.perf_counter() - t, 1)
        self.results[key] = entry
        self.log(f"{key}: {summarize(entry)}")

    def cannot(self, key: str, why: str) -> None:
        if self.wanted(key):
            self.results[key] = {"unsupported": why}

    def finish(self) -> None:
        out = {"system": self.system, "versions": self.versions, "quick": self.cfg.quick,
               "config": self.cfg.as_dict(),
               "host": {"cpus": os.cpu_count(), "platform": platform.platform()},
               "elapsed_s": round(self.elapsed(), 2), "notes": self.notes,
               "results": self.results}
        sys.stdout.write(json.dumps(out) + "\n")
        sys.stdout.flush()


def package_versions(*names: str) -> dict:
    """The installed version of each distribution (``dm-reverb``, ``torch``, ...); one that is
    not installed is left out."""
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in names:
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            pass
    return out


def summarize(e: dict) -> str:
    """One progress line's worth of an entry."""
    parts = []
    for unit in ("items", "samples", "rounds"):
        if f"{unit}_per_s" in e:
            parts.append(f"{e[f'{unit}_per_s']:,.0f} {unit}/s")
    if "gb_per_s" in e:
        parts.append(f"{e['gb_per_s']:.3f} GB/s")
    for k in ("push", "sample"):
        if k in e and e[k].get("n"):
            parts.append(f"{k} p50 {e[k]['p50_ms']:.2f} ms p99 {e[k]['p99_ms']:.2f} ms "
                         f"(n={e[k]['n']})")
    text = ", ".join(parts) or json.dumps(e)[:200]
    if "setup_s" in e:
        text += f" (setup {e['setup_s']:.1f}s)"
    return text
