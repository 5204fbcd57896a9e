"""Stopping a demo cleanly on SIGINT (Ctrl-C) or SIGTERM, whatever it is doing.

``StopSignals`` replaces the two signals' handlers while a demo runs. The first signal
raises ``Interrupted`` in the main thread wherever it is (an import, a sleep, a wait on a
process), so the demo unwinds to its shutdown and exits with 128 + the signal's number
(130 for SIGINT, 143 for SIGTERM), the status a shell gives a process the signal killed.

Three rules keep the shutdown whole:

- Code that must not be cut in two (starting a process, making the server and its stores)
  runs under ``hold()``: a signal there is noted and raised when the block ends.
- Once a signal has been raised, or ``stopping()`` called, signals are only counted: the
  cleanup (children stopped, server and stores closed, summary written) runs to its end.
- ``optional(fn)`` runs a step the shutdown can do without (the final evaluation, the
  plot): skipped when a signal came since the stop began, ended by one that comes during
  it. So a second Ctrl-C skips what is left to skip, and never prints a traceback.

An inherited SIG_IGN for SIGINT (a background job of a non-interactive shell) is kept: such
a process is not meant to hear the terminal's Ctrl-C. Handlers can only be set from the main
thread; elsewhere ``StopSignals`` does nothing and the usual behaviour stays.

Child processes: ``block_sigint()`` around starting one makes it start with SIGINT blocked
(the mask survives exec), and ``child_setup()``, the child's first call, ignores SIGINT,
unblocks it, and asks for SIGTERM when the parent dies. The terminal's Ctrl-C reaches the
whole foreground process group; this way only the parent acts on it (it stops the children
with SIGTERM, which ends them without a traceback), even during their imports.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(BaseException):
    """The run was stopped by a signal. A BaseException, as KeyboardInterrupt is, so that
    ``except Exception`` does not swallow it."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


def signal_name(signum: int | None) -> str | None:
    return None if signum is None else signal.Signals(signum).name


class StopSignals:
    """SIGINT and SIGTERM handlers for a demo's main thread (see the module doc). Use as a
    context manager: the previous handlers come back at its end."""

    def __init__(self, quiet_after: bool = False):
        self.quiet_after = quiet_after  # see __exit__
        self.first: int | None = None   # the first signal received
        self.count = 0                  # signals received
        self._raising = True
        self._pending = False
        self._mark = None               # ``count`` when the stop began
        self._previous = {}
        self._lost = False              # a raise that a callback swallowed (see _unraisable)
        self._hook = None

    def __enter__(self) -> "StopSignals":
        if threading.current_thread() is not threading.main_thread():
            return self
        for s in SIGNALS:
            previous = signal.getsignal(s)
            if s == signal.SIGINT and previous == signal.SIG_IGN:
                continue
            self._previous[s] = previous
            signal.signal(s, self._handle)
        self._hook, sys.unraisablehook = sys.unraisablehook, self._unraisable
        return self

    def reclaim(self) -> None:
        """Installs the handlers again, after a library replaced them behind Python's back
        (``ray.init`` puts its own SIGTERM handler in the process with ``sigaction``)."""
        for s in self._previous:
            signal.signal(s, self._handle)

    def _unraisable(self, unraisable):
        """A signal that lands while the interpreter runs a callback that cannot raise
        (a weakref callback of importlib's module locks, during an import) has its
        ``Interrupted`` swallowed and printed as "Exception ignored": keep it quiet and
        remember it, so that ``hold`` and ``optional`` still see the stop."""
        if isinstance(unraisable.exc_value, Interrupted):
            self._lost = True
            return
        (self._hook or sys.__unraisablehook__)(unraisable)

    def __exit__(self, *exc):
        """Restores the previous handlers; with ``quiet_after`` (a command's ``main``, whose
        process exits next), after a run a signal stopped, ignores the two signals instead:
        Ctrl-C pressed again while the interpreter exits is then neither a KeyboardInterrupt
        nor a death by SIGINT (the interpreter resets Python-level handlers to the default
        as it finalizes; it leaves SIG_IGN alone)."""
        if self._hook is not None:
            sys.unraisablehook, self._hook = self._hook, None
        if self.quiet_after and self.first is not None:
            self.stopping()
            for s in self._previous:
                signal.signal(s, signal.SIG_IGN)
            self._previous.clear()
            return False
        for s, previous in self._previous.items():
            signal.signal(s, previous)
        self._previous.clear()
        return False

    @property
    def interrupted(self) -> bool:
        return self.first is not None

    @property
    def exit_code(self) -> int | None:
        return None if self.first is None else 128 + self.first

    def _handle(self, signum, frame):
        self.count += 1
        if self.first is None:
            self.first = signum
        if self._raising:
            self._raising = False  # one raise: the unwinding it starts is not cut again
            raise Interrupted(self.first)
        self._pending = True

    @contextlib.contextmanager
    def hold(self):
        """Signals wait for the end of the block (then raise, unless the demo is stopping)."""
        raising, self._raising = self._raising, False
        try:
            yield
        finally:
            self._raising = raising and self._mark is None
        if (self._pending or self._lost) and self._raising:
            self._pending = self._raising = self._lost = False
            raise Interrupted(self.first)

    def stopping(self) -> None:
        """The shutdown begins: from here on, signals are counted, not raised (but see
        ``optional``). Idempotent."""
        self._raising = False
        self._pending = False
        if self._mark is None:
            self._mark = self.count

    def optional(self, fn, *args, **kwargs):
        """``(True, fn(...))``, or ``(False, None)`` when a signal came since the stop began
        or comes while ``fn`` runs (it is then ended)."""
        self.stopping()
        if self.count != self._mark:
            return False, None
        self._raising = True
        try:
            result = fn(*args, **kwargs)
            return (False, None) if self._lost else (True, result)
        except Interrupted:
            return False, None
        except Exception as e:
            # The raise can land where Python wraps it: inside a class body being made
            # during an import, it comes back as a RuntimeError from "__set_name__".
            if caused_by_interrupt(e):
                return False, None
            raise
        finally:
            self._raising = False


