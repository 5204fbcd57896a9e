"""Processes the benchmarks start (standard library only).

- :func:`module_command`: how one benchmark module runs in another interpreter
  (``python -m benchmarks....`` from the repository root, :data:`ROOT`).
- :class:`Group`: spawned child processes that set up, start at one common time, run
  and report one result each (the serving workloads, the plain-socket limit).
- :class:`Pool`: spawned client processes started once and reused for every point of
  a remote comparison.
- :class:`ModuleChild`: a benchmark module as a child process that prints ``READY
  [fields...]`` and runs until its stdin closes (:func:`ready_until_stdin_closes` is that
  end of it), then prints one JSON line; :class:`ServerProcess` is one that serves a
  system (``MODULE --serve SPECS``, :func:`serve_if_asked` on its side).
- :func:`stop_all`: SIGTERM, a common deadline, SIGKILL for the rest (whole process groups
  where a child leads one); :func:`free_port`.

Every multiprocessing child is started with ``spawn``: a fresh interpreter, as a separate
program would be.
"""

from __future__ import annotations

import json
import os
import queue as queue_mod
import signal
import socket
import subprocess
import sys
import traceback

from benchmarks.common.timing import Window, now, window_run

# The repository root: benchmark modules run with it as the working directory.
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def module_command(python: str, module: str, *args: str) -> list[str]:
    """The command that runs ``module`` (``benchmarks.core.reprise_core``) with
    ``python``; run it with ``cwd=ROOT``."""
    return [python, "-m", module, *args]


def mp_context():
    import multiprocessing as mp
    return mp.get_context("spawn")


