"""Shared harness for the remote comparison (``compare_remote.py``): a replay server in
its own process and 1, 2, 4 or 8 client processes on the same host, over loopback TCP.

Every system script (``reprise_remote.py``, ``peers/reverb_remote.py``) starts its
server as a child process (``script --serve SPECS``, which prints ``READY <address>``
and serves until its stdin closes) and a pool of ``max(CLIENTS)`` spawned client
processes, started once and reused for every point (Reverb's clients import
TensorFlow: starting them per point would cost more than the points). This module owns
what must be identical across systems: item sizes, batches, table sizes, payloads,
how a point is timed, percentiles and the JSON layout. numpy and the standard library
only (through ``serving_common``), so every venv can import it.

Workloads (keys of ``results``), each for n in CLIENTS:
  insert[SIZE/nc]  n processes, each writing batches of one-step items into a FIFO
                   ring (already full, so every insert evicts); one call = the
                   system's batched write of BATCH[SIZE] items + a flush that returns
                   once they are in the table: items/s, GB/s, latency per call
  sample[SIZE/nc]  n processes, each drawing uniform batches of BATCH[SIZE] items with
                   their data as numpy from a prefilled table: items/s, GB/s, latency
                   per call

A point: the processes start together, warm up for ``warmup_seconds``, then count the
calls that finish inside a window of ``window_seconds``; ``rounds`` such windows. items/s
is the median over rounds of the sum over processes; p50/p99 are over every call of every
round that started and finished inside a window. GB/s counts payload bytes (decimal).
"""

from __future__ import annotations

import json
import queue as queue_mod
import statistics
import subprocess
import sys
import traceback
from dataclasses import dataclass

import numpy as np

from serving_common import (Bench, Window, latency_stats, mp_context, now,  # noqa: F401
                            payload)

SIZES = [("4KB", 4_000), ("400KB", 400_000)]
# Items per call. 16 x 400 KB = 6.4 MB keeps every message far below the 64 MiB
# limit both servers have by default (256 x 400 KB would be 102 MB).
BATCH = {"4KB": 256, "400KB": 16}
# Items in each table (the insert rings and the sample tables): 64 MB and 410 MB.
TABLE_ITEMS = {"4KB": 16_384, "400KB": 1_024}
CLIENTS = [1, 2, 4, 8]
OPS = ["insert", "sample"]
SOCKET_BUFFER = 4 << 20        # plain-socket test: bytes per sendall / recv_into


def size_bytes(label: str) -> int:
    return dict(SIZES)[label]


def floats(label: str) -> int:
    return size_bytes(label) // 4


def key(op: str, label: str, n: int) -> str:
    return f"{op}[{label}/{n}c]"


def table_name(op: str, label: str) -> str:
    return f"{op}_{label}"


def table_specs() -> list[dict]:
    """One table per (op, size): ``name``, ``floats`` (float32 per item), ``items``,
    ``batch`` (items per call)."""
    return [{"name": table_name(op, label), "floats": floats(label), "items": TABLE_ITEMS[label],
             "batch": BATCH[label]} for op in OPS for label, _ in SIZES]


@dataclass
class Config:
    quick: bool
    rounds: int
    warmup_seconds: float
    window_seconds: float
    budget_seconds: float
    start_timeout: float = 180.0   # 8 client processes importing TensorFlow on 2 cores

    def as_dict(self) -> dict:
        d = dict(self.__dict__)
        d.update(sizes=dict(SIZES), batch=BATCH, table_items=TABLE_ITEMS, clients=CLIENTS,
                 socket_buffer=SOCKET_BUFFER)
        return d


def make_config(quick: bool, budget: float | None) -> Config:
    if quick:
        return Config(quick=True, rounds=2, warmup_seconds=0.2, window_seconds=0.4,
                      budget_seconds=budget or 120.0)
    return Config(quick=False, rounds=3, warmup_seconds=0.5, window_seconds=2.0,
                  budget_seconds=budget or 300.0)


