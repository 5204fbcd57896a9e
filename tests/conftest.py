"""Shared fixtures: stores that are closed (their shm files removed) after each test, and a
session guard that fails the run if the suite left servers' sockets and lock files or store
files behind."""

import gc
import os
import re
import shutil
import tempfile
import threading
import time
import uuid

import numpy as np
import pytest

import reprise as rp

# --- leftovers guard ------------------------------------------------------------------------------
#
# Servers put `<name>.sock` and `<name>.lock` in `$XDG_RUNTIME_DIR/reprise` (else
# /tmp/reprise-<uid>; crates/server/src/naming.rs), stores their columns in
# /dev/shm/reprise-<pid>-<n>-<random> (crates/core/src/memory.rs). Both are removed when
# their owner stops or closes; what a test leaves there is a bug (a server or store never
# closed, a process killed without cleaning up after it).
#
# Other sessions of this user (another engineer's pytest, a running `reprise serve`) use
# the same directories at the same time, so the guard only counts what is this session's:
# - the session gets a runtime directory of its own: $XDG_RUNTIME_DIR is set to a fresh
#   0700 directory before collection, so every server of the session and of the processes
#   it starts (they inherit the environment) puts its files there, and all of it is ours;
# - /dev/shm cannot be moved, so a new store file (named for the pid of the process that
#   made it) is ours when that process is this one or one whose environment carries this
#   session's token, as a watcher thread saw while the process lived.

SESSION_ENV = "REPRISE_TEST_SESSION"
SHM = "/dev/shm"
_STORE_FILE = re.compile(r"reprise-(\d+)-")
_session = {}


def pytest_configure(config):
    if SESSION_ENV in os.environ:
        return  # a pytest run inside this session's tests: the outer session guards
    _session["runtime"] = tempfile.mkdtemp(prefix="reprise-test-runtime-")  # 0700
    _session["old_xdg"] = os.environ.get("XDG_RUNTIME_DIR")
    os.environ["XDG_RUNTIME_DIR"] = _session["runtime"]
    os.environ[SESSION_ENV] = _session["token"] = uuid.uuid4().hex


def pytest_unconfigure(config):
    runtime = _session.pop("runtime", None)
    if runtime is None:
        return
    shutil.rmtree(runtime, ignore_errors=True)
    old = _session.pop("old_xdg")
    if old is None:
        os.environ.pop("XDG_RUNTIME_DIR", None)
    else:
        os.environ["XDG_RUNTIME_DIR"] = old
    os.environ.pop(SESSION_ENV, None)


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class _StoreFiles:
    """Store files that processes of this session created in /dev/shm after ``start``.

    A watcher thread notes, every 0.1 s, the processes whose environment carries the session's
    token: a process that creates a store lives far longer than that (it imports numpy and
    reprise first), so even one killed right after is seen alive."""

    def __init__(self, token):
        self._marker = f"{SESSION_ENV}={token}".encode() + b"\0"
        self._before = self._listing()
        self._judged = set()
        self._ours = {os.getpid()}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="store-file-watch", daemon=True)
        self._thread.start()

    @staticmethod
    def _listing():
        try:
            return {f for f in os.listdir(SHM) if _STORE_FILE.match(f)}
        except OSError:
            return set()

    def _note_processes(self):
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) in self._judged:
                continue
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    ours = self._marker in f.read()
            except OSError:
                continue  # gone, or another user's
            self._judged.add(int(entry))
            if ours:
                self._ours.add(int(entry))

    def _watch(self):
        while not self._stop.wait(0.1):
            self._note_processes()

    def left(self):
        self._note_processes()
        new = self._listing() - self._before
        return sorted(f for f in new if int(_STORE_FILE.match(f).group(1)) in self._ours)

    def close(self):
        self._stop.set()
        self._thread.join()


def _left_in_runtime_dir():
    d = os.path.join(_session["runtime"], "reprise")
    return sorted(os.listdir(d)) if os.path.isdir(d) else []


@pytest.fixture(scope="session", autouse=True)
def no_leftovers():
    """Fails the session (an error at its end) if its servers left sockets or lock files, or
    its stores left shared-memory files. Processes the tests started must be gone by then:
    a moment is allowed for those still exiting."""
    if "runtime" not in _session:
        yield
        return
    stores = _StoreFiles(_session["token"])
    try:
        yield
    finally:
        gc.collect()  # stores and servers only garbage holds still close now
        deadline = time.monotonic() + 10.0
        while (_left_in_runtime_dir() or stores.left()) and time.monotonic() < deadline:
            time.sleep(0.1)
        stores.close()
        sockets, shm = _left_in_runtime_dir(), stores.left()
        # Report, then tidy what no live process owns, so a failed run leaves nothing either.
        for f in shm:
            if not _alive(int(_STORE_FILE.match(f).group(1))):
                os.unlink(os.path.join(SHM, f))
        if sockets or shm:
            pytest.fail(f"the test session left {len(sockets)} file(s) in the servers' runtime directory "
                        f"{sockets} and {len(shm)} store file(s) in {SHM} {shm}: a server or store was not "
                        "closed, or a process was killed without cleaning up after it", pytrace=False)


# --- fixtures -------------------------------------------------------------------------------------


@pytest.fixture
def disk():
    """A fresh directory on a disk (not a tmpfs) for a file store, removed afterwards."""
    from reprise.file_store import disk_directory
    base = disk_directory()
    if base is None:
        pytest.skip("no writable directory on a disk here (every candidate is a tmpfs)")
    path = tempfile.mkdtemp(prefix="reprise-file-store-", dir=base)
    yield os.path.join(path, "store")
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def make_store():
    """``make_store(signature=None, capacity=1024, block_steps=16)``; closed at teardown."""
    stores = []

    def make(signature=None, capacity=1024, block_steps=16):
        if signature is None:
            signature = {"x": rp.Field((), "int64")}
        store = rp.Store(signature, capacity=capacity, block_steps=block_steps)
        stores.append(store)
        return store

    yield make
    for store in stores:
        store.close()


@pytest.fixture
def scalar_store(make_store):
    """A store of one int64 scalar field ``x``: step data doubles as an id."""
    return make_store({"x": rp.Field((), "int64")}, capacity=4096, block_steps=8)


def insert_scalars(table, values, priorities=1.0):
    """One single-step item per value (field ``x``); returns the keys."""
    values = np.asarray(values, dtype=np.int64).reshape(-1, 1)
    return table.insert({"x": values}, priorities)
