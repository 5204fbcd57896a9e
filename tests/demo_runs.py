"""A demo (``reprise demo NAME``) run in a subprocess the way a user runs it, for the demos'
tests: its output collected as it comes, waits with deadlines, and the check that it left
nothing behind (sockets, locks, shared memory, children)."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

from pathlib import Path

import pytest

DEMO = ("import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
        "from reprise import cli; sys.exit(cli.main(sys.argv[1:]))")


def status(out: Path) -> dict | None:
    try:
        return json.loads((out / "status.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


class DemoRun:
    """``reprise demo DEMO ARGS`` in a subprocess; its stderr lines are collected as they come."""

    def __init__(self, demo: str, args, cwd=None, env: dict | None = None):
        import tempfile
        import threading
        self.runtime = Path(tempfile.mkdtemp(prefix="rp-xdg-"))  # short: a Unix socket path has 108 bytes
        env = dict(os.environ, XDG_RUNTIME_DIR=str(self.runtime), **(env or {}))
        self.proc = subprocess.Popen([sys.executable, "-c", DEMO, "demo", demo, *args], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, env=env, cwd=cwd, start_new_session=True)
        self.err_lines: list[str] = []
        self.out_lines: list[str] = []
        self._readers = [threading.Thread(target=lambda: self.err_lines.extend(self.proc.stderr), daemon=True),
                         threading.Thread(target=lambda: self.out_lines.extend(self.proc.stdout), daemon=True)]
        for reader in self._readers:
            reader.start()

    def wait_for(self, predicate, timeout: float, what: str):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        self.kill()
        pytest.fail(f"no {what} within {timeout} s (exit {self.proc.returncode}):\n{self.stderr[-3000:]}")

    def saw(self, text: str) -> bool:
        return any(text in line for line in list(self.err_lines))

    def finish(self, timeout: float) -> int:
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"the demo ran past {timeout} s:\n{self.stderr[-3000:]}")
        for reader in self._readers:
            reader.join(5)
        return self.proc.returncode

    @property
    def out(self) -> str:
        return "".join(self.out_lines)

    def kill(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        shutil.rmtree(self.runtime, ignore_errors=True)

    @property
    def stderr(self) -> str:
        return "".join(self.err_lines)

    def assert_clean(self, child_pids=()):
        """No traceback; no socket, lock or shared memory of the run left; no child left."""
        assert "Traceback" not in self.stderr and "Traceback" not in self.out, self.stderr[-3000:]
        left = list((self.runtime / "reprise").iterdir()) if (self.runtime / "reprise").exists() else []
        assert left == [], left
        pids = {self.proc.pid, *child_pids}
        shm = [f for f in os.listdir("/dev/shm") if any(f.startswith(f"reprise-{p}-") for p in pids)] \
            if os.path.isdir("/dev/shm") else []
        assert shm == [], shm
        for pid in child_pids:
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)
        shutil.rmtree(self.runtime, ignore_errors=True)
