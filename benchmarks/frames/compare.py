"""Atari frames in replay, every system in one run: memory per transition and 256-transition
uniform samples (issue 36).

    python -m benchmarks.frames.compare [--n 20000] [--quick]

Plays Pong (``ale-py``, random policy) for the frames, then runs each system of
``benchmarks.frames.systems`` in its own process on the same frames: Reprise in this
Python, cpprb in ``benchmarks/.venvs/cpprb`` (``benchmarks/setup_peers.sh cpprb``; skipped
when missing), TorchRL where it imports. Reports bytes per transition against raw stacked
storage (obs and next_obs stacks, 2 x 4 x 84 x 84 bytes = 1.0) and sample medians, and
writes ``benchmarks/out/frames-<time>.json``. The frames file is removed at the end."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from benchmarks.frames.frames import STACK, collect

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RAW_STACKED = 2 * STACK * 84 * 84
SYSTEMS = ("reprise-raw", "reprise-stack", "reprise-zstd", "reprise-field", "reprise-field-zstd", "cpprb", "cpprb-nstep",
           "torchrl-lazy", "torchrl-zstd")


def python_for(system: str) -> str | None:
    if system.startswith("cpprb"):
        venv = os.path.join(ROOT, "benchmarks", ".venvs", "cpprb", "bin", "python")
        return venv if os.path.exists(venv) else None
    if system.startswith("torchrl"):
        try:
            import torchrl  # noqa: F401
        except ImportError:
            return None
    return sys.executable


def run(system: str, frames: str, n: int) -> dict:
    python = python_for(system)
    if python is None:
        return {"system": system, "skipped": "not installed (benchmarks/setup_peers.sh)"}
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(ROOT, "python"), ROOT]), OMP_NUM_THREADS="1")
    p = subprocess.run([python, "-m", "benchmarks.frames.systems", system, frames, str(n)], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=1800)
    if p.returncode != 0:
        return {"system": system, "error": p.stderr.strip().splitlines()[-1] if p.stderr.strip() else str(p.returncode)}
    return json.loads(p.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=20000, help="transitions each buffer holds (full)")
    ap.add_argument("--quick", action="store_true", help="2,000 transitions")
    ap.add_argument("--only", default="", help="comma-separated systems")
    args = ap.parse_args(argv)
    n = 2000 if args.quick else args.n
    systems = [s for s in SYSTEMS if not args.only or s in args.only.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        frames = os.path.join(tmp, "pong.npz")
        t0 = time.perf_counter()
        collect(n + 200, frames)
        print(f"frames: {n + 200} Pong steps in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
        results = [run(s, frames, n) for s in systems]
    by = {r["system"]: r for r in results}
    print(f"{'system':18} {'bytes/transition':>17} {'vs raw stacked':>15} {'sample 256 (us)':>16}")
    for r in results:
        if "bytes" not in r:
            print(f"{r['system']:18} {r.get('skipped') or r.get('error')}")
            continue
        per = r["bytes"] / r["n"]
        r["bytes_per_transition"], r["vs_raw_stacked"] = per, per / RAW_STACKED
        print(f"{r['system']:18} {per:17,.0f} {per / RAW_STACKED:15.4f} {r['sample_us']:16,.0f}"
              + ("  (rss)" if r.get("bytes_from") == "rss" else ""))
    ratios = {}
    for mine in ("reprise-zstd", "reprise-field-zstd"):
        z = by.get(mine, {})
        for other in SYSTEMS:
            o = by.get(other, {})
            if "sample_us" in z and "sample_us" in o and other != mine:
                ratios[f"{mine} sample speed / {other}"] = o["sample_us"] / z["sample_us"]
    for k, v in ratios.items():
        print(f"{k}: {v:.2f}x")
    out_dir = os.path.join(ROOT, "benchmarks", "out")
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, f"frames-{time.strftime('%Y%m%d-%H%M%S')}.json")
    with open(path, "w") as f:
        json.dump({"n": n, "raw_stacked_bytes": RAW_STACKED, "results": results, "ratios": ratios,
                   "host": os.uname().nodename, "cpus": os.cpu_count()}, f, indent=1)
    print(f"wrote {os.path.relpath(path, ROOT)}", file=sys.stderr)
    return 0 if all("bytes" in r or "skipped" in r for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
