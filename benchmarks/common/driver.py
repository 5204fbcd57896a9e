"""What the ``compare.py`` drivers share: the machine description, the single-core
memcpy baseline, finding each system's interpreter, running one system's module as a
subprocess and collecting its JSON object, the loop over the systems, the report's
file stem and header, and writing the ``.json`` / ``.md`` files (the markdown's pieces
are in :mod:`benchmarks.common.report`).

Standard library only at import time (numpy is imported inside
:func:`measure_memcpy`), so any venv's python can run this module:
``python -m benchmarks.common.driver --memcpy-only NBYTES ROUNDS`` prints one JSON line.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from typing import Callable

from benchmarks.common.processes import ROOT, module_command

BENCHMARKS = os.path.join(ROOT, "benchmarks")
VENVS = os.path.join(BENCHMARKS, ".venvs")
OUT = os.path.join(BENCHMARKS, "out")


# --- machine --------------------------------------------------------------------------
def host_info() -> dict:
    info = {"cpus": os.cpu_count(), "platform": platform.platform(),
            "python": platform.python_version(), "gpu": None}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    info["cpu_model"] = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    info["mem_gib"] = round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    try:
        r = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10)
        if r.returncode == 0 and r.stdout.strip():
            info["gpu"] = r.stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        pass
    return info


def memcpy_in_subprocess(nbytes: int, rounds: int) -> dict:
    """Run :func:`measure_memcpy` in a fresh interpreter (its 2 buffers are freed
    before any system runs): this one if it has numpy, else a peer venv's."""
    candidates = [sys.executable] + [os.path.join(VENVS, v, "bin", "python")
                                     for v in ("cpprb", "redis", "torchrl", "reverb")]
    for py in candidates:
        if not os.access(py, os.X_OK):
            continue
        if subprocess.run([py, "-c", "import numpy"], capture_output=True).returncode:
            continue
        r = subprocess.run(module_command(py, __spec__.name, "--memcpy-only", str(nbytes),
                                          str(rounds)), capture_output=True, text=True, cwd=ROOT)
        if r.returncode == 0:
            out = json.loads(r.stdout.strip().splitlines()[-1])
            out["python"] = py
            return out
        print(r.stderr, file=sys.stderr)
    raise SystemExit("no python with numpy found to measure memcpy")


def measure_memcpy(nbytes: int, rounds: int) -> dict:
    """Single-core copy bandwidth: ``dst[...] = src`` and ``np.copyto`` into a
    preallocated, already-touched buffer. GB/s counts the bytes copied once (as the
    systems' GB/s counts payload bytes), decimal GB."""
    import numpy as np

    src = np.full(nbytes, 7, dtype=np.uint8)
    dst = np.empty_like(src)
    dst[...] = src  # fault in every page of dst
    out = {"bytes": nbytes}
    for name, fn in (("numpy_assign", lambda: dst.__setitem__(Ellipsis, src)),
                     ("np_copyto", lambda: np.copyto(dst, src))):
        times = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        rates = [nbytes / t / 1e9 for t in times]
        out[name] = {"gb_per_s": statistics.median(rates), "rounds": rates}
    out["gb_per_s"] = max(out["numpy_assign"]["gb_per_s"], out["np_copyto"]["gb_per_s"])
    out["numpy"] = np.__version__
    return out


def memcpy_only_main() -> bool:
    """Handle ``--memcpy-only NBYTES ROUNDS`` (how :func:`memcpy_in_subprocess` runs
    this module); True if it did."""
    if len(sys.argv) == 4 and sys.argv[1] == "--memcpy-only":
        print(json.dumps(measure_memcpy(int(sys.argv[2]), int(sys.argv[3]))))
        return True
    return False