def caused_by_interrupt(error: BaseException) -> bool:
    """Whether ``error`` is, or was raised while handling or because of, an
    ``Interrupted`` (the chain of ``__cause__`` and ``__context__``)."""
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, Interrupted):
            return True
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return False


@contextlib.contextmanager
def block_sigint():
    """SIGINT blocked in this thread for the block: a process started inside starts with it
    blocked (see ``child_setup``). One that arrives meanwhile is delivered at the end.

    multiprocessing's resource tracker is started first if it is not running: the first
    spawn starts it, and unblocks SIGINT (and SIGTERM) in the parent when it has."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    from multiprocessing import resource_tracker
    resource_tracker.ensure_running()
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def child_setup(parent: int | None = None) -> None:
    """A child process's first call: ignore the terminal's SIGINT (the parent stops the
    children), unblock it (``block_sigint``), and on Linux get SIGTERM when ``parent``
    dies, so that no child outlives a parent killed without its cleanup."""
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    except ValueError:  # not the main thread (a Ray actor's method): the terminal's signals are not ours
        return
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    if parent is not None:
        die_with_parent(parent)


def die_with_parent(parent: int) -> None:
    """On Linux, SIGTERM to this process when ``parent`` (the process that started it) dies."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # it died before the prctl
        os.kill(os.getpid(), signal.SIGTERM)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_shared_memory_of(pids) -> list[str]:
    """Removes the shared-memory files of Reprise stores owned by ``pids``, processes
    that are gone (killed before they could close their stores; a live one is skipped).
    Returns the paths.

    The library names a store's file ``reprise-<pid>-<n>-<hex>`` under /dev/shm and removes
    stale ones only when a local server starts (``crates/server/src/naming.rs``); a demo
    whose ranks were killed cleans up after them here."""
    removed = []
    shm = "/dev/shm"
    if not os.path.isdir(shm):
        return removed
    prefixes = tuple(f"reprise-{int(p)}-" for p in pids if p and not _alive(int(p)))
    if not prefixes:
        return removed
    for name in os.listdir(shm):
        if name.startswith(prefixes):
            path = os.path.join(shm, name)
            try:
                if os.stat(path).st_uid == os.getuid():
                    os.remove(path)
                    removed.append(path)
            except OSError:
                pass
    return removed


__all__ = ["Interrupted", "StopSignals", "block_sigint", "child_setup", "die_with_parent",
           "remove_shared_memory_of", "signal_name"]
