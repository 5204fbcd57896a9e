"""What the live dashboard costs its server (issue 16): the server process's CPU time with
no dashboard client, with 10 clients each streaming ``/api/events`` (Server-Sent Events,
one snapshot a second), and with 10 clients each polling ``/api/snapshot`` once a second.

    python -m benchmarks.dashboard_cost            # 3 phases x 30 s x 3 rounds, ~5 minutes
    python -m benchmarks.dashboard_cost --quick    # smoke test, ~15 s

Goal: 10 dashboard clients cost the server less than 1% of one core.

Three processes besides this one (the driver, which only reads ``/proc``):

- the server (``--serve SPEC``): one ``rp.Store`` + ``rp.Table`` (100,000 one-step items of
  one float32[100] field, Uniform, Fifo, every built-in extension: the default), filled,
  served by ``rp.Server([table], dashboard_address="127.0.0.1:0")`` (local transport and
  dashboard; no gRPC);
- the load (``--load``): a writer thread appending 100 steps + 100 items and flushing every
  0.1 s (1,000 items/s) and a sampler thread drawing 256 items with their data every 0.1 s
  (2,560 samples/s), over ``rp.Client(server.local_address)``; it runs through every phase;
- the dashboard clients (``--clients MODE N``), one process with N threads, each with its
  own keep-alive HTTP connection: ``events`` reads the SSE stream, ``poll`` GETs
  ``/api/snapshot`` once a second (starts staggered over the second), as N open pages would.

Each round runs the phases ``idle`` (no dashboard client), ``events`` and ``poll`` in an
order rotated by the round; a phase starts its clients, waits ``settle`` seconds, then
counts the server's CPU seconds (``/proc/PID/stat`` utime + stime) over ``seconds`` seconds,
and per thread (``/proc/PID/task/*/stat``, by thread name: the dashboard's threads are
``reprise-dashboa[rd]``). Reported: CPU as % of one core per phase (median over rounds),
and the extra of each client phase over the idle phase of the same round (median), for the
whole process and for the dashboard's threads alone. Writes
``benchmarks/out/dashboard-<date>.json`` and ``.md`` (``--out-dir`` elsewhere).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import sys
import threading
import time

from benchmarks.common.config import Config
from benchmarks.common.driver import OUT, command_line, start_report, write_outputs
from benchmarks.common.processes import ModuleChild, ServerProcess, ready_until_stdin_closes, serve_if_asked
from benchmarks.common.report import machine_lines

GOAL_PCT = 1.0  # extra CPU of 10 dashboard clients, % of one core
PHASES = ["idle", "events", "poll"]
FULL = dict(seconds=30.0, rounds=3, settle=3.0, clients=10, items=100_000, floats=100,
            write_batch=100, sample_batch=256, period=0.1)
QUICK = dict(seconds=1.5, rounds=1, settle=0.5, items=2_000)
TICK = os.sysconf("SC_CLK_TCK")


def log(msg: str) -> None:
    print(f"[dashboard {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --- the server (child) ----------------------------------------------------------------------
def serve(spec_json: str) -> None:
    import numpy as np
    import reprise as rp

    spec = json.loads(spec_json)
    n, k = spec["items"], spec["floats"]
    store = rp.Store({"x": rp.Field((k,), "float32")}, capacity=n + 4096, block_steps=64)
    table = rp.Table("replay", store, sampler=rp.selectors.Uniform(), remover=rp.selectors.Fifo(),
                     max_size=n, rate_limiter=rp.rate_limiters.MinSize(1))
    src = np.random.default_rng(0).standard_normal((4096, 1, k), dtype=np.float32)
    for start in range(0, n, 4096):
        m = min(4096, n - start)
        table.insert({"x": src[:m]}, priorities=np.ones(m))
    server = rp.Server([table], dashboard_address="127.0.0.1:0")

    ready_until_stdin_closes(server.dashboard_address, server.local_address)
    server.stop()
    table.reset()
    store.close()


# --- the load (child) ------------------------------------------------------------------------
def load(address: str, spec_json: str) -> None:
    """Writes and samples at a steady rate until stdin closes; prints its counts."""
    import numpy as np
    import reprise as rp

    spec = json.loads(spec_json)
    period, wb, sb = spec["period"], spec["write_batch"], spec["sample_batch"]
    stop = threading.Event()
    counts = {"inserted": 0, "sampled": 0}
    client = rp.Client(address)

    def paced(step) -> None:
        next_t = time.monotonic()
        while not stop.is_set():
            step()
            next_t += period
            stop.wait(max(0.0, next_t - time.monotonic()))

    def writer() -> None:
        rows = np.random.default_rng(1).standard_normal((wb, spec["floats"]), dtype=np.float32)
        ones = np.ones(wb)
        with client.writer("replay", max_sequence_length=wb) as w:
            def step() -> None:
                w.extend({"x": rows})
                w.create_items("replay", 1, ones)
                w.flush()
                counts["inserted"] += wb
            paced(step)

    def sampler() -> None:
        def step() -> None:
            client.sample("replay", sb).data["x"]
            counts["sampled"] += sb
        paced(step)

    threads = [threading.Thread(target=f, daemon=True) for f in (writer, sampler)]
    for t in threads:
        t.start()
    ready_until_stdin_closes()
    stop.set()
    for t in threads:
        t.join(timeout=10)
    print(json.dumps(counts), flush=True)


# --- the dashboard clients (child) -----------------------------------------------------------
def clients(mode: str, n: int, address: str) -> None:
    """N threads streaming /api/events or polling /api/snapshot at 1 Hz until stdin closes."""
    host, port = address.rsplit(":", 1)
    stop = threading.Event()
    got = [{"snapshots": 0, "bytes": 0, "errors": 0} for _ in range(n)]

    def stream(i: int) -> None:
        while not stop.is_set():
            try:
                conn = http.client.HTTPConnection(host, int(port), timeout=5)
                conn.request("GET", "/api/events", headers={"Accept": "text/event-stream"})
                r = conn.getresponse()
                while not stop.is_set():
                    line = r.fp.readline()
                    if not line:
                        break
                    got[i]["bytes"] += len(line)
                    if line.startswith(b"event: snapshot"):
                        got[i]["snapshots"] += 1
                conn.close()
            except (OSError, http.client.HTTPException):
                if not stop.is_set():
                    got[i]["errors"] += 1
                    stop.wait(0.5)

    def poll(i: int) -> None:
        conn = http.client.HTTPConnection(host, int(port), timeout=5)
        next_t = time.monotonic() + i / n
        while not stop.wait(max(0.0, next_t - time.monotonic())):
            next_t += 1.0
            try:
                conn.request("GET", "/api/snapshot")
                body = conn.getresponse().read()
                json.loads(body)
                got[i]["snapshots"] += 1
                got[i]["bytes"] += len(body)
            except (OSError, http.client.HTTPException, ValueError):
                got[i]["errors"] += 1
                conn.close()
                conn = http.client.HTTPConnection(host, int(port), timeout=5)
        conn.close()

    target = stream if mode == "events" else poll
    threads = [threading.Thread(target=target, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    ready_until_stdin_closes()
    stop.set()
    total = {k: sum(g[k] for g in got) for k in got[0]}
    print(json.dumps(total), flush=True)
    os._exit(0)  # stream threads may sit in a read until the next snapshot


# --- the driver ------------------------------------------------------------------------------
def child(*args: str) -> ModuleChild:
    """This module with ``ARGS`` (``--load``, ``--clients``): READY, then its counts as one
    JSON line once its stdin closes."""
    return ModuleChild(__spec__.name, *args, stop_timeout=30.0)


def cpu_seconds(stat_path: str) -> tuple[str, float]:
    """(name, utime + stime in seconds) of a /proc stat file."""
    with open(stat_path) as f:
        text = f.read()
    name = text[text.index("(") + 1:text.rindex(")")]
    fields = text[text.rindex(")") + 2:].split()
    return name, (int(fields[11]) + int(fields[12])) / TICK  # utime, stime: fields 14, 15


def cpu_snapshot(pid: int) -> dict:
    """Process CPU seconds and, per thread name, the sum over that name's threads."""
    _, total = cpu_seconds(f"/proc/{pid}/stat")
    threads: dict[str, float] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            name, s = cpu_seconds(f"/proc/{pid}/task/{tid}/stat")
        except OSError:  # the thread ended
            continue
        threads[name] = threads.get(name, 0.0) + s
    return {"total": total, "threads": threads}