# --- running systems ------------------------------------------------------------------
def interpreter_for(venv: str | None, reprise_python: str) -> tuple[str | None, str | None]:
    """(python, reason it is missing)."""
    if venv is None:
        r = subprocess.run([reprise_python, "-c", "import reprise"], capture_output=True,
                           text=True)
        if r.returncode != 0:
            last = (r.stderr.strip().splitlines() or ["?"])[-1]
            return None, f"`import reprise` fails in {reprise_python}: {last}"
        return reprise_python, None
    py = os.path.join(VENVS, venv, "bin", "python")
    if not os.access(py, os.X_OK):
        return None, f"venv missing ({py}); run `bash benchmarks/setup_peers.sh {venv}`"
    return py, None


def run_system(name: str, python: str, module: str, args: list[str], timeout: float,
               log_path: str, echo: Callable[[str], bool],
               process_group: bool = False) -> dict:
    """Run ``module`` (``benchmarks.core.reprise_core``) with ``python`` from the
    repository root; its stdout is one JSON line at the end, its stderr (progress) goes
    to ``log_path`` and, for lines where ``echo(line)`` is true, to our stderr. Past
    ``timeout`` seconds it is killed: with ``process_group`` it runs in a session of its
    own and the whole group is killed (its servers and children too), else only the
    process."""
    cmd = module_command(python, module, *args)
    print(f"\n== {name}: {' '.join(cmd)}", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, cwd=ROOT, start_new_session=process_group)
        chunks: list[str] = []
        reader = threading.Thread(target=lambda: chunks.append(proc.stdout.read()), daemon=True)
        reader.start()
        killed = threading.Event()

        def kill() -> None:
            killed.set()
            if not process_group:
                proc.kill()
                return
            try:
                os.killpg(proc.pid, 9)
            except ProcessLookupError:
                pass

        watchdog = threading.Timer(timeout, kill)
        watchdog.start()
        try:
            for line in proc.stderr:
                log.write(line)
                if echo(line):
                    sys.stderr.write(line)
                    sys.stderr.flush()
            proc.wait()
        finally:
            watchdog.cancel()
        reader.join(timeout=10)
        if killed.is_set():
            return {"error": f"killed after {timeout:.0f}s", "log": log_path}
    wall = time.perf_counter() - t0
    stdout = "".join(chunks).strip()
    if proc.returncode != 0 or not stdout:
        return {"error": f"exit {proc.returncode}; see {log_path}", "log": log_path}
    try:
        result = json.loads(stdout.splitlines()[-1])
    except json.JSONDecodeError as exc:
        return {"error": f"bad JSON ({exc}); see {log_path}", "log": log_path}
    result["wall_s"] = round(wall, 1)
    result["log"] = log_path
    return result


# --- a driver's main ------------------------------------------------------------------
def add_common_args(ap, systems: list, quick_help: str) -> None:
    """The options every driver takes (``--only`` is the serving and remote drivers' own)."""
    ap.add_argument("--quick", action="store_true", help=quick_help)
    ap.add_argument("--systems", default=",".join(n for n, *_ in systems),
                    help="comma-separated subset of " + ",".join(n for n, *_ in systems))
    ap.add_argument("--out-dir", default=OUT,
                    help="where the .json, .md and .log files go (default benchmarks/out)")


def add_budget_args(ap) -> None:
    ap.add_argument("--budget-scale", type=float, default=1.0,
                    help="multiply every system's time budget")
    ap.add_argument("--reprise-python", default=sys.executable,
                    help="interpreter with reprise installed (default: this one)")


def wanted_systems(ap, args, systems: list) -> list[str]:
    wanted = [s for s in args.systems.split(",") if s]
    unknown = set(wanted) - {n for n, *_ in systems}
    if unknown:
        ap.error(f"unknown systems {sorted(unknown)}")
    return wanted


def command_line(module: str) -> str:
    """How this run was started (``python -m MODULE ARGS``), for the report."""
    return " ".join(["python -m " + module, *sys.argv[1:]])


