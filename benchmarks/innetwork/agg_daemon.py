"""The aggregation daemon's side of the in-network benchmarks: where ``reprise.aggregate`` comes
from, opening a worker, and a host process that runs one ``Daemon`` (in the hub's namespace, like a
switch) and reports its counters and CPU time when it stops.

    python -m benchmarks.innetwork.agg_daemon --address 0.0.0.0:0 [--drop-rate 0.01 --seed 1]

prints ``READY <address>`` and serves until SIGTERM / SIGINT or the end of stdin, then prints one
JSON line: ``stats`` (``Daemon.stats()``), ``cpu_s`` (this process's user + system CPU seconds
while it served, from ``/proc/self/stat``; the Python thread only waits, so it is the daemon's
thread) and ``threads`` (CPU seconds per thread, from ``/proc/self/task``).

``AGG_MODULE`` (environment) names another module with the same API to use instead of
``reprise.aggregate`` (a development stand-in; the benchmark reports name the module used).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import signal
import sys
import threading

MODULE_ENV = "AGG_MODULE"
DEFAULT_MODULE = "reprise.aggregate"


def module_name() -> str:
    return os.environ.get(MODULE_ENV) or DEFAULT_MODULE


def aggregate_module():
    """``reprise.aggregate`` (or ``$AGG_MODULE``); raises ImportError when it is missing."""
    return importlib.import_module(module_name())


def unavailable() -> str | None:
    """Why the daemon cannot be benchmarked here, or None."""
    try:
        mod = aggregate_module()
    except Exception as e:  # noqa: BLE001 - any import failure is a reason to skip
        return f"`import {module_name()}` failed: {type(e).__name__}: {e}"
    missing = [n for n in ("Daemon", "Worker") if not hasattr(mod, n)]
    if missing:
        return f"{module_name()} has no {', '.join(missing)}"
    return None


def open_worker(address: str, job: int, rank: int, size: int, dtype: str = "float32",
                scale: float | None = None, token: str | None = None, segment_values: int | None = None,
                rto: float | None = None):
    """A ``Worker`` for ``job`` (sync mode). ``scale`` is passed in int32 (fixed-point) mode,
    ``segment_values`` (values per packet) when given; the module's defaults otherwise."""
    mod = aggregate_module()
    kw = dict(job=job, rank=rank, size=size, mode="sync", dtype=dtype, token=token)
    if dtype == "int32" and scale is not None:
        kw["scale"] = scale
    if segment_values:
        kw["segment_values"] = segment_values
    if rto:
        kw["rto"] = rto
    if not offload():
        kw["offload"] = False
    return mod.Worker(address, **kw)


def offload() -> bool:
    """UDP segmentation/receive offload for daemons and workers (``aggregation.py
    --no-offload`` turns it off in every child through ``REPRISE_BENCH_OFFLOAD=0``)."""
    return os.environ.get("REPRISE_BENCH_OFFLOAD", "1") != "0"


def run_ns(pid: int) -> int:
    """Nanoseconds every thread of ``pid`` has run on a CPU (``/proc/PID/task/*/schedstat``)."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return total


class CpuSampler:
    """Samples :func:`run_ns` of a process every ``period`` seconds on a thread, so the CPU it
    used inside any time window (``time.monotonic``) can be read afterwards (:meth:`between`)."""

    def __init__(self, pid: int, period: float = 0.01):
        import time
        self.pid, self.period, self._clock = pid, period, time.monotonic
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.samples.append((self._clock(), run_ns(self.pid)))
            except OSError:
                return
            self._stop.wait(self.period)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(2.0)

    def between(self, t0: float, t1: float) -> float | None:
        """CPU seconds used in [t0, t1] (linear between samples), None without samples around it."""
        import numpy as np
        if len(self.samples) < 2 or t0 < self.samples[0][0] or t1 > self.samples[-1][0]:
            return None
        ts = np.array([t for t, _ in self.samples])
        ns = np.array([n for _, n in self.samples], dtype=np.float64)
        return float(np.interp(t1, ts, ns) - np.interp(t0, ts, ns)) / 1e9


def build_info() -> dict:
    """Which build of the module the benchmark ran: its path, the native library's SHA-256 and
    mtime, and the repository's commit (a rebuild during a run must not go unnoticed)."""
    import hashlib
    import subprocess
    import time
    out: dict = {"module": module_name()}
    try:
        mod = aggregate_module()
        out["path"] = os.path.dirname(mod.__file__)
        native = getattr(sys.modules.get(mod.__name__.rsplit(".", 1)[0] + "._native"), "__file__", None)
        if native:
            with open(native, "rb") as f:
                out["native_sha256"] = hashlib.sha256(f.read()).hexdigest()[:16]
            out["native_mtime"] = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(os.path.getmtime(native)))
    except Exception as e:  # noqa: BLE001 - informational
        out["error_reading"] = f"{type(e).__name__}: {e}"
    try:
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        out["git_head"] = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"], capture_output=True,
                                         text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        pass
    return out


def cpu_seconds(pid: int | str = "self", tid: int | str | None = None) -> float:
    """User + system CPU seconds of a process (or one of its threads), from /proc."""
    path = f"/proc/{pid}/stat" if tid is None else f"/proc/{pid}/task/{tid}/stat"
    with open(path) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def thread_cpu(pid: int | str = "self") -> dict:
    """{"tid name": CPU seconds} of every thread of a process."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                name = f.read().strip()
            out[f"{tid} {name}"] = cpu_seconds(pid, tid)
        except OSError:
            pass
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--address", default="127.0.0.1:0")
    ap.add_argument("--token", default=None)
    ap.add_argument("--drop-rate", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--busy-poll", action="store_true")
    args = ap.parse_args(argv)
    mod = aggregate_module()
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
    cpu0 = cpu_seconds()
    d = mod.Daemon(address=args.address, token=args.token, busy_poll=args.busy_poll,
                   drop_rate=args.drop_rate, seed=args.seed, **({} if offload() else {"offload": False}))
    print(f"READY {d.address}", flush=True)
    done.wait()
    out = {"module": module_name(), "cpu_s": cpu_seconds() - cpu0, "threads": thread_cpu()}
    try:
        out["stats"] = d.stats()
    except Exception as e:  # noqa: BLE001 - reported
        out["stats_error"] = f"{type(e).__name__}: {e}"
    d.stop()
    print(json.dumps(out, default=str), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