def batch_rows(label: str, seed: int) -> np.ndarray:
    """float32[BATCH, floats] of random normals: one call's items, one step each."""
    return payload(BATCH[label], floats(label), seed)


# --- a system's server process -------------------------------------------------------------
class ServerProcess:
    """``script --serve SPECS`` as a child process that prints ``READY <port>`` or
    ``READY <host:port>`` once it serves; ``stop`` closes its stdin (the server's
    signal to stop) and waits up to ``stop_timeout`` s before killing it."""

    def __init__(self, script: str, specs, stop_timeout: float = 60.0) -> None:
        self.stop_timeout = stop_timeout
        self.proc = subprocess.Popen([sys.executable, script, "--serve", json.dumps(specs)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        if not line.startswith("READY "):
            self.proc.kill()
            raise RuntimeError(f"{script}: the server did not start: {line!r}")
        addr = line.split()[1]
        self.address = addr if ":" in addr else f"localhost:{int(addr)}"
        self.extra = line.split()[2:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=self.stop_timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def rss_mib(self) -> float | None:
        try:
            with open(f"/proc/{self.proc.pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        return int(line.split()[1]) / 1024
        except OSError:
            return None
        return None


def serve_until_stdin_closes(address: str, stop) -> None:
    """The end of a ``--serve`` child: say where it serves, wait, stop."""
    print(f"READY {address}", flush=True)
    sys.stdin.read()
    stop()


# --- timing --------------------------------------------------------------------------------
def window_run(win: Window, call) -> dict:
    """Call back to back from win.start to win.end: the number of calls that finished
    inside the window, and the latency (s) of those that also started inside it."""
    win.wait_start()
    done = 0
    lat = []
    while True:
        t0 = now()
        if t0 >= win.end:
            break
        call()
        t1 = now()
        if win.begin <= t1 <= win.end:
            done += 1
            if t0 >= win.begin:
                lat.append(t1 - t0)
    return {"calls": done, "lat": lat}


# --- client processes ----------------------------------------------------------------------
def worker_main(setup, args, index: int, cmd_q, res_q) -> None:
    """A pooled client process. ``setup(index, *args)`` connects and returns
    ``make(op, label) -> (call, close)``; commands then come on ``cmd_q``:
    ("prepare", op, label): make (once) and call once; ("run", start, warmup, window):
    :func:`window_run` of the prepared call; ("stop",): close everything made."""
    try:
        make = setup(index, *args)
        made: dict = {}
        call = None
        res_q.put((index, "ready", None))
        while True:
            cmd = cmd_q.get()
            if cmd[0] == "stop":
                for _, close in made.values():
                    close()
                res_q.put((index, "stopped", None))
                return
            if cmd[0] == "prepare":
                if cmd[1:] not in made:
                    made[cmd[1:]] = make(*cmd[1:])
                call = made[cmd[1:]][0]
                call()
                res_q.put((index, "ready", None))
            elif cmd[0] == "run":
                _, start, warmup, window = cmd
                res_q.put((index, "result", window_run(Window(start, warmup, window), call)))
    except BaseException as exc:  # report everything, including KeyboardInterrupt
        res_q.put((index, "error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))


class Pool:
    """``size`` spawned client processes (see :func:`worker_main`), reused for every
    point; a point with n clients uses the first n."""

    def __init__(self, size: int, setup, args: tuple, cfg: Config, log) -> None:
        self.ctx = mp_context()
        self.cfg = cfg
        self.log = log
        self.res_q = self.ctx.Queue()
        self.cmd_qs = [self.ctx.Queue() for _ in range(size)]
        self.procs = [self.ctx.Process(target=worker_main, name=f"client{i}", daemon=True,
                                       args=(setup, args, i, self.cmd_qs[i], self.res_q))
                      for i in range(size)]
        t0 = now()
        for p in self.procs:
            p.start()
        self._collect(range(size), "ready", "starting", cfg.start_timeout)
        self.start_s = now() - t0

    def point(self, op: str, label: str, n: int) -> list[dict]:
        """Rounds of one point: per round, the calls and latencies of each client."""
        cfg = self.cfg
        for i in range(n):
            self.cmd_qs[i].put(("prepare", op, label))
        self._collect(range(n), "ready", f"preparing {op}[{label}]", 120.0)
        rounds = []
        for _ in range(cfg.rounds):
            start = now() + 0.05
            for i in range(n):
                self.cmd_qs[i].put(("run", start, cfg.warmup_seconds, cfg.window_seconds))
            out = self._collect(range(n), "result", f"running {op}[{label}]",
                                cfg.warmup_seconds + cfg.window_seconds + 120.0)
            rounds.append([out[i] for i in range(n)])
        return rounds

    def close(self) -> None:
        for q in self.cmd_qs:
            q.put(("stop",))
        try:
            self._collect(range(len(self.procs)), "stopped", "stopping", 60.0)
        except RuntimeError:
            pass  # a client already failed (and was reported): kill the rest
        finally:
            for p in self.procs:
                p.join(timeout=10)
                if p.is_alive():
                    p.kill()

    def kill(self) -> None:
        for p in self.procs:
            if p.is_alive():
                p.kill()

    def _collect(self, who, kind: str, what: str, timeout: float) -> dict:
        pending = set(who)
        out = {}
        deadline = now() + timeout
        while pending:
            try:
                index, got, value = self.res_q.get(timeout=1.0)
            except queue_mod.Empty:
                dead = [i for i in pending if not self.procs[i].is_alive()]
                if dead or now() > deadline:
                    self.kill()
                    why = (f"client(s) {dead} died" if dead else f"timed out after {timeout:.0f}s")
                    raise RuntimeError(f"{what}: {why}")
                continue
            if got == "error":
                self.kill()
                raise RuntimeError(f"{what}: client{index} failed: {value}")
            if got == kind:
                out[index] = value
                pending.discard(index)
        return out


def point_entry(rounds: list[list[dict]], label: str, cfg: Config, path: str, **extra) -> dict:
    """The result of one point from :meth:`Pool.point`'s rounds."""
    batch = BATCH[label]
    rates = [sum(c["calls"] for c in r) * batch / cfg.window_seconds for r in rounds]
    lat = [x for r in rounds for c in r for x in c["lat"]]
    med = statistics.median(rates)
    e = {"items_per_s": med, "gb_per_s": med * size_bytes(label) / 1e9, "batch": batch,
         "item_bytes": size_bytes(label), "rounds": rates, "latency": latency_stats(lat),
         "per_client_calls": [[c["calls"] for c in r] for r in rounds], "path": path}
    e.update(extra)
    return e


def run_points(bench: Bench, pool: Pool, path_of, extra=None) -> None:
    """Every (op, size, n) point, in order, into bench.results; ``path_of(op, label)``
    names the system's path, ``extra(op, label)`` adds fields (e.g. server RSS)."""
    for op in OPS:
        for label, _ in SIZES:
            for n in CLIENTS:
                k = key(op, label, n)
                bench.run(k, lambda op=op, label=label, n=n: point_entry(
                    pool.point(op, label, n), label, bench.cfg, path_of(op, label),
                    **(extra(op, label) if extra else {})))
                if "latency" in bench.results.get(k, {}):
                    bench.log(f"{k}: {latency_text(bench.results[k])}")


class RemoteBench(Bench):
    """serving_common's Bench (arguments, budget, logging, JSON) with this
    comparison's Config."""

    def __init__(self, system: str) -> None:
        super().__init__(system)
        self.cfg = make_config(self.args.quick, self.args.budget)


def latency_text(e: dict) -> str:
    lat = e.get("latency", {})
    if not lat.get("n"):
        return "no calls"
    return f"p50 {lat['p50_ms']:.2f} ms p99 {lat['p99_ms']:.2f} ms (n={lat['n']})"
