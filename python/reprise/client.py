"""Clients of a replay server on the same host."""

from __future__ import annotations

from . import _native
from ._convert import as_int
from .errors import InvalidArgument
from .sample import Sample


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
        if device not in (None, "cpu"):
            raise InvalidArgument(f"device {device!r} is not available in this build; use 'cpu' or None")
        return self._native.sample(table, as_int("n", n), timeout, fields)

    def update_priorities(self, table: str, keys, priorities) -> int:
        """Sets priorities by key; keys no longer present are skipped. Returns how many applied."""
        return self._native.update_priorities(table, keys, priorities)

    def delete(self, table: str, keys) -> int:
        """Removes items by key; keys no longer present are skipped. Returns how many."""
        return self._native.delete(table, keys)

    def reset(self, table: str):
        self._native.reset(table)

    def info(self) -> dict:
        """``{table name: table.info()}``."""
        return self._native.info()

    def close(self):
        """Closes this client's connection; writers it made keep theirs until closed."""
        self._native.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __repr__(self):
        return f"Client({self._address!r}, tables={self.tables})"
