"""File stores vs TorchRL's LazyMemmapStorage on data larger than memory (issue 36).

    python -m benchmarks.filetier.compare [--memory 2G] [--ratio 1.5] [--dir DIR] [--quick]

Each system runs in its own process inside a memory cgroup limited to ``--memory`` (page
cache included; cgroup v1 or v2, as root), so data of ``--ratio`` times that limit does not
fit in the memory the process may use, as on a machine whose RAM is that size (without a
cgroup the machine's own RAM is the limit and the data is sized from it). Per row size
(4 KB, 40 KB), twice: *cold*, data of ``--ratio`` times the limit (most random rows are
not in the page cache), and *warm*, data of a quarter of it (every row is, once written).
Each run fills the buffer, then times 256-row uniform samples (median of 30). The device's
own limit: fio random reads of the same size at 16 in flight with O_DIRECT, as the time
256 of them take. Every file is removed after its system's run. Writes
``benchmarks/out/filetier-<time>.json``."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def parse_bytes(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(float(text[:-1]) * units[text[-1].upper()]) if text[-1].upper() in units else int(text)


def memory_cgroup(limit: int) -> str | None:
    """A memory cgroup limited to ``limit`` bytes that this process may put children in
    (its path, for ``cgroup.procs``), or None."""
    with open("/proc/self/cgroup") as f:
        lines = f.read().splitlines()
    for line in lines:
        _, controllers, rel = line.split(":", 2)
        if "memory" in controllers.split(","):
            base = os.path.join("/sys/fs/cgroup/memory", rel.lstrip("/"))
            knob = "memory.limit_in_bytes"
            break
    else:
        rel = next((l.split(":", 2)[2] for l in lines if l.startswith("0::")), None)
        if rel is None:
            return None
        base, knob = os.path.join("/sys/fs/cgroup", rel.lstrip("/")), "memory.max"
    path = os.path.join(base, f"reprise-filetier-{os.getpid()}")
    try:
        os.makedirs(path, exist_ok=True)
        with open(os.path.join(path, knob), "w") as f:
            f.write(str(limit))
    except OSError:
        return None
    return path


def run(system: str, directory: str, rows: int, row_bytes: int, cgroup: str | None) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(ROOT, "python"), ROOT]), OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "benchmarks.filetier.systems", system, directory, str(rows), str(row_bytes)]
    if cgroup:
        cmd = ["sh", "-c", f'echo $$ > {cgroup}/cgroup.procs && exec "$@"', "sh", *cmd]
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=3600)
    shutil.rmtree(directory, ignore_errors=True)
    if p.returncode != 0:
        return {"system": system, "error": (p.stderr.strip().splitlines() or [str(p.returncode)])[-1]}
    return json.loads(p.stdout.strip().splitlines()[-1])


def fio(directory: str, row_bytes: int) -> dict:
    if shutil.which("fio") is None:
        return {"system": "fio", "skipped": "fio is not installed (apt-get install fio)"}
    os.makedirs(directory, exist_ok=True)
    try:
        p = subprocess.run(["fio", "--name=rand", f"--filename={directory}/fio.dat", "--size=2G", "--rw=randread",
                            f"--bs={row_bytes}", "--direct=1", "--ioengine=psync", "--numjobs=16",
                            "--group_reporting", "--runtime=8", "--time_based", "--output-format=json"],
                           capture_output=True, text=True, timeout=600)
        iops = json.loads(p.stdout)["jobs"][0]["read"]["iops"]
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return {"system": "fio", "row_bytes": row_bytes, "iops": iops, "batch_us": 256 / iops * 1e6}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--memory", default="2G", help="the memory cgroup limit (page cache included)")
    ap.add_argument("--ratio", type=float, default=1.5, help="data size as a multiple of the memory")
    ap.add_argument("--dir", default=os.path.join(ROOT, "benchmarks", "out", "filetier-data"),
                    help="a directory on the disk to measure (removed after)")
    ap.add_argument("--row-bytes", default="4096,40960")
    ap.add_argument("--systems", default="reprise,torchrl")
    ap.add_argument("--caches", default="cold,warm")
    ap.add_argument("--quick", action="store_true", help="256 MB of data, no cgroup")
    args = ap.parse_args(argv)
    limit = parse_bytes(args.memory)
    cgroup = None if args.quick else memory_cgroup(limit)
    if cgroup is None and not args.quick:
        limit = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        print(f"no memory cgroup here: sizing the data from the machine's {limit / 2**30:.1f} GiB", file=sys.stderr)
    sizes = {"cold": 256 << 20 if args.quick else int(args.ratio * limit), "warm": (64 << 20) if args.quick else limit // 4}
    results = []
    for row_bytes in (int(x) for x in args.row_bytes.split(",")):
        for cache, data in sizes.items():
            if cache not in args.caches.split(","):
                continue
            rows = data // row_bytes
            for system in args.systems.split(","):
                t0 = time.perf_counter()
                r = run(system, os.path.join(args.dir, system), rows, row_bytes, cgroup)
                r["cache"] = cache
                print(f"{cache} {system} {row_bytes} B x {rows}: {r} ({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
                results.append(r)
        results.append(fio(os.path.join(args.dir, "fio"), row_bytes))
    if cgroup:
        try:
            os.rmdir(cgroup)
        except OSError:
            pass
    print(f"cold: data {sizes['cold'] / 2**30:.2f} GiB, warm: {sizes['warm'] / 2**30:.2f} GiB; memory limit "
          f"{limit / 2**30:.2f} GiB" + (" (cgroup)" if cgroup else ""))
    print(f"{'system':8} {'row':>6} {'cache':>6} {'fill GB/s':>10} {'sample 256 (us)':>16}")
    by = {}
    for r in results:
        if r.get("system") == "fio" and "iops" in r:
            print(f"{'fio':8} {r['row_bytes']:>6} {'':>6} {'':>10} {r['batch_us']:16,.0f}  (device limit, O_DIRECT)")
        elif "sample_us" in r:
            by[(r["system"], r["row_bytes"], r["cache"])] = r
            print(f"{r['system']:8} {r['row_bytes']:>6} {r['cache']:>6} {r['fill_gb_s']:10.3f} {r['sample_us']:16,.0f}")
        else:
            print(f"{r.get('system')}: {r.get('error') or r.get('skipped')}")
    for (system, rb, cache), r in sorted(by.items()):
        peer = by.get(("torchrl", rb, cache))
        if system == "reprise" and peer:
            print(f"{rb} B {cache}: Reprise {peer['sample_us'] / r['sample_us']:.2f}x TorchRL")
    out = os.path.join(ROOT, "benchmarks", "out", f"filetier-{time.strftime('%Y%m%d-%H%M%S')}.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump({"data_bytes": sizes, "memory_limit": limit, "cgroup": bool(cgroup), "results": results}, f, indent=1)
    print(f"wrote {os.path.relpath(out, ROOT)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
