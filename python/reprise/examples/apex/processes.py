"""The learner and actor processes, as the supervisor sees them: started (spawn), restarted
when they exit, given up on when one keeps failing, and stopped.

A child starts with SIGINT blocked and ignores it (``stopping.child_setup``): the terminal's
Ctrl-C reaches every process of the foreground group, and only the supervisor acts on it.
The supervisor stops the children with SIGTERM, which ends them at once and without a
traceback (SIGKILL after 5 s), before it stops the server, so that no child sees its
connection lost. A child also gets SIGTERM if the supervisor dies without stopping it.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time

from ..stopping import StopSignals, block_sigint
from .actor import actor_main
from .config import Config
from .learner import learner_main

FAILURE_WINDOW_S = 60.0   # a process that exits this many times ...
FAILURES_TO_GIVE_UP = 5   # ... within this window is not restarted again
STOP_GRACE_S = 5.0        # SIGTERM, then SIGKILL after this long


class Supervisor:
    """Starts the learner and the actors as processes, restarts any that exit, and gives
    up (``check`` says why) on one that exits ``FAILURES_TO_GIVE_UP`` times within
    ``FAILURE_WINDOW_S`` seconds: a crash loop is an error to report, not to repeat."""

    def __init__(self, cfg: Config, address: str, started: float, stop: StopSignals):
        self.cfg, self.address, self.started, self.stop_signals = cfg, address, started, stop
        self.ctx = mp.get_context("spawn")
        self.procs: dict[str, mp.Process] = {}
        self.restarts = {"learner": 0, "actors": 0}
        self.exits: dict[str, list[float]] = {}
        self.launches = 0
        self.all_pids: set[int] = set()

    def start(self, name: str):
        self.launches += 1
        seed = self.cfg.seed * 7919 + self.launches
        if name == "learner":
            p = self.ctx.Process(target=learner_main, args=(self.cfg, self.address, seed, self.started, os.getpid()),
                                 name="reprise-apex-learner", daemon=True)
        else:
            actor_id = int(name.split("-")[1])
            p = self.ctx.Process(target=actor_main, args=(self.cfg, actor_id, self.address, seed, os.getpid()),
                                 name=f"reprise-apex-{name}", daemon=True)
        # Held: a signal here lands after the process is recorded (and so stopped later).
        with self.stop_signals.hold(), block_sigint():
            p.start()
            self.procs[name] = p
            self.all_pids.add(p.pid)

    def start_all(self):
        self.start("learner")
        for i in range(self.cfg.actors):
            self.start(f"actor-{i}")

    def check(self, log) -> str | None:
        """Restarts the processes that exited; returns why the run must end instead when
        one keeps exiting, else None."""
        now = time.monotonic()
        for name, p in list(self.procs.items()):
            if p.exitcode is None:
                continue
            recent = [t for t in self.exits.get(name, []) if now - t < FAILURE_WINDOW_S] + [now]
            self.exits[name] = recent
            if len(recent) >= FAILURES_TO_GIVE_UP:
                return (f"{name} exited {len(recent)} times within {FAILURE_WINDOW_S:g} s (last exit code "
                        f"{p.exitcode}); not restarting it again: see its error above")
            log(f"{name} (pid {p.pid}) exited with {p.exitcode}: restarting it")
            self.restarts["learner" if name == "learner" else "actors"] += 1
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
