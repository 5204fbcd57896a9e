"""Page-cache helpers shared by the checkpoint benchmark and its Reverb peer
(standard library only: the peer runs in its own venv): drop a directory's files from
the page cache, measure how much of them is resident, and their size."""

from __future__ import annotations

import os
import subprocess


def files_of(path: str) -> list[str]:
    return [os.path.join(r, f) for r, _, fs in os.walk(path) for f in fs]


def du(path: str) -> int:
    """Bytes in ``path``'s files."""
    return sum(os.path.getsize(f) for f in files_of(path))


def evict(path: str) -> None:
    """Drop ``path``'s files from the page cache (written back first; no root needed)."""
    os.sync()
    for f in files_of(path):
        fd = os.open(f, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def resident(path: str) -> float | None:
    """Fraction of ``path``'s file bytes in the page cache (util-linux ``fincore``)."""
    files = files_of(path)
    if not files:
        return None
    try:
        r = subprocess.run(["fincore", "-b", "-n", "-r", "-o", "RES,SIZE"] + files,
                           capture_output=True, text=True, timeout=60)
        res = size = 0
        for line in r.stdout.splitlines():
            if line.strip():
                a, b = line.split()[:2]
                res, size = res + int(a), size + int(b)
        return res / size if size else None
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return None
