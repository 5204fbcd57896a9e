"""Progress bars for long work (checkpoints, dataset imports)."""

from __future__ import annotations

import sys


class Progress:
    """A tqdm bar on stderr for work that takes more than a second.

    ``enabled``: True or False force it on or off; None shows it when stderr is
    a terminal. Without tqdm installed it shows nothing."""

    def __init__(self, total: int, desc: str, enabled: bool | None, unit: str = "B"):
        self._bar = None
        if enabled is None:
            enabled = sys.stderr.isatty()
        if enabled:
            try:
                from tqdm import tqdm
            except ImportError:
                return
            self._bar = tqdm(total=total, desc=desc, unit=unit, unit_scale=True, delay=1.0, leave=False)

    def update(self, n: int):
        if self._bar is not None:
            self._bar.update(n)

    def close(self):
        if self._bar is not None:
            self._bar.close()


__all__ = ["Progress"]
