"""A demo's worker processes, as its supervisor sees them: started (spawn), restarted when
they exit, given up on when one keeps failing, and stopped.

A child starts with SIGINT blocked and ignores it (``stopping.child_setup``): the terminal's
Ctrl-C reaches every process of the foreground group, and only the supervisor acts on it.
The supervisor stops the children with SIGTERM, which ends them at once and without a
traceback (SIGKILL after 5 s), before it stops the server, so that no child sees its
connection lost. A child also gets SIGTERM if the supervisor dies without stopping it.
"""

from __future__ import annotations

import multiprocessing as mp
import time

from .stopping import StopSignals, block_sigint

FAILURE_WINDOW_S = 60.0   # a process that exits this many times ...
FAILURES_TO_GIVE_UP = 5   # ... within this window is not restarted again
STOP_GRACE_S = 5.0        # SIGTERM, then SIGKILL after this long


def role(name: str) -> str:
    """The restart counter a process counts under: ``actor-3`` under ``actors``, ``learner``
    under ``learner``."""
    head, _, tail = name.rpartition("-")
    return f"{head}s" if head and tail.isdigit() else name


class Children:
    """Starts processes by name, restarts any that exit, and gives up (``check`` says why) on
    one that exits ``FAILURES_TO_GIVE_UP`` times within ``FAILURE_WINDOW_S`` seconds: a crash
    loop is an error to report, not to repeat. ``launch(name, launches)`` gives a name's
    ``(target, args)`` (``launches`` counts every start, for a fresh seed each time)."""

    def __init__(self, demo: str, launch, stop: StopSignals, roles: list[str]):
        self.demo, self.launch, self.stop_signals = demo, launch, stop
        self.ctx = mp.get_context("spawn")
        self.procs: dict[str, mp.Process] = {}
        self.restarts = {r: 0 for r in roles}
        self.exits: dict[str, list[float]] = {}
        self.launches = 0
        self.all_pids: set[int] = set()

    def start(self, name: str):
        self.launches += 1
        target, args = self.launch(name, self.launches)
        p = self.ctx.Process(target=target, args=args, name=f"reprise-{self.demo}-{name}", daemon=True)
        # Held: a signal here lands after the process is recorded (and so stopped later).
        with self.stop_signals.hold(), block_sigint():
            p.start()
            self.procs[name] = p
            self.all_pids.add(p.pid)

    def exitcode(self, name: str) -> int | None:
        """How ``name`` ended (None while it runs)."""
        return self.procs[name].exitcode

    def check(self, log) -> str | None:
        """Restarts the processes that exited; returns why the run must end instead when
        one keeps exiting, else None."""
        now = time.monotonic()
        for name in list(self.procs):
            code = self.exitcode(name)
            if code is None:
                continue
            recent = [t for t in self.exits.get(name, []) if now - t < FAILURE_WINDOW_S] + [now]
            self.exits[name] = recent
            if len(recent) >= FAILURES_TO_GIVE_UP:
                return (f"{name} exited {len(recent)} times within {FAILURE_WINDOW_S:g} s (last exit code "
                        f"{code}); not restarting it again: see its error above")
            log(f"{name} (pid {self.pids()[name]}) exited with {code}: restarting it")
            self.restarts[role(name)] = self.restarts.get(role(name), 0) + 1
            self.start(name)
        return None

    def pids(self) -> dict:
        return {name: p.pid for name, p in self.procs.items()}

    def stop(self):
        """SIGTERM to every child still running, SIGKILL to those left after ``STOP_GRACE_S``;
        returns when all have exited. Idempotent."""
        for p in self.procs.values():
            if p.exitcode is None:
                p.terminate()
        deadline = time.monotonic() + STOP_GRACE_S
        for p in self.procs.values():
            p.join(max(0.0, deadline - time.monotonic()))
            if p.exitcode is None:
                p.kill()
                p.join()


def connect(address):
    """A demo process's client of the served tables: ``address`` is the server's local
    address, or (``--ray``) the ``reprise.ray.ServerInfo`` of a server in a Ray actor."""
    import reprise as rp
    return rp.Client(address) if isinstance(address, str) else address.client()


def shut_down(stop: StopSignals, progress, children, server, tables, run_dir) -> None:
    """The end of every run of a server-backed demo, in order, whatever got made (None for
    what was not): no more signal handling, the progress line closed, the children stopped
    before the server (so none sees its connection lost), the stores closed (their shared
    memory removed) and the run directory's lock released. ``server`` is an ``rp.Server`` or
    a ``reprise.ray.ReplayServer`` (whose actor closes its own stores)."""
    stop.stopping()
    if progress is not None:
        progress.close()
    if children is not None:
        children.stop()
    if server is not None:
        server.stop()
    for s in {id(t.store): t.store for t in tables}.values():
        s.close()
    if run_dir is not None:
        run_dir.release()


class _Runner:
    """A Ray actor that runs one demo process's main function (it never returns)."""

    def pid(self) -> int:
        import os
        return os.getpid()

    def run(self, target, args):
        target(*args)


class RayChildren(Children):
    """The same processes as Ray actors on the local Ray instance (``--ray``): started,
    restarted when their run ends (an exception), given up on, and killed, as ``Children``
    does with processes. ``launch`` must give targets that do not bind to this process
    (``parent`` None: Ray's workers are not its children)."""

    def __init__(self, demo: str, launch, stop: StopSignals, roles: list[str]):
        super().__init__(demo, launch, stop, roles)
        self.runs: dict = {}
        self._pids: dict[str, int] = {}

    def start(self, name: str):
        import ray
        self.launches += 1
        target, args = self.launch(name, self.launches)
        with self.stop_signals.hold():
            actor = ray.remote(_Runner).options(num_cpus=0, max_restarts=0).remote()
            self.procs[name] = actor
            self._pids[name] = ray.get(actor.pid.remote(), timeout=120)
            self.all_pids.add(self._pids[name])
            self.runs[name] = actor.run.remote(target, args)

    def exitcode(self, name: str) -> int | None:
        import ray
        ready, _ = ray.wait([self.runs[name]], timeout=0)
        return 1 if ready else None   # a run that ended raised: its error is in Ray's log

    def pids(self) -> dict:
        return dict(self._pids)

    def stop(self):
        import ray
        for actor in self.procs.values():
            try:
                ray.kill(actor, no_restart=True)
            except Exception:  # already gone
                pass
        self.procs.clear()
