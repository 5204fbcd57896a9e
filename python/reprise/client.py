"""Clients of a replay server on the same host."""

from __future__ import annotations

from . import _native
from ._convert import as_int
from .errors import InvalidArgument, NotFound
from .sample import Sample
from .signature import Field
from .torch._device import is_host_device


class Client:
    """A connection to ``rp.Server(...).local_address`` from any process of this user
    on the same host. Tables are named by string; samples are the same ``Sample`` as
    ``Table.sample`` gives, their rows read in place from shared memory.

    Thread-safe; each writer has its own connection. A client whose server died gets
    ``RepriseError`` ("connection to the replay server lost") on its next call.
    """

    def __init__(self, address: str, token: str | None = None):
        if token is not None:
            raise InvalidArgument("token: remote (gRPC) clients are not available in this build; "
                                  "local clients are authenticated by the socket's permissions")
        self._address = address
        self._native = _native.Client(address)
        self._host_views: dict = {}

    @property
    def address(self) -> str:
        return self._address

    @property
    def tables(self) -> list[str]:
        return self._native.table_names()

    def writer(self, table: str | None = None, max_sequence_length: int | None = None):
        """A ``Writer`` into the store of ``table`` (default: the server's first table).

        ``append``/``extend`` write in place; ``create_item(table_name, num_steps,
        priority)`` queues the item (returns None) and sends items in batches;
        ``flush()``, ``end_episode()``... as in process. ``close()`` (or leaving a
        ``with`` block) commits what is queued."""
        if max_sequence_length is not None:
            max_sequence_length = as_int("max_sequence_length", max_sequence_length, 1)
        return self._native.writer(table, max_sequence_length)

    def sample(self, table: str, n: int, timeout: float | None = None, fields: list[str] | None = None,
               device: str | None = None) -> Sample:
        """Draws n items from ``table`` (as ``Table.sample``)."""
        n = as_int("n", n)
        if is_host_device(device):
            return self._native.sample(table, n, timeout, fields)
        from .torch import resolve
        from .torch.collect import collect_rows
        dev = resolve(device)
        columns = self._columns_for(table, dev)
        if fields is not None:
            for f in fields:
                if f not in columns.fields:
                    raise NotFound(f"unknown field '{f}'; expected one of {columns.fields}")
        try:
            rows = self._native.sample_rows(table, n, timeout)
        except BaseException as e:
            partial = getattr(e, "partial", None)
            if isinstance(partial, _native.SampleRows):
                e.partial = collect_rows(partial, columns, fields)
            raise
        return collect_rows(rows, columns, fields)

    def _columns_for(self, table: str, device):
        """The server's shared-memory columns of ``table``'s store, registered for
        ``device`` once per store."""
        (address, nbytes), layout, capacity, fields = self._native.store_memory(table)
        key = (address, device)
        views = self._host_views.get(key)
        if views is None:
            from .torch.columns import HostColumns
            signature = {name: Field(tuple(shape), dtype) for name, shape, dtype in fields}
            views = HostColumns((address, nbytes), layout, signature, capacity, device, owner=self._native)
            self._host_views[key] = views
        return views

    def update_priorities(self, table: str, keys, priorities) -> int:
        """Sets priorities by key; keys no longer present are skipped. Returns how many applied."""
        return self._native.update_priorities(table, keys, priorities)

    def delete(self, table: str, keys) -> int:
        """Removes items by key; keys no longer present are skipped. Returns how many."""
        return self._native.delete(table, keys)

    def reset(self, table: str):
        self._native.reset(table)

    def checkpoint(self) -> str:
        """Asks the server to write a checkpoint of its tables into its
        ``checkpoint_dir`` (online: clients keep working); returns its path.
        ``InvalidArgument`` when the server has no checkpoint_dir."""
        return self._native.checkpoint()

    def info(self) -> dict:
        """``{table name: table.info()}``."""
        return self._native.info()

    def close(self):
        """Closes this client's connection; writers it made keep theirs until closed."""
        if self._host_views:
            from .torch.columns import close_all
            close_all(self._host_views)
        self._native.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __repr__(self):
        return f"Client({self._address!r}, tables={self.tables})"
