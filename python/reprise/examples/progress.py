"""A demo's progress on stderr: one bar redrawn in place on a terminal, plain lines elsewhere.

On a terminal that reports a usable width, a bar ``label  45%|#####     | text`` is redrawn
at most 5 times a second and cut to the width; ``log`` prints a message above it. Where
there is no terminal (a pipe, a file, CI) or its width is unknown or tiny (a pty nobody
sized reports 0 x 0), a line ``label  45% text`` is printed every ``every`` seconds, and at
``close`` the last state once more: a log of the run rather than nothing.
"""

from __future__ import annotations

import os
import sys
import time

MIN_WIDTH = 40
REDRAW_S = 0.2


def terminal_width(stream) -> int | None:
    """The width of the terminal ``stream`` writes to; None when it is not a terminal or
    reports fewer than ``MIN_WIDTH`` columns."""
    try:
        if not stream.isatty():
            return None
        columns = os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, OSError, ValueError):
        return None
    return columns if columns >= MIN_WIDTH else None


class ProgressLine:
    """Progress toward a goal, ``fraction`` of it done, with ``text`` beside it."""

    def __init__(self, label: str, every: float = 10.0, stream=None, enabled: bool = True):
        self.label, self.every, self.enabled = label, every, enabled
        self.stream = sys.stderr if stream is None else stream
        self._line = None            # the last (fraction, text)
        self._drawn = False          # a bar is on screen (terminal mode)
        self._last = -float("inf")   # when the last line or bar was written
        self._printed = None         # the last line printed (line mode)

    def _bar(self, fraction, text, width) -> str:
        pct = "  ?%" if fraction is None else f"{100 * fraction:3.0f}%"
        cells = max(10, min(30, width // 5))
        filled = 0 if fraction is None else int(round(cells * min(1.0, max(0.0, fraction))))
        line = f"{self.label} {pct}|{'#' * filled}{' ' * (cells - filled)}| {text}"
        return line[:width - 1]

    def _plain(self, fraction, text) -> str:
        pct = "" if fraction is None else f" {100 * fraction:3.0f}%"
        return f"{self.label}{pct} {text}"

    def update(self, fraction: float | None, text: str) -> None:
        """The new state; shown now or at the next redraw or line."""
        if not self.enabled:
            return
        self._line = (None if fraction is None else min(1.0, max(0.0, fraction)), text)
        now = time.monotonic()
        width = terminal_width(self.stream)
        if width is not None:
            if now - self._last >= REDRAW_S:
                self._write("\r" + self._bar(*self._line, width) + "\x1b[K")
                self._drawn, self._last = True, now
        elif now - self._last >= self.every:
            self._print_line()
            self._last = now

    def _print_line(self):
        line = self._plain(*self._line)
        self._write(line + "\n")
        self._printed = line

    def _write(self, s: str):
        try:
            self.stream.write(s)
            self.stream.flush()
        except (OSError, ValueError):  # a closed or broken stream: progress is not worth failing for
            self.enabled = False

    def log(self, message: str) -> None:
        """``message`` on its own line (above the bar on a terminal)."""
        if self._drawn:
            self._write("\r\x1b[K")
        self._write(message + "\n")
        if self._drawn and self._line is not None:
            width = terminal_width(self.stream)
            if width is not None:
                self._write("\r" + self._bar(*self._line, width) + "\x1b[K")

    def close(self) -> None:
        """Ends the bar's line (terminal) or prints the last state if it was not (lines)."""
        if not self.enabled or self._line is None:
            return
        if self._drawn:
            width = terminal_width(self.stream)
            if width is not None:
                self._write("\r" + self._bar(*self._line, width) + "\x1b[K")
            self._write("\n")
            self._drawn = False
        elif self._plain(*self._line) != self._printed:
            self._print_line()
        self.enabled = False


__all__ = ["ProgressLine", "terminal_width"]