def dashboard_share(threads: dict) -> float:
    return sum(v for k, v in threads.items() if k.startswith("reprise-dashboa"))


def run_phase(cfg: Config, server: ServerProcess, phase: str) -> dict:
    pid = server.proc.pid
    kids = None if phase == "idle" else child("--clients", phase, str(cfg.clients), server.address)
    time.sleep(cfg.settle)
    load_before = os.getloadavg()[0]
    a, t0 = cpu_snapshot(pid), time.monotonic()
    time.sleep(cfg.seconds)
    b, t1 = cpu_snapshot(pid), time.monotonic()
    got = kids.finish() if kids is not None else {}
    wall = t1 - t0
    threads = {k: 100 * (v - a["threads"].get(k, 0.0)) / wall for k, v in b["threads"].items()}
    return {"phase": phase, "seconds": round(wall, 3), "loadavg_1m_before": round(load_before, 2),
            "cpu_pct": 100 * (b["total"] - a["total"]) / wall,
            "dashboard_threads_pct": dashboard_share(threads),
            "threads_pct": {k: round(v, 3) for k, v in sorted(threads.items()) if v > 0},
            "clients": got}


def summarize(rounds: list[list[dict]]) -> dict:
    out = {}
    for phase in PHASES:
        by = [next(p for p in r if p["phase"] == phase) for r in rounds]
        out[phase] = {"cpu_pct": statistics.median(p["cpu_pct"] for p in by),
                      "dashboard_threads_pct": statistics.median(p["dashboard_threads_pct"] for p in by)}
    for phase in PHASES[1:]:
        extra, extra_dash = [], []
        for r in rounds:
            idle = next(p for p in r if p["phase"] == "idle")
            p = next(p for p in r if p["phase"] == phase)
            extra.append(p["cpu_pct"] - idle["cpu_pct"])
            extra_dash.append(p["dashboard_threads_pct"] - idle["dashboard_threads_pct"])
        out[phase].update(extra_pct=statistics.median(extra), extra_pct_rounds=extra,
                          extra_dashboard_pct=statistics.median(extra_dash),
                          met=statistics.median(extra) < GOAL_PCT)
    return out


