"""Run directories: where a demo writes its summary, plot and data, one per run.

Without ``--out`` a run makes ``./reprise-runs/<demo>-<YYYYmmdd-HHMMSS>-<pid>`` (with
``-2``, ``-3``, ... appended if that name is taken), created with ``mkdir`` that fails when
the name exists, so two runs never share one, even when started in the same second. The
repository's ``.gitignore`` lists ``reprise-runs/``, so runs made inside a clone of Reprise
are not left untracked there.

With ``--out DIR`` the run uses DIR as given (made if missing; files of an earlier run in
it are overwritten).

Either way a run holds an exclusive ``flock`` on its directory (on the directory itself:
there is no lock file to leave behind; the kernel drops it when the process ends, however it
ends). A second run given the same ``--out`` while the first is alive is refused.
"""

from __future__ import annotations

import os
import time

from pathlib import Path

RUNS = "reprise-runs"


class DirectoryInUse(Exception):
    """Another live run holds this directory."""


class RunDir:
    """A run's directory and the lock held on it; ``release()`` (or the end of the
    process) gives the lock back."""

    def __init__(self, path: Path, fd: int | None):
        self.path, self._fd = path, fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __fspath__(self) -> str:
        return str(self.path)

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"


def _lock(path: Path) -> int | None:
    """An exclusive flock on the directory ``path``; None where flock is unavailable."""
    try:
        import fcntl
    except ImportError:
        return None
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise DirectoryInUse(f"{path} is the output directory of another run that is still going; "
                             "give another --out, or leave --out out for a new directory") from None
    except OSError:  # a file system without flock: no lock, the run goes on
        os.close(fd)
        return None
    return fd


def new_run_name(demo: str) -> str:
    return f"{demo}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"


def claim(demo: str, out: str | os.PathLike | None, base: str | os.PathLike = ".") -> RunDir:
    """The run directory: ``out`` (made if missing), or a new one under ``<base>/reprise-runs``
    (see the module doc); locked for this run."""
    if out is not None:
        path = Path(out)
        path.mkdir(parents=True, exist_ok=True)
        return RunDir(path, _lock(path))
    runs = Path(base) / RUNS
    runs.mkdir(parents=True, exist_ok=True)
    name = new_run_name(demo)
    for n in range(1, 1000):
        path = runs / (name if n == 1 else f"{name}-{n}")
        try:
            path.mkdir()
        except FileExistsError:
            continue
        return RunDir(path, _lock(path))
    raise FileExistsError(f"no free run directory named {name}-N under {runs}")


__all__ = ["DirectoryInUse", "RUNS", "RunDir", "claim", "new_run_name"]


def write_json(path, value) -> None:
    """Writes ``value`` as JSON to ``path`` whole (a temporary file renamed over it), so a
    reader never sees half a file."""
    import json
    path = Path(path)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(value, indent=2))
    os.replace(tmp, path)


def demo_main(demo: str, argv, parse_args, preflight, run) -> int:
    """A server-backed demo's command: parse ``argv``, refuse what ``preflight(cfg)`` names
    (exit 2, one line), ``run(cfg, stop)``. Exit status: 0 the run ended (solved or at the
    time limit), 1 it failed (a process kept failing), 2 refused (options, preflight, output
    directory in use), 128 + the signal's number when stopped by SIGINT (130) or SIGTERM
    (143). After such a stop the process goes on ignoring the two signals while it exits."""
    import sys

    from .stopping import Interrupted, StopSignals
    with StopSignals(quiet_after=True) as stop:
        try:
            cfg = parse_args(sys.argv[1:] if argv is None else argv)
            problem = preflight(cfg)
            if problem is not None:
                print(f"reprise demo {demo}: {problem}", file=sys.stderr)
                return 2
            summary = run(cfg, stop)
        except Interrupted as e:
            print(f"reprise demo {demo}: stopped by {e.name} before the run began; nothing was written",
                  file=sys.stderr)
            return e.exit_code
        except DirectoryInUse as e:
            print(f"reprise demo {demo}: {e}", file=sys.stderr)
            return 2
    if stop.interrupted:
        return stop.exit_code
    return 1 if summary["ended"] == "failed" else 0