# --- a group that starts together ---------------------------------------------------------
def child_entry(fn, args, q, ready, go, start_value, role):
    """Target of every child process: set up (``fn`` returns a callable that runs
    the timed part given the Window), say ready, wait for go, run, report."""
    try:
        run = fn(*args)
        q.put((role, "ready", None))
        go.wait()
        win_start = start_value.value
        out = run(win_start)
        q.put((role, "result", out))
    except BaseException as exc:  # report everything, including KeyboardInterrupt
        q.put((role, "error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))


class Group:
    """Spawned child processes that set up, wait for one common start time, run, and
    report one result each (see :func:`child_entry`). ``cfg.start_timeout`` bounds
    the set-up."""

    def __init__(self, cfg) -> None:
        self.ctx = mp_context()
        self.cfg = cfg
        self.q = self.ctx.Queue()
        self.ready = self.ctx.Event()
        self.go = self.ctx.Event()
        self.start_value = self.ctx.Value("d", 0.0)
        self.procs: dict[str, object] = {}

    def add(self, role: str, fn, *args) -> None:
        p = self.ctx.Process(target=child_entry, name=role,
                             args=(fn, args, self.q, self.ready, self.go, self.start_value, role),
                             daemon=True)
        p.start()
        self.procs[role] = p

    def run(self, lead_s: float = 0.2, timeout: float | None = None) -> dict:
        """Wait until every child is ready, start them all at now()+lead_s, collect
        results. Raises RuntimeError with the child's traceback if one fails."""
        cfg = self.cfg
        pending = set(self.procs)
        deadline = now() + cfg.start_timeout
        while pending:
            role, kind, payload_ = self._get(deadline, "getting ready", pending)
            if kind == "error":
                self.kill()
                raise RuntimeError(f"{role} failed while setting up: {payload_}")
            pending.discard(role)
        self.start_value.value = now() + lead_s
        self.go.set()
        results: dict[str, object] = {}
        pending = set(self.procs)
        deadline = now() + (timeout or 600.0)
        while pending:
            role, kind, payload_ = self._get(deadline, "running", pending)
            if kind == "error":
                self.kill()
                raise RuntimeError(f"{role} failed: {payload_}")
            results[role] = payload_
            pending.discard(role)
        for p in self.procs.values():
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
        return results

    def _get(self, deadline: float, what: str, pending: set):
        while True:
            try:
                return self.q.get(timeout=1.0)
            except queue_mod.Empty:
                dead = [r for r in pending if not self.procs[r].is_alive()]
                if dead:
                    codes = {r: self.procs[r].exitcode for r in dead}
                    self.kill()
                    raise RuntimeError(f"{what}: process(es) died without reporting: {codes}")
                if now() > deadline:
                    self.kill()
                    raise RuntimeError(f"{what}: timed out waiting for {sorted(pending)}")

    def kill(self) -> None:
        for p in self.procs.values():
            if p.is_alive():
                p.kill()
        for p in self.procs.values():
            p.join(timeout=10)


# --- a pool of clients reused for every point ---------------------------------------------
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
    point; a point with n clients uses the first n. ``cfg`` gives ``rounds``,
    ``warmup_seconds``, ``window_seconds`` and ``start_timeout``."""

    def __init__(self, size: int, setup, args: tuple, cfg) -> None:
        self.ctx = mp_context()
        self.cfg = cfg
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

    def point(self, op: str, label: str, n: int) -> list[list[dict]]:
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


# --- a module child ruled by its stdin ------------------------------------------------------
class ModuleChild:
    """``python -m MODULE ARGS`` as a child process (this interpreter, from :data:`ROOT`)
    that prints ``READY [fields...]`` once it is ready (``fields`` keeps them) and runs until
    its stdin closes (:func:`ready_until_stdin_closes` is that end of it). :meth:`finish`
    closes its stdin, waits up to ``stop_timeout`` s (then kills it) and returns the last
    line it printed as JSON."""

    def __init__(self, module: str, *args: str, stop_timeout: float = 60.0) -> None:
        self.stop_timeout = stop_timeout
        self.proc = subprocess.Popen(module_command(sys.executable, module, *args),
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     cwd=ROOT)
        line = self.proc.stdout.readline()
        if line.split()[:1] != ["READY"]:
            self.proc.kill()
            raise RuntimeError(f"{module} {' '.join(args[:1])}: the child did not start: {line!r}")
        self.fields = line.split()[1:]

    def finish(self) -> dict:
        out = self._close()
        if out is None:
            return {"error": "did not stop"}
        lines = out.strip().splitlines()
        return json.loads(lines[-1]) if lines else {"error": f"exit {self.proc.returncode}, no output"}

    def stop(self) -> None:
        """Close it (as :meth:`finish` does, its output ignored) unless it has ended."""
        if self.proc.poll() is None:
            self._close()

    def _close(self) -> str | None:
        """Its stdin closed, what it printed since READY; None if it had to be killed."""
        try:
            return self.proc.communicate(timeout=self.stop_timeout)[0]
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.communicate()
            return None

    def rss_mib(self) -> float | None:
        try:
            with open(f"/proc/{self.proc.pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        return int(line.split()[1]) / 1024
        except OSError:
            return None
        return None


class ServerProcess(ModuleChild):
    """A system's server: ``python -m MODULE --serve SPECS`` (a :class:`ModuleChild`) that
    prints ``READY <port>`` or ``READY <host:port>`` (then any extra fields, kept in
    ``extra``) once it serves."""

    def __init__(self, module: str, specs, stop_timeout: float = 60.0) -> None:
        super().__init__(module, "--serve", json.dumps(specs), stop_timeout=stop_timeout)
        addr = self.fields[0]
        self.address = addr if ":" in addr else f"localhost:{int(addr)}"
        self.extra = self.fields[1:]


def serve_if_asked(serve) -> bool:
    """The child's side of :class:`ServerProcess`: when this module was started with
    ``--serve SPECS``, ``serve(SPECS)`` and True."""
    if len(sys.argv) > 2 and sys.argv[1] == "--serve":
        serve(sys.argv[2])
        return True
    return False


def ready_until_stdin_closes(*fields) -> None:
    """The child's end of :class:`ModuleChild`: say ``READY fields...``, return when the
    parent closes stdin (or dies)."""
    print(" ".join(["READY", *map(str, fields)]), flush=True)
    sys.stdin.read()


# --- stopping processes ---------------------------------------------------------------------
def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` now (the caller binds it soon after)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def leads_group(p: subprocess.Popen) -> bool:
    """Whether ``p`` leads its own process group (started with ``start_new_session``)."""
    try:
        return os.getpgid(p.pid) == p.pid
    except (ProcessLookupError, PermissionError):
        return False


def send(p: subprocess.Popen, sig: int) -> None:
    """``sig`` to ``p``'s whole group where it leads one (its children too), else to ``p``."""
    try:
        if leads_group(p):
            os.killpg(p.pid, sig)
        else:
            p.send_signal(sig)
    except (ProcessLookupError, PermissionError):
        pass


def kill(p: subprocess.Popen, wait_s: float = 5.0) -> None:
    """SIGKILL (see :func:`send`), then reap it within ``wait_s``."""
    send(p, signal.SIGKILL)
    try:
        p.wait(timeout=wait_s)
    except subprocess.TimeoutExpired:
        pass


def stop_all(procs, timeout: float, sig: int | None = signal.SIGTERM) -> list:
    """Stop child processes: ``sig`` to each that still runs (see :func:`send`; None: send
    nothing, they are ending by themselves), wait up to ``timeout`` s for all of them
    together, :func:`kill` the rest. Returns the ones it killed."""
    procs = list(procs)
    if sig is not None:
        for p in procs:
            if p.poll() is None:
                send(p, sig)
    deadline = now() + timeout
    killed = []
    for p in procs:
        try:
            p.wait(timeout=max(0.01, deadline - now()))
        except subprocess.TimeoutExpired:
            killed.append(p)
            kill(p)
    return killed
