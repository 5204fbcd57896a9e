"""The learner and actor processes, as the supervisor sees them (``reprise.examples.children``:
started, restarted when they exit, given up on when one keeps failing, and stopped)."""

from __future__ import annotations

import os

from ..children import FAILURE_WINDOW_S, FAILURES_TO_GIVE_UP, STOP_GRACE_S, Children
from ..stopping import StopSignals
from .actor import actor_main
from .config import Config
from .learner import learner_main

__all__ = ["FAILURES_TO_GIVE_UP", "FAILURE_WINDOW_S", "STOP_GRACE_S", "Supervisor"]


class Supervisor(Children):
    """The learner (``learner``) and the actors (``actor-<i>``)."""

    def __init__(self, cfg: Config, address: str, started: float, stop: StopSignals):
        self.cfg, self.address, self.started = cfg, address, started
        super().__init__("apex", self._launch, stop, ["learner", "actors"])

    def _launch(self, name: str, launches: int):
        seed = self.cfg.seed * 7919 + launches
        if name == "learner":
            return learner_main, (self.cfg, self.address, seed, self.started, os.getpid())
        return actor_main, (self.cfg, int(name.split("-")[1]), self.address, seed, os.getpid())

    def start_all(self):
        self.start("learner")
        for i in range(self.cfg.actors):
            self.start(f"actor-{i}")
