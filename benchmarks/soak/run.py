"""The soak's driver: ``reprise serve`` on loopback, 8 client processes, seeded faults.

Processes: the server (``python -m reprise.cli serve --config soak.toml``, a fixed free port
so that its restart comes back on the same address, a token, a checkpoint directory), 4
writers, 2 samplers, 1 priority updater, 1 checkpointer (``benchmarks.soak.clients``), and
for half of the measured windows a stalled reader. This process only reads ``/proc``, starts
and kills processes and makes the faults; everything is timed with ``time.monotonic()``.

Faults, each from its own seeded ``random.Random``:

- every 3-6 s a random writer, sampler or updater is SIGKILLed and started again (a new
  incarnation: its ids differ); the checkpointer is spared so that checkpoints keep their
  period;
- every 1-3 s one malformed connection to the gRPC port (``faults.MALFORMED``);
- every 3-5 s a client with a wrong, missing, truncated, extended or re-cased token, which
  must be refused (``Unauthenticated``), while no call of the soak's own clients may be
  (the config's ``auth_failures_per_minute``, 30, is above that rate: every client is on
  127.0.0.1, and past the limit the server refuses the address's calls whatever the token);
- after the warm-up, windows alternate without and with a stalled reader (an odd number,
  starting and ending without): a client that opens a sample stream of up to 64 batches in
  flight, reads one and is then SIGSTOPped;
- once, in the middle of the window without the stalled reader nearest to 45% of the run
  (and after a checkpoint exists), the server is SIGKILLed and started again with the same
  config: it restores its newest checkpoint and the clients' pools reconnect.

The durable arm (``Plan.durable``, ``--durable``): the store is a durable file store
(``backing = "file"``, ``durable = true``), so a writer's flush returns once its items are on
disk, and the restarted server reopens the store rather than a checkpoint. Between the kill
and the restart this driver opens the store itself (``rp.Store.open``: what the server will
find), saves a checkpoint of it outside the checkpoint directory (``crash-state``) for the
ledger, and closes it again: every item whose flush returned before the kill must be in it.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import queue
import random
import secrets
import signal
import subprocess
import sys
import threading
import time

from benchmarks.common.processes import ROOT, free_port, stop_all
from benchmarks.soak import faults

ROLES = ["writer"] * 4 + ["sampler"] * 2 + ["updater", "checkpointer"]
KILLABLE = [i for i, r in enumerate(ROLES) if r != "checkpointer"]
TABLE = "replay"


@dataclasses.dataclass
class Plan:
    seconds: float
    seed: int = 1
    max_size: int = 16384        # items of 4 KB: FIFO eviction starts within seconds
    capacity_factor: int = 4     # store steps per table item: room for writers and checkpoint pins
    write_batch: int = 64
    sample_batch: int = 128
    update_batch: int = 256
    checkpoint_every: float = 30.0
    warmup: float = 60.0
    window: float = 30.0         # stalled-reader windows: off, on, ..., off (stall_windows)
    settle: float = 5.0          # the start of each window that is not measured
    crash_at: float = 270.0      # seconds after the server first started (for_seconds places it)
    timeout: float = 10.0        # every timed call: flush, sample; the budget of those without one
    connect_timeout: float = 5.0
    checkpoint_budget: float = 60.0
    retry_after: float = 1.0     # ClientPool: how soon a lost server is tried again
    kill_every: tuple = (3.0, 6.0)
    malformed_every: tuple = (1.0, 3.0)
    token_every: tuple = (3.0, 5.0)
    durable: bool = False        # the store is a durable file store (the durable arm)

    @classmethod
    def for_seconds(cls, seconds: float, seed: int = 1) -> "Plan":
        """The full soak's numbers, scaled down for short runs (CI: 60 s). The server is
        killed in the middle of the window without the stalled reader nearest to 45% of the
        run, so that the windows with it stay whole."""
        short = seconds < 180
        window = min(30.0, seconds / 8)
        plan = cls(seconds=seconds, seed=seed, max_size=4096 if short else 16384,
                   checkpoint_every=max(5.0, seconds / 8) if short else 30.0,
                   warmup=min(60.0, 0.15 * seconds), window=window, settle=min(5.0, window / 4))
        offs = [(w["start"] + w["end"]) / 2 for w in stall_windows(plan) if not w["on"]]
        plan.crash_at = min(offs, key=lambda t: abs(t - 0.45 * seconds)) if offs else 0.45 * seconds
        return plan


def stall_windows(p: Plan) -> list[dict]:
    """Windows from the warm-up to the end, off and on in turn, an odd number of about
    ``p.window`` seconds each: every window with the stalled reader lies between two without."""
    n = max(1, int((p.seconds - p.warmup) / p.window))
    n -= 1 - n % 2
    length = (p.seconds - p.warmup) / n
    return [{"start": round(p.warmup + k * length, 3), "end": round(p.warmup + (k + 1) * length, 3), "on": k % 2 == 1}
            for k in range(n)]


def proc_status(pid: int) -> dict | None:
    """VmRSS, RssAnon, RssShmem (KiB), threads and open descriptors of ``pid``, or None."""
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                k, _, v = line.partition(":")
                if k in ("VmRSS", "RssAnon", "RssShmem", "Threads"):
                    out[k] = int(v.split()[0])
        out["fds"] = len(os.listdir(f"/proc/{pid}/fd"))
    except (OSError, ValueError):
        return None
    return out


class Soak:
    def __init__(self, plan: Plan, work: str, log=print, server_env: dict | None = None):
        self.plan, self.work, self.log = plan, work, log
        self.server_env = dict(server_env or {})
        self.token = secrets.token_hex(16)
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.name = f"soak-{os.getpid()}"
        self.records = os.path.join(work, "records")
        os.makedirs(self.records)
        self.ckpt_dir = os.path.join(work, "ckpt")
        self.config = os.path.join(work, "soak.toml")
        self.lock = threading.RLock()
        self.stop = threading.Event()
        self.server = None
        self.server_pids: list[int] = []
        self.procs: dict[int, subprocess.Popen] = {}
        self.incs = {slot: 0 for slot in range(len(ROLES))}
        self.stalled = None
        self.t0 = None
        self.events = {"kills": [], "malformed": [], "tokens": [], "hangs": [], "servers": [], "windows": [],
                       "stragglers": [], "leftovers": [], "server_deaths": []}
        self.crashing = False   # set while this driver kills and restarts the server
        self.samples: list[dict] = []   # the server's /proc figures, one a second
        self._threads: list[threading.Thread] = []

    # --- processes --------------------------------------------------------------------------
    def write_config(self) -> None:
        p = self.plan
        # The durable arm's store: a durable file store in the work directory.
        file_store = 'backing = "file"\ndurable = true\ndirectory = "store"\n' if p.durable else ""
        with open(self.config, "w") as f:
            f.write(f'''address = "{self.address}"
token = "{self.token}"
checkpoint_dir = "ckpt"
checkpoint_on_exit = false
name = "{self.name}"
# Every client of the soak, the wrong-token ones too, is 127.0.0.1: past this many failed
# tokens in a minute the server refuses that address's calls, the right token's included.
# The wrong-token fault stays below it (at most one attempt every 3 s).
auth_failures_per_minute = 30

[[stores]]
name = "main"
capacity = {p.max_size * p.capacity_factor}
block_steps = 64
{file_store}fields = {{ id = {{ dtype = "int64" }}, payload = {{ shape = [4096], dtype = "uint8" }} }}

[[tables]]
name = "{TABLE}"
store = "main"
sampler = {{ kind = "Prioritized", priority_exponent = 0.6 }}
remover = "Fifo"
max_size = {p.max_size}
seed = {p.seed}
''')

    def start_server(self) -> dict:
        n = len(self.events["servers"])
        err = open(os.path.join(self.work, f"server-{n}.log"), "w")
        t_start = time.monotonic()
        proc = subprocess.Popen([sys.executable, "-m", "reprise.cli", "serve", "--config", self.config, "--grace", "5"],
                                stdout=subprocess.PIPE, stderr=err, text=True, cwd=self.work,
                                env={**os.environ, **self.server_env})
        err.close()
        lines: queue.Queue = queue.Queue()
        threading.Thread(target=lambda: [lines.put(x) for x in proc.stdout], daemon=True).start()
        try:
            banner = lines.get(timeout=120)
        except queue.Empty:
            proc.kill()
            raise RuntimeError("reprise serve printed nothing in 120 s") from None
        if " at " not in banner:
            proc.kill()
            raise RuntimeError(f"reprise serve did not start: {banner!r}; see {err.name}")
        ready = time.monotonic()
        status = proc_status(proc.pid)
        restored = banner.split("(restored ")[1].rstrip(")\n") if "(restored " in banner else None
        info = {"pid": proc.pid, "t_start": t_start, "t_ready": ready, "restored_from": restored,
                "status_at_ready": status, "log": err.name}
        self.server = proc
        self.server_pids.append(proc.pid)
        self.events["servers"].append(info)
        return info

    def spec(self, slot: int) -> dict:
        p, role = self.plan, ROLES[slot]
        batch = {"writer": p.write_batch, "sampler": p.sample_batch, "updater": p.update_batch}.get(role, 0)
        inc = self.incs[slot]
        return {"address": self.address, "token": self.token, "table": TABLE, "slot": slot, "incarnation": inc,
                "batch": batch, "timeout": p.timeout, "connect_timeout": p.connect_timeout,
                "checkpoint_budget": p.checkpoint_budget, "retry_after": p.retry_after,
                "interval": p.checkpoint_every, "seed": p.seed * 1_000_003 + slot * 1009 + inc,
                "records": os.path.join(self.records, f"{role}-{slot}-{inc}.txt")}

    def start_client(self, slot: int) -> None:
        spec = self.spec(slot)
        out = open(os.path.join(self.work, f"{ROLES[slot]}-{slot}-{spec['incarnation']}.log"), "w")
        self.procs[slot] = subprocess.Popen([sys.executable, "-m", "benchmarks.soak.clients", ROLES[slot],
                                             json.dumps(spec)], stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
        out.close()

    def rel(self, t: float) -> float:
        return round(t - self.t0, 3)

    # --- threads ----------------------------------------------------------------------------
    def _every(self, name: str, gap: tuple, seed: int, act) -> None:
        rng = random.Random(seed)

        def loop():
            while not self.stop.wait(rng.uniform(*gap)):
                act(rng)

        t = threading.Thread(target=loop, name=name, daemon=True)
        t.start()
        self._threads.append(t)

    def kill_one(self, rng: random.Random) -> None:
        slot = rng.choice(KILLABLE)
        with self.lock:
            if self.stop.is_set():
                return
            p = self.procs[slot]
            t = time.monotonic()
            alive = p.poll() is None
            if alive:
                p.send_signal(signal.SIGKILL)
            p.wait()
            self.events["kills"].append({"t": self.rel(t), "slot": slot, "role": ROLES[slot],
                                         "inc": self.incs[slot], "was_alive": alive})
            self.incs[slot] += 1
            self.start_client(slot)

    def malformed_one(self, rng: random.Random) -> None:
        kind = rng.choice(faults.MALFORMED)
        t = time.monotonic()
        r = faults.malformed(self.address, kind, rng)
        r["t"] = self.rel(t)
        self.events["malformed"].append(r)

    def token_one(self, rng: random.Random) -> None:
        import reprise as rp
        t = time.monotonic()
        r = faults.wrong_token(rp, self.address, self.token, rng, self.plan.connect_timeout)
        r["t"] = self.rel(t)
        self.events["tokens"].append(r)

    def monitor(self) -> None:
        """The server's RSS and descriptors each second; clients that stopped writing records
        (a call that never returned) are killed and counted as hangs."""
        sizes: dict = {}
        hang_s = self.plan.checkpoint_budget + 10.0
        while not self.stop.wait(1.0 - (time.monotonic() - self.t0) % 1.0):
            now = time.monotonic()
            server = self.server
            s = proc_status(server.pid) if server is not None else None
            if (server is not None and not self.crashing and server.poll() is not None and not self.stop.is_set()
                    and not self.events["server_deaths"]):
                self.events["server_deaths"].append({"t": self.rel(now), "pid": server.pid, "exit": server.returncode})
            self.samples.append({"t": self.rel(now), "pid": None if server is None else server.pid, **(s or {})})
            with self.lock:
                for slot, p in self.procs.items():
                    path = self.spec(slot)["records"]
                    try:
                        size = os.path.getsize(path)
                    except OSError:
                        size = -1
                    last = sizes.get((slot, self.incs[slot]))
                    if last is None or last[0] != size:
                        sizes[(slot, self.incs[slot])] = (size, now)
                    elif now - last[1] > hang_s and p.poll() is None and not self.stop.is_set():
                        self.events["hangs"].append({"t": self.rel(now), "slot": slot, "role": ROLES[slot],
                                                     "silent_s": round(now - last[1], 1)})
                        p.kill()
                        p.wait()
                        self.incs[slot] += 1
                        self.start_client(slot)

    # --- the stalled reader -----------------------------------------------------------------
    def stall_start(self) -> None:
        spec = dict(self.spec(0), slot=99, incarnation=0, batch=self.plan.sample_batch,
                    records=os.path.join(self.work, "stalled.txt"))
        err = open(os.path.join(self.work, "stalled.log"), "a")
        p = subprocess.Popen([sys.executable, "-m", "benchmarks.soak.clients", "stalled", json.dumps(spec)],
                             stdout=subprocess.PIPE, stderr=err, text=True, cwd=ROOT)
        err.close()
        lines: queue.Queue = queue.Queue()
        threading.Thread(target=lambda: [lines.put(x) for x in p.stdout], daemon=True).start()
        self.stalled = {"proc": p, "lines": lines, "stopped_at": None}

    def stall_poll(self) -> float | None:
        """SIGSTOPs the stalled reader once it has its stream; returns when it was stopped."""
        s = self.stalled
        if s is None or s["stopped_at"] is not None:
            return None if s is None else s["stopped_at"]
        try:
            if s["lines"].get_nowait().startswith("READY"):
                s["proc"].send_signal(signal.SIGSTOP)
                s["stopped_at"] = time.monotonic()
        except queue.Empty:
            pass
        return s["stopped_at"]

    def stall_end(self) -> None:
        if self.stalled is not None:
            p = self.stalled["proc"]
            p.kill()   # SIGKILL ends a stopped process too
            p.wait()
            self.stalled = None

    # --- the crash --------------------------------------------------------------------------
    def crash(self) -> dict:
        newest = sorted(glob.glob(os.path.join(self.ckpt_dir, "ckpt-*")))
        old = self.server
        self.crashing = True
        t_kill = time.monotonic()
        old.send_signal(signal.SIGKILL)
        old.wait()
        t_dead = time.monotonic()
        state = self.durable_state() if self.plan.durable else None
        info = self.start_server()
        self.crashing = False
        crash = {"t_kill": t_kill, "t_dead": t_dead, "newest_checkpoint": newest[-1] if newest else None,
                 "restored_from": info["restored_from"], "restart_s": round(info["t_ready"] - t_dead, 3)}
        if state is not None:
            crash.update(state)
            crash["restored_from"] = state["durable_state"]
        self.log(f"server SIGKILLed at {self.rel(t_kill):.1f} s; restarted in {crash['restart_s']} s from "
                 f"{os.path.basename(info['restored_from'] or 'nothing')}")
        return crash

    def durable_state(self) -> dict:
        """The durable arm: what the killed server's store holds, as the restarted server
        will find it, saved as a checkpoint for the ledger (the store is closed again)."""
        import reprise as rp
        t = time.monotonic()
        store = rp.Store.open(os.path.join(self.work, "store"))
        try:
            path = rp.checkpoint.save(os.path.join(self.work, "crash-state"), [store.tables[TABLE]])
        finally:
            store.close()
        return {"durable_state": path, "durable_state_s": round(time.monotonic() - t, 3)}

    # --- the run ----------------------------------------------------------------------------
    def run(self) -> dict:
        p = self.plan
        self.write_config()
        first = self.start_server()
        self.t0 = first["t_ready"]
        self.log(f"server at {self.address} (pid {first['pid']}); {len(ROLES)} clients; {p.seconds:.0f} s")
        mon = threading.Thread(target=self.monitor, name="monitor", daemon=True)
        mon.start()
        with self.lock:
            for slot in range(len(ROLES)):
                self.start_client(slot)
        self._every("kills", p.kill_every, p.seed * 7 + 1, self.kill_one)
        self._every("malformed", p.malformed_every, p.seed * 7 + 2, self.malformed_one)
        self._every("tokens", p.token_every, p.seed * 7 + 3, self.token_one)
        windows = stall_windows(p)
        crash = None
        current = None
        end = self.t0 + p.seconds
        while time.monotonic() < end:
            if self.events["server_deaths"]:
                d = self.events["server_deaths"][0]
                raise RuntimeError(f"the server (pid {d['pid']}) died unplanned at {d['t']} s, exit {d['exit']}; "
                                   f"see {self.events['servers'][-1]['log']}")
            now = self.rel(time.monotonic())
            if crash is None and now >= p.crash_at and (glob.glob(os.path.join(self.ckpt_dir, "ckpt-*"))
                                                        or now >= p.crash_at + 3 * p.checkpoint_every):
                crash = self.crash()
                continue
            w = next((x for x in windows if x["start"] <= now < x["end"]), None)
            if w is not current:
                if current is not None and current["on"]:
                    self.stall_end()
                if w is not None and w["on"]:
                    self.stall_start()
                current = w
            if current is not None and current["on"]:
                stopped = self.stall_poll()
                if stopped is not None:
                    current["stalled_from"] = self.rel(stopped)
            time.sleep(0.05)
        self.log("stopping the faults and the clients")
        self.stop.set()
        for th in self._threads:
            th.join(timeout=30)
        self.stall_end()
        self.stop_clients()
        final = self.final_checkpoint()
        settled = self.settle_fds(first["status_at_ready"]["fds"])
        mon.join(timeout=5)
        self.stop_server()
        return {"windows": windows, "crash": crash, "final": final, "fds_settled": settled}

    def stop_clients(self) -> None:
        with self.lock:
            killed = stop_all(self.procs.values(), 30)
            self.events["stragglers"] += [{"slot": slot, "role": ROLES[slot]}
                                          for slot, p in self.procs.items() if p in killed]

    def final_checkpoint(self) -> dict:
        import reprise as rp
        c = rp.Client(self.address, token=self.token, connect_timeout=self.plan.connect_timeout)
        try:
            s, wall = time.monotonic(), time.time_ns()
            path = c.checkpoint()
            t = time.monotonic()
            info = c.info()[TABLE]
        finally:
            c.close()
        return {"path": path, "t_begin": s, "t_end": t, "wall_ns": wall, "info": info}

    def settle_fds(self, baseline: int, wait_s: float = 20.0) -> dict:
        """Waits up to ``wait_s`` for the server's descriptors to come back to ``baseline``."""
        t = time.monotonic()
        while True:
            s = proc_status(self.server.pid)
            if s is None or s["fds"] <= baseline or time.monotonic() - t > wait_s:
                return {"fds": None if s is None else s["fds"], "after_s": round(time.monotonic() - t, 2),
                        "status": s}
            time.sleep(0.2)

    def stop_server(self) -> None:
        s = self.server
        if s is None or s.poll() is not None:
            return
        if stop_all([s], 60):
            self.events["stragglers"].append({"slot": "server", "role": "server"})

    def kill_everything(self) -> None:
        """The finally of a run: nothing it started outlives it, nothing is left in /dev/shm
        or the socket directory (a server SIGKILLed here cannot clean up after itself)."""
        self.stop.set()
        with self.lock:
            for p in list(self.procs.values()):
                if p.poll() is None:
                    p.kill()
                    p.wait()
        if self.stalled is not None:
            self.stall_end()
        if self.server is not None and self.server.poll() is None:
            self.server.kill()
            self.server.wait()
        for pid in self.server_pids:
            for f in glob.glob(f"/dev/shm/reprise-{pid}-*"):
                self.events["leftovers"].append(f)
                os.unlink(f)
        runtime = os.environ.get("XDG_RUNTIME_DIR")
        sockets = os.path.join(runtime, "reprise") if runtime else f"/tmp/reprise-{os.getuid()}"
        for ext in (".sock", ".lock"):
            f = os.path.join(sockets, self.name + ext)
            if os.path.exists(f):
                self.events["leftovers"].append(f)
                os.unlink(f)
