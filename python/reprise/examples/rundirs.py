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