def build_markdown(report: dict) -> str:
    cfg, s = report["config"], report["summary"]
    lines = ["# Dashboard cost (issue 16)", ""] + machine_lines(report) + [""]
    lines += [f"Server: one table of {cfg['items']:,} items (every built-in extension), local transport + "
              f"dashboard; load: {cfg['write_batch'] / cfg['period']:,.0f} items/s written and "
              f"{cfg['sample_batch'] / cfg['period']:,.0f} samples/s drawn by another process. "
              f"{cfg['rounds']} round(s) of the 3 phases x {cfg['seconds']} s, order rotated; medians. "
              f"Goal: {cfg['clients']} clients cost < {GOAL_PCT}% of one core.", "",
              "| phase | server CPU, % of a core | dashboard threads | extra over idle (process) "
              "| extra over idle (dashboard threads) | < 1%? |", "|---|---|---|---|---|---|"]
    names = {"idle": "no dashboard client", "events": f"{cfg['clients']} x /api/events (SSE)",
             "poll": f"{cfg['clients']} x /api/snapshot at 1 Hz"}
    for phase in PHASES:
        p = s[phase]
        per_round = ", ".join(f"{x:+.2f}" for x in p.get("extra_pct_rounds", []))
        extra = "" if phase == "idle" else f"{p['extra_pct']:+.2f}% ({per_round})"
        dash = "" if phase == "idle" else f"{p['extra_dashboard_pct']:+.3f}%"
        met = "" if phase == "idle" else ("yes" if p["met"] else "**no**")
        lines.append(f"| {names[phase]} | {p['cpu_pct']:.2f}% | {p['dashboard_threads_pct']:.3f}% | "
                     f"{extra} | {dash} | {met} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    if serve_if_asked(serve):
        return
    if len(sys.argv) > 3 and sys.argv[1] == "--load":
        load(sys.argv[2], sys.argv[3])
        return
    if len(sys.argv) > 4 and sys.argv[1] == "--clients":
        clients(sys.argv[2], int(sys.argv[3]), sys.argv[4])
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="short phases, a small table: a smoke test")
    ap.add_argument("--seconds", type=float, default=None, help="seconds measured per phase (default 30)")
    ap.add_argument("--rounds", type=int, default=None, help="rounds of the three phases (default 3)")
    ap.add_argument("--out-dir", default=OUT, help="where the .json and .md go (default benchmarks/out)")
    args = ap.parse_args()
    cfg = Config.choose(args.quick, None, FULL, QUICK).override(args, "seconds", "rounds")
    stem, report = start_report("dashboard", args.quick, args.out_dir,
                                command=command_line(__spec__.name))
    report["config"] = cfg.as_dict()
    report["goal"] = {"extra_pct_of_a_core_max": GOAL_PCT}
    spec = json.dumps({k: getattr(cfg, k)
                       for k in ("items", "floats", "write_batch", "sample_batch", "period")})
    log("starting the server (filling its table) ...")
    server = ServerProcess(__spec__.name, json.loads(spec))
    local_address = server.extra[0]
    rounds = []
    try:
        load_proc = child("--load", local_address, spec)
        try:
            for r in range(cfg.rounds):
                order = PHASES[r % 3:] + PHASES[:r % 3]
                phases = []
                for phase in order:
                    p = run_phase(cfg, server, phase)
                    log(f"round {r + 1}/{cfg.rounds} {phase}: server {p['cpu_pct']:.2f}% of a core, "
                        f"dashboard threads {p['dashboard_threads_pct']:.3f}% {p['clients'] or ''}")
                    phases.append(p)
                rounds.append(phases)
        finally:
            report["load"] = load_proc.finish()
    finally:
        server.stop()
    report["rounds"] = rounds
    report["summary"] = summarize(rounds)
    write_outputs(args.out_dir, stem, report, build_markdown(report))


if __name__ == "__main__":
    main()
