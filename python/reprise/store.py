"""Stores: columns of step data in shared memory, handed out in blocks."""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Mapping

from . import _native
from ._convert import as_int
from .errors import InvalidArgument
from .signature import Field
from .torch._device import is_host_device


class Store:
    """Columns for ``signature`` with room for ``capacity`` steps.

    The columns live in one file under /dev/shm (mode 0600), removed on ``close()``
    or when the last table and writer over the store are gone. ``capacity`` is
    rounded up to whole blocks of ``block_steps`` steps; a block is reused only when
    no item, writer or sample in flight references any of its steps.

    ``huge_pages=True`` asks for the columns on 2 MiB pages (fewer TLB misses for
    random rows, on the CPU and for a GPU's zero-copy gather): ``directory`` must
    then be a hugetlbfs mount or a tmpfs mounted with ``huge=within_size`` (or
    ``always``/``advise``), and any other directory is refused (/dev/shm is
    usually ``huge=never``). Without it, a store placed on such a directory gets
    huge pages all the same. ``huge_page_bytes`` says how much of it has them.

    ``backing="file"`` makes a *file store*: the columns go in ``directory/columns`` on
    a local disk (mapped: the page cache caches them, so the store may be larger than
    memory) and stay there. ``close()`` writes the tables' indexes beside them, and
    ``Store.open(directory)`` maps the columns again with those tables, copying nothing
    (``reprise.file_store`` has the layout and the crash rules).

    ``durable=True`` (file stores) keeps the tables' items on disk while the store runs:
    a writer's ``flush()`` returns once its items are on disk (a *group commit*: flushes
    that arrive together share one), ``commit()`` does the same for everything in the
    tables, and ``Store.open`` of a store whose process was killed brings back every
    item a commit covered. Not with compressed fields.
    """

    def __init__(self, signature: Mapping[str, Field], capacity: int, block_steps: int = 64,
                 directory: str | os.PathLike | None = None, device: str | None = None,
                 huge_pages: bool = False, backing: str = "memory", durable: bool = False, _opened=None):
        if not isinstance(signature, Mapping) or not signature:
            raise InvalidArgument(f"signature must be a non-empty dict of name -> Field, got {signature!r}")
        for name, f in signature.items():
            if not isinstance(name, str) or not name:
                raise InvalidArgument(f"field names must be non-empty strings, got {name!r}")
            if not isinstance(f, Field):
                raise InvalidArgument(f"field '{name}' must be a reprise.Field, got {type(f).__name__}")
        capacity = as_int("capacity", capacity, minimum=1)
        block_steps = as_int("block_steps", block_steps, minimum=1)
        if not isinstance(huge_pages, bool):
            raise InvalidArgument(f"huge_pages must be True or False, got {huge_pages!r}")
        if huge_pages and not is_host_device(device):
            raise InvalidArgument(f"huge_pages=True is for host stores; a store on {device} keeps its "
                                  "columns in GPU memory")
        if backing not in ("memory", "file"):
            raise InvalidArgument(f"backing must be 'memory' (shared memory) or 'file' (a file on a local disk), "
                                  f"got {backing!r}")
        if not isinstance(durable, bool):
            raise InvalidArgument(f"durable must be True or False, got {durable!r}")
        if durable and backing != "file":
            raise InvalidArgument("durable=True keeps a file store's items on disk: pass backing='file' and a "
                                  "directory on a local disk too")
        if durable:
            packed = [name for name, f in signature.items() if f.compress is not None]
            if packed:
                raise InvalidArgument(f"a durable store cannot have compressed fields yet (field '{packed[0]}' has "
                                      f"compress={signature[packed[0]].compress!r}): store it raw, or drop durable")
        if backing == "file":
            if directory is None:
                raise InvalidArgument("backing='file' needs directory=: the directory on a local disk that will "
                                      "hold the store's columns and indexes")
            if huge_pages or not is_host_device(device):
                raise InvalidArgument("backing='file' is for host stores on small pages: pass neither device nor "
                                      "huge_pages=True")
        self._device = None
        self._device_columns = None
        compressed = [name for name, f in signature.items() if f.compress is not None]
        if compressed and not is_host_device(device):
            raise InvalidArgument(f"field '{compressed[0]}' is compressed, and a store on {device} keeps its columns "
                                  f"raw in GPU memory: store it raw there, or keep the store on the host "
                                  f"(device=None) and sample it to {device}")
        stacked = [name for name, f in signature.items() if f.stack > 1]
        if stacked and not is_host_device(device):
            raise InvalidArgument(f"field '{stacked[0]}' is stacked, and a store on {device} keeps whole steps in GPU "
                                  f"memory: keep the store on the host (device=None) and sample it to {device}, or "
                                  f"store the stacks whole there")
        if not is_host_device(device):
            from .torch import resolve
            from .torch.device_store import INDEX_FIELD
            if INDEX_FIELD in signature:
                raise InvalidArgument(f"field name {INDEX_FIELD!r} is reserved")
            self._device = resolve(device)
            # The host keeps blocks and items over a one-byte-per-step index store.
            index_signature = [(INDEX_FIELD, [], "uint8")]
        else:
            index_signature = [(name, list(f.shape), f.dtype) for name, f in signature.items()]
        self._signature = dict(signature)
        self._huge_pages = huge_pages
        levels = [f.level for f in signature.values()] if self._device is None else []
        stacks = [(f.stack, f.padding) for f in signature.values()] if self._device is None and stacked else []
        self._file = None
        self._restored: dict = {}  # tables Store.open brought back (kept alive with the store)
        if backing == "file":
            from .file_store import FileDirectory
            made = _opened is None
            self._file = FileDirectory.create(directory) if made else _opened
            try:
                self._native = _native.Store(index_signature, capacity, block_steps, None, False, levels,
                                             file=self._file.columns, open=not made, stacks=stacks)
                if durable:
                    self._native.make_durable(self._file.index)
                if made:
                    self._file.write_meta(signature, self._native.capacity, block_steps, durable)
            except BaseException:
                if made:
                    self._file.abandon()
                raise
        else:
            self._native = _native.Store(
                index_signature, capacity, block_steps, None if directory is None else os.fspath(directory),
                huge_pages, levels, stacks=stacks,
            )
        self._compressed = frozenset(compressed)
        # Why a device cannot gather this store's rows in place (they are then read on
        # the host and moved), or None when it can: fixed at creation.
        if compressed:
            self._staged = f"fields {sorted(compressed)} are compressed"
        elif stacked:
            self._staged = f"fields {sorted(stacked)} are stacked (a step's frames are assembled on the host)"
        elif self._native.persistent:
            self._staged = "it is a file store (registering its file with the GPU would pin all of it in memory)"
        else:
            self._staged = None
        if self._device is not None:
            from .torch.columns import DeviceColumns
            self._device_columns = DeviceColumns(self._signature, self._native.capacity, self._device)
        self._host_views: dict = {}
        self._insert_writer = None  # device stores: the writer of Table.insert
        self._insert_lock = threading.Lock()
        self._closed = False
        # The tables over this store, by name (weakly): what pickling it carries.
        self._tables = weakref.WeakValueDictionary()

    @property
    def signature(self) -> dict:
        return dict(self._signature)

    @property
    def capacity(self) -> int:
        """Capacity in steps (whole blocks)."""
        return self._native.capacity

    @property
    def block_steps(self) -> int:
        return self._native.block_steps

    @property
    def num_blocks(self) -> int:
        return self._native.num_blocks

    @property
    def free_blocks(self) -> int:
        return self._native.free_blocks

    @property
    def device(self) -> str:
        """Where the step data lives: "cpu" (host shared memory) or a CUDA device."""
        return "cpu" if self._device is None else str(self._device)

    @property
    def path(self) -> str:
        """The shared-memory file behind the columns."""
        return os.fspath(self._native.path)

    @property
    def huge_pages(self) -> bool:
        """Whether the store was made with ``huge_pages=True``."""
        return self._huge_pages

    @classmethod
    def open(cls, directory) -> "Store":
        """The file store in ``directory`` (made with ``backing="file"``), its columns
        mapped again, with the tables that were over it when it was last closed
        (``store.tables``). Copies nothing. Refused while another process has it open,
        and when the process that had it open died before closing it, unless the store
        is durable: it then comes back as its last commit left it."""
        from .file_store import open_store
        return open_store(directory)

    @property
    def backing(self) -> str:
        """"memory" (shared memory, the default) or "file" (a file store)."""
        return "file" if self._native.persistent else "memory"

    @property
    def durable(self) -> bool:
        """Whether this is a durable file store (``durable=True``)."""
        return self._native.durable

    def commit(self) -> None:
        """Returns once every item in this durable store's tables is on disk: a store
        reopened after its process is killed has them. Writers' ``flush()`` does this
        for their own items; ``commit`` is for items inserted with ``Table.insert``.
        Concurrent calls share one commit (see ``reprise.file_store``)."""
        self._check_open()
        if not self.durable:
            raise InvalidArgument("commit() is for durable file stores (rp.Store(..., backing='file', durable=True)): "
                                  f"this store is {'a file store without durable' if self._file else 'in memory'}")
        self._native.commit()

    def commits(self) -> dict:
        """A durable store's commits so far: ``{"commits", "seconds", "last_seconds"}``
        (time spent in them, and in the newest)."""
        n, seconds, last = self._native.commit_stats()
        return {"commits": n, "seconds": seconds, "last_seconds": last}

    @property
    def tables(self) -> dict:
        """``{name: Table}`` of the tables over this store that are alive."""
        return dict(self._tables)

    @property
    def compressed_fields(self) -> frozenset:
        """Names of the fields stored compressed (``Field(compress="zstd")``)."""
        return self._compressed

    def memory(self) -> dict:
        """What the columns take: ``raw_bytes`` (uncompressed, at full capacity),
        ``stored_bytes`` (what their file takes now: pages written and not given
        back), and per compressed field ``{blocks, raw_bytes, stored_bytes, ratio}``
        over its blocks compressed so far (the open blocks are raw)."""
        self._check_open()
        raw, stored = self._native.memory_bytes()
        fields = {}
        for name, (blocks, raw_b, packed) in sorted(self._native.compression().items()):
            fields[name] = {"blocks": blocks, "raw_bytes": raw_b, "stored_bytes": packed,
                            "ratio": raw_b / packed if packed else None}
        return {"raw_bytes": raw, "stored_bytes": stored, "fields": fields}

    @property
    def huge_page_bytes(self) -> int:
        """Bytes of the columns this process reaches through huge pages now (from
        /proc/self/smaps; pages not yet written count for nothing)."""
        return self._native.huge_page_bytes

    @property
    def closed(self) -> bool:
        return self._closed

    def writer(self, max_sequence_length: int | None = None):
        """A new ``Writer``. With ``max_sequence_length`` it keeps only that many
        recent steps of an episode referenced (items can be at most that long);
        without it, the whole current episode."""
        self._check_open()
        msl = None if max_sequence_length is None else as_int("max_sequence_length", max_sequence_length, 1)
        native = _native.Writer.in_process(self._native, msl)
        if self._device_columns is not None:
            from .torch.device_store import DeviceWriter
            return DeviceWriter(native, self, msl)
        return native

    def _columns_for(self, device):
        """The columns as tensors on ``device`` (a resolved torch.device): the device
        store's own, or the shared memory registered for that device (once)."""
        if self._device_columns is not None:
            if device != self._device:
                raise InvalidArgument(f"this store keeps its data on {self._device}; sample it to that device or to the host")
            return self._device_columns
        if self._staged:
            raise InvalidArgument(f"a device cannot gather this store's rows in place: {self._staged}")
        views = self._host_views.get(device)
        if views is None:
            self._check_open()
            from .torch.columns import HostColumns
            views = HostColumns(self._native.memory(), self._native.column_layout(), self._signature,
                                self._native.capacity, device, owner=self._native)
            self._host_views[device] = views
        return views

    def close(self):
        """Removes the shared-memory file. Tables and writers already over the store
        keep working until they are gone; no new writer or table can be made. A file
        store's file stays: its columns are written back and its tables' indexes saved
        beside them (``Store.open``)."""
        if not self._closed:
            self._closed = True
            if self._host_views:
                from .torch.columns import close_all
                close_all(self._host_views)
            if self._insert_writer is not None:
                self._insert_writer.close()
                self._insert_writer = None
            if self._file is not None:
                # A file store stays: its columns go back to disk and its tables' index
                # is written beside them, for Store.open.
                file, self._file = self._file, None
                file.close(self._native)
            else:
                self._native.unlink()

    def _check_open(self):
        if self._closed:
            raise InvalidArgument("this store is closed")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __reduce__(self):
        """Pickles a copy, through a checkpoint of the tables over it (``reprise.pickling``)."""
        from .pickling import reduce_store
        return reduce_store(self)

    def __repr__(self):
        fields = ", ".join(f"{k}: {v.dtype}{list(v.shape)}" + (f" stack:{v.stack}" if v.stack > 1 else "")
                           + (f" zstd:{v.level}" if v.compress else "") for k, v in self._signature.items())
        return f"Store({{{fields}}}, capacity={self.capacity}, block_steps={self.block_steps})"