def new_report(prefix: str, quick: bool, out_dir: str, suffix: str = "", **extra) -> tuple[str, dict]:
    """(file stem ``PREFIX-DATE[SUFFIX][-quick]``, report with date, quick, host and
    ``extra``); creates ``out_dir``."""
    os.makedirs(out_dir, exist_ok=True)
    now = dt.datetime.now()
    stem = f"{prefix}-{now:%Y%m%d-%H%M%S}{suffix}" + ("-quick" if quick else "")
    return stem, {"date": now.isoformat(timespec="seconds"), "quick": quick, "host": host_info(),
                  **extra}


def start_report(prefix: str, quick: bool, out_dir: str, **extra) -> tuple[str, dict]:
    """:func:`new_report` with empty ``systems`` and ``config`` and the memcpy baseline."""
    stem, report = new_report(prefix, quick, out_dir, systems={}, config={}, **extra)
    print("measuring single-core memcpy ...", file=sys.stderr, flush=True)
    report["memcpy"] = memcpy_in_subprocess(2**26 if quick else 2**30, 3 if quick else 7)
    print(f"memcpy: {report['memcpy']['gb_per_s']:.2f} GB/s", file=sys.stderr, flush=True)
    return stem, report


def own_progress(name: str, line: str) -> bool:
    """Whether a system's stderr line is its own progress line or a traceback."""
    return line.startswith(f"[{name} ") or "Traceback" in line


def run_systems(report: dict, stem: str, systems: list, wanted: list[str], args, *,
                quick_budget: float, extra_args: list[str] = (), load_limit: float = 1.0,
                load_warning: Callable[[str, float], str] = (
                    lambda name, load: f"WARNING: load average {load:.2f} before {name}"),
                timeout: Callable[[float], float] = lambda b: b + 240,
                echo: Callable[[str, str], bool] = own_progress,
                process_group: bool = True) -> None:
    """Run every selected system in turn, one subprocess each, into report["systems"]:
    ``--budget`` its budget (``quick_budget`` with ``--quick``) times ``--budget-scale``,
    then ``extra_args``; killed past ``timeout(budget)`` s (with ``process_group``, its
    whole process group); its stderr lines for which ``echo(name, line)`` holds shown."""
    for name, module, venv, budget in systems:
        if name not in wanted:
            report["systems"][name] = {"skipped": "not selected (--systems)"}
            continue
        python, why = interpreter_for(venv, args.reprise_python)
        if python is None:
            print(f"\n== {name}: SKIPPED: {why}", file=sys.stderr, flush=True)
            report["systems"][name] = {"skipped": why}
            continue
        b = (quick_budget if args.quick else budget) * args.budget_scale
        sys_args = ["--budget", str(b)] + (["--quick"] if args.quick else []) + list(extra_args)
        load = os.getloadavg()[0]
        if load > load_limit:
            print(load_warning(name, load), file=sys.stderr, flush=True)
        result = run_system(name, python, module, sys_args, timeout=timeout(b),
                            log_path=os.path.join(args.out_dir, f"{stem}-{name}.log"),
                            echo=lambda line, name=name: echo(name, line),
                            process_group=process_group)
        result["loadavg_1m_before"] = round(load, 2)
        report["systems"][name] = result
        if "config" in result and not report["config"]:
            report["config"] = result["config"]


def write_outputs(out_dir: str, stem: str, report: dict, md: str, json_default=None) -> None:
    """``STEM.json`` (``json_default`` as ``json.dump``'s ``default``) and ``STEM.md``; the
    markdown on stdout too."""
    with open(os.path.join(out_dir, stem + ".json"), "w") as f:
        json.dump(report, f, indent=1, default=json_default)
    with open(os.path.join(out_dir, stem + ".md"), "w") as f:
        f.write(md)
    print()
    print(md)
    print(f"wrote {os.path.join(out_dir, stem + '.json')} and .md", file=sys.stderr)


if __name__ == "__main__":
    if not memcpy_only_main():
        raise SystemExit(f"usage: python -m {__spec__.name} --memcpy-only NBYTES ROUNDS")

