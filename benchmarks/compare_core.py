"""Core comparison driver: Reprise against cpprb, TorchRL and Reverb on this machine.

    python3.11 benchmarks/compare_core.py            # full run, ~10-15 minutes
    python3.11 benchmarks/compare_core.py --quick    # checks the scripts; noisy numbers

Run it with the Python that has ``reprise`` installed (``pip install .``); the peers
run from their own venvs (``bash benchmarks/setup_peers.sh``), one system at a time,
each as a subprocess printing one JSON object (see ``bench_common.py``). A peer whose
venv is missing is skipped and the table says so. The same run measures this
machine's single-core memcpy bandwidth (numpy copy of a 1 GiB buffer into a
preallocated one), so large-item GB/s can be read as a fraction of it.

Writes ``benchmarks/out/core-<date>.json`` (everything: host, memcpy, every system's
full output) and ``.md`` (the table printed at the end).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
VENVS = os.path.join(HERE, ".venvs")
OUT = os.path.join(HERE, "out")

# name, script, venv (None: this interpreter), budget seconds in a full run
SYSTEMS = [
    ("reprise", "reprise_bench.py", None, 240),
    ("cpprb", "peers/cpprb_bench.py", "cpprb", 240),
    ("torchrl", "peers/torchrl_bench.py", "torchrl", 240),
    ("reverb", "peers/reverb_bench.py", "reverb", 420),
]
PEERS = [s[0] for s in SYSTEMS if s[0] != "reprise"]
DISPLAY = {"reprise": "Reprise", "cpprb": "cpprb", "torchrl": "TorchRL", "reverb": "Reverb"}
SIZE_ORDER = ["400B", "4KB", "40KB", "400KB"]
LARGE = {"40KB", "400KB"}  # rows that get "% of memcpy"


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
        r = subprocess.run([py, os.path.abspath(__file__), "--memcpy-only", str(nbytes),
                            str(rounds)], capture_output=True, text=True)
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


def run_system(name: str, python: str, script: str, args: list[str], timeout: float,
               log_path: str) -> dict:
    cmd = [python, os.path.join(HERE, script), *args]
    print(f"\n== {name}: {' '.join(cmd)}", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, cwd=HERE)
        # stdout is one JSON line at the end; stream stderr (progress) to us and the log.
        chunks: list[str] = []
        reader = threading.Thread(target=lambda: chunks.append(proc.stdout.read()), daemon=True)
        reader.start()
        killed = threading.Event()

        def kill() -> None:
            killed.set()
            proc.kill()

        watchdog = threading.Timer(timeout, kill)
        watchdog.start()
        try:
            for line in proc.stderr:
                log.write(line)
                if _interesting(line):
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


def _interesting(line: str) -> bool:
    # The system's own progress lines, and anything that looks like trouble; not the
    # thousands of lines of TensorFlow/Reverb chatter.
    return line.startswith("[") and ("/s" in line or "fail" in line or "skipped" in line) \
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


def si(x: float) -> str:
    for div, suf in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if x >= div:
            return f"{x / div:.3g}{suf}"
    return f"{x:.3g}"


def cell(entry: dict | None, missing: str) -> str:
    if entry is None:
        return missing
    if "skipped" in entry:
        return "skipped"
    if "error" in entry:
        return "error"
    rate, _ = rate_of(entry)
    text = si(rate)
    if "gb_per_s" in entry:
        text += f" ({entry['gb_per_s']:.2f} GB/s)"
    if entry.get("note"):
        text += " *"
    return text


def build_table(report: dict) -> str:
    systems = report["systems"]
    memcpy = report["memcpy"]["gb_per_s"]
    present = [n for n, _, _, _ in SYSTEMS]
    missing = {n: ("n/a" if "results" not in systems.get(n, {}) else "—") for n in present}
    header = ["workload", "unit"] + [DISPLAY[n] for n in present] + \
             ["Reprise / best peer", "Reprise % of 1-core memcpy"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for key in workload_keys():
        entries = {n: systems.get(n, {}).get("results", {}).get(key) for n in present}
        unit = next((rate_of(e)[1] for e in entries.values() if rate_of(e)[1]), "")
        row = [key, f"{unit}/s" if unit else ""]
        row += [cell(entries[n], missing[n]) for n in present]
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
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def build_markdown(report: dict) -> str:
    h = report["host"]
    m = report["memcpy"]
    out = [f"# Core comparison, {report['date']}" + (" (QUICK: tiny tables, noisy)"
                                                     if report["quick"] else ""),
           "",
           f"Machine: {h.get('cpu_model', '?')}, {h['cpus']} cores, {h.get('mem_gib', '?')} GiB, "
           f"GPU: {h['gpu'] or 'none'}; {h['platform']}.",
           f"Single-core memcpy (numpy, {m['bytes'] / 2**30:.3g} GiB buffer, median): "
           f"assign {m['numpy_assign']['gb_per_s']:.2f} GB/s, "
           f"np.copyto {m['np_copyto']['gb_per_s']:.2f} GB/s.",
           "",
           "Higher is better everywhere. GB/s is payload bytes (random float32, decimal GB). "
           "Items: one step of one float32 field; batches of 256; medians of "
           f"{report['config'].get('rounds', '?')} rounds after warm-up. "
           "`*` = see notes.",
           "",
           build_table(report),
           ""]
    busy = {n: s["loadavg_1m_before"] for n, s in report["systems"].items()
            if s.get("loadavg_1m_before", 0) > 0.7}
    if busy:
        out += ["**Warning:** the machine was busy (1-minute load average before the system "
                "started: " + ", ".join(f"{DISPLAY[n]} {v}" for n, v in busy.items()) +
                "); on 2 cores that skews every number, TorchRL's (2 intra-op threads) most.",
                ""]
    out.append("## Systems")
    for name, _, _, _ in SYSTEMS:
        s = report["systems"].get(name, {})
        if "results" not in s:
            out.append(f"- **{DISPLAY[name]}**: not run: {s.get('skipped') or s.get('error')}")
            continue
        vers = ", ".join(f"{k} {v}" for k, v in s["versions"].items())
        out.append(f"- **{DISPLAY[name]}** ({vers}; {s.get('wall_s', '?')} s)")
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
    return "\n".join(out) + "\n"


# --- main -----------------------------------------------------------------------------
def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--memcpy-only":
        print(json.dumps(measure_memcpy(int(sys.argv[2]), int(sys.argv[3]))))
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny tables, short rounds")
    ap.add_argument("--systems", default=",".join(n for n, *_ in SYSTEMS),
                    help="comma-separated subset of " + ",".join(n for n, *_ in SYSTEMS))
    ap.add_argument("--budget-scale", type=float, default=1.0,
                    help="multiply every system's time budget")
    ap.add_argument("--reprise-python", default=sys.executable,
                    help="interpreter with reprise installed (default: this one)")
    args = ap.parse_args()
    wanted = [s for s in args.systems.split(",") if s]
    unknown = set(wanted) - {n for n, *_ in SYSTEMS}
    if unknown:
        ap.error(f"unknown systems {sorted(unknown)}")

    os.makedirs(OUT, exist_ok=True)
    now = dt.datetime.now()
    stem = f"core-{now:%Y%m%d-%H%M%S}" + ("-quick" if args.quick else "")
    report = {"date": now.isoformat(timespec="seconds"), "quick": args.quick,
              "host": host_info(), "systems": {}, "config": {}}

    print("measuring single-core memcpy ...", file=sys.stderr, flush=True)
    report["memcpy"] = memcpy_in_subprocess(2**26 if args.quick else 2**30,
                                            3 if args.quick else 7)
    print(f"memcpy: {report['memcpy']['gb_per_s']:.2f} GB/s", file=sys.stderr, flush=True)

    for name, script, venv, budget in SYSTEMS:
        if name not in wanted:
            report["systems"][name] = {"skipped": "not selected (--systems)"}
            continue
        python, why = interpreter_for(venv, args.reprise_python)
        if python is None:
            print(f"\n== {name}: SKIPPED: {why}", file=sys.stderr, flush=True)
            report["systems"][name] = {"skipped": why}
            continue
        b = (90 if args.quick else budget) * args.budget_scale
        sys_args = ["--budget", str(b)] + (["--quick"] if args.quick else [])
        load = os.getloadavg()[0]
        if load > 0.7:
            print(f"WARNING: load average {load:.2f} before {name}: another process is busy; "
                  "numbers (TorchRL's especially) will be low", file=sys.stderr, flush=True)
        result = run_system(name, python, script, sys_args, timeout=2 * b + 180,
                            log_path=os.path.join(OUT, f"{stem}-{name}.log"))
        result["loadavg_1m_before"] = round(load, 2)
        report["systems"][name] = result
        if "config" in result and not report["config"]:
            report["config"] = result["config"]

    md = build_markdown(report)
    with open(os.path.join(OUT, stem + ".json"), "w") as f:
        json.dump(report, f, indent=1)
    with open(os.path.join(OUT, stem + ".md"), "w") as f:
        f.write(md)
    print()
    print(md)
    print(f"wrote {os.path.join(OUT, stem + '.json')} and .md", file=sys.stderr)


if __name__ == "__main__":
    main()
