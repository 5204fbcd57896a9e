"""What a server-backed demo's supervisor keeps of its run: the processes' reports drained
from queue tables, and the run's record (its phase, the log, the history) that the summary
is written from."""

from __future__ import annotations

import time


def drain(source, name: str | None = None) -> dict:
    """Every item waiting in a queue table, as ``{field: array}`` (empty dict when none):
    ``drain(table)``, or ``drain(client, name)`` for a served table."""
    if name is None:
        n, take = source.size, source.sample
    else:
        n, take = source.info()[name]["size"], lambda n, timeout: source.sample(name, n, timeout=timeout)
    if n == 0:
        return {}
    s = take(n, timeout=0)
    return {k: v[:, 0] for k, v in s.data.items()}


class RunRecord:
    """What happened, as the run goes: the phase (where a signal found it), the log lines
    (also shown above the progress line), the history, the evaluations, when it was solved
    and the dashboard's URL. Demos add their own counters."""

    def __init__(self, started: float, progress):
        self.started, self.progress = started, progress
        self.phase = "starting"
        self.lines: list[str] = []
        self.history: list[dict] = []
        self.evals: list[dict] = []
        self.solved_at = None
        self.dashboard = None

    def now(self) -> float:
        return time.time() - self.started

    def log(self, msg: str) -> None:
        line = f"[{self.now():6.1f}s] {msg}"
        self.lines.append(line)
        self.progress.log(line)
