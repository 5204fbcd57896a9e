"""File stores: a store's columns in a file on a local disk, kept between runs.

``rp.Store(signature, capacity, directory=D, backing="file")`` puts the columns in
``D/columns``, mapped (the page cache does the caching, so a store may be larger than
memory), and ``rp.Store.open(D)`` maps them again later with the tables that were over the
store: nothing is copied. The directory holds::

    D/store.json    format, version, signature (with compression), capacity, block_steps
    D/columns       the mapped columns (0600)
    D/index/        the tables' indexes: a checkpoint saved in place (its rows stay in
                    D/columns), written by the store's close()
    D/open          present while a process has the store open (its pid)
    D/lock          held (flock) by that process

Crash safety: the index is written by ``close()`` after the indexes were taken and the
columns written back (msync), into a new checkpoint directory renamed into place; ``D/open``
goes last. A store whose process died while it was open still has ``D/open``: rows written
since its last close may have overwritten rows its index references, so ``open`` refuses it
rather than hand out items whose rows changed. A crash during ``close()`` leaves the previous
index and ``D/open``: refused the same way.

A *durable* store (``durable=True``, recorded in ``store.json``) also writes its index at
each commit (a writer's flush, ``Store.commit()``, or a lease that needs the blocks whose
items went), and no block the newest index on disk references is reused before a newer one
is there (``crates/core/src/durable.rs`` says how). So its newest index always matches the
columns, and ``open`` of a durable store left open loads it: every item a commit covered
comes back, items added after it do not.

A commit costs an msync of what was written since the one before, plus the tables' whole
index (about 64 bytes an item) written and synced: flushes that arrive during a commit
share the next one, so a commit's cost is paid per group, not per flush.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os

from . import _native
from .errors import Corrupt, InvalidArgument
from .signature import Field

FORMAT = "reprise-file-store"
VERSION = 1
MEMORY_FILE_SYSTEMS = ("tmpfs", "hugetlbfs", "ramfs")


def file_system(path: str) -> str:
    """The type of the file system that holds ``path`` (from /proc/self/mountinfo)."""
    path = os.path.realpath(path)
    best, kind = -1, "unknown"
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                fields = line.split(" ")
                point = fields[4].replace("\\040", " ")
                fstype = line.split(" - ", 1)[1].split(" ")[0]
                inside = path == point or path.startswith(point.rstrip("/") + "/")
                if inside and len(point) >= best:
                    best, kind = len(point), fstype
    except (OSError, IndexError):
        pass
    return kind


def disk_directory() -> str | None:
    """A writable directory on a disk (not a memory file system) for file stores: the
    temporary directory, /var/tmp or the working directory, the first that is; None when
    none is."""
    import tempfile
    for base in (tempfile.gettempdir(), "/var/tmp", os.getcwd()):
        if os.path.isdir(base) and os.access(base, os.W_OK) and file_system(base) not in MEMORY_FILE_SYSTEMS:
            return base
    return None


class FileDirectory:
    """The directory of one file store, held (locked) by this process while open."""

    def __init__(self, path: str, lock_fd: int):
        self.path = path
        self._lock_fd = lock_fd
        # True when ``open`` found a durable store its process left open.
        self.recovered = False

    @property
    def columns(self) -> str:
        return os.path.join(self.path, "columns")

    @property
    def index(self) -> str:
        return os.path.join(self.path, "index")

    # --- making and opening ------------------------------------------------------------------

    @classmethod
    def create(cls, directory) -> "FileDirectory":
        """Checks ``directory`` (made if missing) for a new file store and holds it."""
        path = os.path.abspath(os.fspath(directory))
        if os.path.exists(os.path.join(path, "store.json")) or os.path.exists(os.path.join(path, "columns")):
            raise InvalidArgument(f"{path} already holds a file store: open it with rp.Store.open({path!r}), "
                                  f"or pass an empty directory")
        parent = path
        while not os.path.exists(parent):
            parent = os.path.dirname(parent)
        kind = file_system(parent)
        if kind in MEMORY_FILE_SYSTEMS:
            raise InvalidArgument(f"backing='file' keeps the columns on a disk, and {path} is on a {kind} (memory): "
                                  f"pass a directory on a local disk, or leave backing='memory' for shared memory")
        try:
            os.makedirs(path, mode=0o700, exist_ok=True)
        except OSError as e:
            raise InvalidArgument(f"cannot make the file store directory {path}: {e.strerror}") from None
        if not os.access(path, os.W_OK | os.X_OK):
            raise InvalidArgument(f"the file store directory {path} is not writable by this user")
        d = cls(path, cls._lock(path))
        d._mark_open()
        return d

    @classmethod
    def open(cls, directory) -> tuple["FileDirectory", dict]:
        """Holds the file store in ``directory`` and returns it with its ``store.json``."""
        path = os.path.abspath(os.fspath(directory))
        meta_path = os.path.join(path, "store.json")
        try:
            with open(meta_path) as f:
                meta = json.load(f)
        except FileNotFoundError:
            raise InvalidArgument(f"{path} holds no file store (no store.json): make one with "
                                  f"rp.Store(..., directory={path!r}, backing='file')") from None
        except (OSError, ValueError) as e:
            raise Corrupt(f"{meta_path}: unreadable ({e})") from None
        if meta.get("format") != FORMAT or meta.get("version") != VERSION:
            raise Corrupt(f"{meta_path}: format {meta.get('format')!r} version {meta.get('version')!r}, expected "
                          f"{FORMAT!r} version {VERSION}")
        d = cls(path, cls._lock(path))
        marker = os.path.join(path, "open")
        d.recovered = os.path.exists(marker) and bool(meta.get("durable"))
        if os.path.exists(marker) and not d.recovered:
            d.release()
            try:
                with open(marker) as f:
                    pid = f.read().strip() or "?"
            except OSError:
                pid = "?"
            raise Corrupt(f"the file store in {path} was not closed (process {pid} had it open and is gone): rows "
                          f"written after its last close may have replaced rows its saved index refers to, so it "
                          f"cannot be opened. Its data since the last close is lost; remove the directory to start "
                          f"over")
        d._mark_open()
        return d, meta

    @staticmethod
    def _lock(path: str) -> int:
        fd = os.open(os.path.join(path, "lock"), os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise InvalidArgument(f"the file store in {path} is open (its lock is held, by another process or another handle in this one): "
                                  f"close it there first") from None
        return fd

    def _mark_open(self) -> None:
        self._write(os.path.join(self.path, "open"), str(os.getpid()))

    # --- metadata ----------------------------------------------------------------------------

    def write_meta(self, signature: dict, capacity: int, block_steps: int, durable: bool = False) -> None:
        meta = {"format": FORMAT, "version": VERSION, "capacity": capacity, "block_steps": block_steps,
                **({"durable": True} if durable else {}),
                "signature": [[name, list(f.shape), f.dtype, f.level] + ([f.stack, f.padding] if f.stack > 1 else [])
                              for name, f in signature.items()]}
        self._write(os.path.join(self.path, "store.json"), json.dumps(meta, indent=1))

    @staticmethod
    def signature_of(meta: dict) -> dict:
        return {name: Field._from_native(shape, dtype, level, *rest) for name, shape, dtype, level, *rest in meta["signature"]}

    def write_json(self, name: str, value) -> None:
        """``name`` in the directory, whole or not at all: what a user of the store (a
        ``TransitionBuffer``) keeps beside it."""
        self._write(os.path.join(self.path, name), json.dumps(value, indent=1))

    def read_json(self, name: str):
        """``name``'s JSON, or None when the directory has no such file."""
        try:
            with open(os.path.join(self.path, name)) as f:
                return json.load(f)
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            raise Corrupt(f"{os.path.join(self.path, name)} is unreadable: {e}") from None

    def _write(self, path: str, text: str) -> None:
        """Writes ``path`` whole or not at all (a temporary file renamed), synced."""
        tmp = f"{path}.tmp-{os.getpid()}"
        fd = os.open(tmp, os.O_CREAT | os.O_TRUNC | os.O_WRONLY | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, text.encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        self._sync_dir()

    def _sync_dir(self) -> None:
        fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    # --- the tables' index -------------------------------------------------------------------

    def latest_index(self) -> str | None:
        """The newest complete index checkpoint, or None."""
        try:
            names = sorted(n for n in os.listdir(self.index) if n.startswith("ckpt-"))
        except FileNotFoundError:
            return None
        return os.path.join(self.index, names[-1]) if names else None

    def close(self, native) -> None:
        """Writes the tables' index in place (the columns written back first), then
        lets the store go: after this ``open`` finds it as it is now."""
        native.save_index(self.index)
        os.remove(os.path.join(self.path, "open"))
        self._sync_dir()
        self.release()

    def abandon(self) -> None:
        """Undoes ``create`` (the store could not be made): removes what it wrote."""
        for name in ("open", "store.json", "columns", "lock"):
            try:
                os.remove(os.path.join(self.path, name))
            except FileNotFoundError:
                pass
        self.release()

    def release(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # drops the flock
            self._lock_fd = None


def open_store(directory):
    """``rp.Store.open``: the file store in ``directory`` with the tables that were over
    it when it was last closed (``store.tables``)."""
    from .store import Store
    from .table import Table
    d, meta = FileDirectory.open(directory)
    try:
        signature = FileDirectory.signature_of(meta)
        store = Store(signature, meta["capacity"], meta["block_steps"], directory=d.path, backing="file",
                      durable=bool(meta.get("durable")), _opened=d)
    except BaseException:
        d.release()
        raise
    try:
        index = d.latest_index()
        if index is not None:
            def make_store(i, sig, capacity, block_steps, device, file):
                if file != d.columns or capacity != store.capacity or block_steps != store.block_steps:
                    raise Corrupt(f"{index}: its store {i} is not the columns of {d.path}")
                return store, None

            _, _, tables = _native.checkpoint.load(index, make_store, None)
            store._restored = {native.name: Table._restored(native, store, config) for native, _, config in tables}
        if d.recovered:
            items = sum(t.size for t in store._restored.values())
            logging.getLogger("reprise").warning(
                "the durable file store in %s was not closed: reopened as its last commit left it (%d items in %d "
                "tables); items added after that commit are not in it", d.path, items, len(store._restored))
    except BaseException:
        store._file = None  # leave the directory as it was: still marked open by no one
        os.remove(os.path.join(d.path, "open"))
        d.release()
        raise
    return store
