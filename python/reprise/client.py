"""Clients of a replay server: local (same host, shared memory) or remote (gRPC)."""

from __future__ import annotations

import functools
import os

from . import _native
from ._convert import as_int
from .errors import InvalidArgument, NotFound
from .sample import Sample
from .signature import Field
from .torch._device import host_tensors, is_host_device, on_device, torch_module


# compression= -> whether messages are zstd-compressed ("auto": only off loopback).
_COMPRESSION = {"zstd": True, "none": False}


class Client:
    """A connection to a replay server.

    ``Client(server.local_address)`` (``unix:///...``): any process of this user on the
    same host; steps are written and samples read in place in shared memory.
    ``Client("host:port", token=...)``: a remote server (``rp.Server(address=...)`` or
    ``reprise serve``) over gRPC; ``tls=True`` (and ``tls_ca``, a PEM file, for a private
    CA) for TLS. Both have the same API: tables are named by string, samples are the same
    ``Sample`` as ``Table.sample`` gives.

    ``compression`` (remote clients): ``"zstd"`` compresses every message both ways,
    ``"none"`` never; ``"auto"`` (the default) compresses when the address is not
    loopback. The server answers in kind. Samples of any size work: a batch larger than
    one message arrives in parts.

    Thread-safe; each writer has its own connection (or stream). A client whose server
    died gets ``RepriseError`` ("connection to the replay server lost") on its next call.
    """

    def __init__(self, address: str, token: str | None = None, tls: bool = False, tls_ca: str | None = None,
                 tls_domain: str | None = None, connect_timeout: float | None = None, compression: str = "auto"):
        if not isinstance(address, str):
            raise InvalidArgument(f"address must be a str ('unix:///...' or 'host:port'), got {type(address).__name__}")
        self._address = address
        self._host_views: dict = {}
        self._staged_tables: dict = {}
        ca = None
        if tls_ca is not None:
            try:
                with open(os.fspath(tls_ca), "rb") as f:
                    ca = f.read()
            except OSError as e:
                raise InvalidArgument(f"tls_ca {tls_ca!r}: cannot read the CA certificate ({e.strerror})") from None
        if not (isinstance(compression, str) and (compression == "auto" or compression in _COMPRESSION)):
            raise InvalidArgument(f"compression must be 'auto', 'zstd' or 'none', got {compression!r}")
        self._native = _native.Client(address, token, bool(tls), ca, tls_domain, connect_timeout,
                                      _COMPRESSION.get(compression))
        self._local = self._native.is_local

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

    def sample(self, table: str, n: int | None = None, timeout: float | None = None,
               fields: list[str] | None = None, device: str | None = None, tokens: int | None = None) -> Sample:
        """Draws n items from ``table`` (as ``Table.sample``: ``device`` None gives
        numpy arrays, ``"cpu"`` torch CPU tensors, ``"cuda"`` tensors on the GPU).

        ``tokens=B`` instead of ``n``: as many whole items (whole groups) as fit in B
        steps, as ``Table.sample(tokens=...)`` draws them. From a local client the
        rows come packed (``s.packed()`` copies nothing); from a remote one they
        arrive padded and ``s.packed()`` unpads them. ``s.attributes`` holds the
        items' attributes either way."""
        fields = None if fields is None else list(fields)
        if tokens is not None:
            if n is not None:
                raise InvalidArgument(f"sample from '{table}' takes n or tokens, not both (got n={n}, tokens={tokens})")
            tokens = as_int("tokens", tokens, 1)
            if device is not None:
                torch_module()
            s = self._native.sample(table, 1, timeout, fields, tokens)
            return s if device is None else s.to(device)
        if n is None:
            raise InvalidArgument(f"sample from '{table}' needs n (items) or tokens (a step budget)")
        n = as_int("n", n)
        if is_host_device(device):
            draw = functools.partial(self._native.sample, table, n, timeout, fields)
            return draw() if device is None else host_tensors(draw)
        from .torch import resolve
        dev = resolve(device)
        if not self._local or self._staged(table):
            # Remote rows arrive on the host; compressed and stacked ones are assembled
            # there, and a file store's read there.
            return on_device(functools.partial(self._native.sample, table, n, timeout, fields), dev)
        # Local: the GPU gathers the rows straight from the shared-memory store.
        from .torch.collect import collect_rows
        columns = self._columns_for(table, dev)
        if fields is not None:
            for f in fields:
                if f not in columns.fields:
                    raise NotFound(f"unknown field '{f}'; expected one of {columns.fields}")
        schema = self._native.attributes(table)
        try:
            rows = self._native.sample_rows(table, n, timeout)
        except BaseException as e:
            partial = getattr(e, "partial", None)
            if isinstance(partial, _native.SampleRows):
                e.partial = collect_rows(partial, columns, fields, schema=schema)
            raise
        return collect_rows(rows, columns, fields, schema=schema)

    def iterate(self, table: str, batch_size: int, max_in_flight: int = 2, timeout: float | None = None,
                fields: list[str] | None = None, num_batches: int | None = None, device=None):
        """Yields ``sample(table, batch_size, timeout, fields, device)`` results for ever,
        or ``num_batches`` times. A remote client keeps ``max_in_flight`` batch requests
        outstanding on one stream, so the server draws and sends the next batches while
        this one is used (batches already requested were drawn before later priority
        updates). A ``Timeout`` ends the iterator by raising (with its partial)."""
        batch_size = as_int("batch_size", batch_size, 1)
        max_in_flight = as_int("max_in_flight", max_in_flight, 1)
        if num_batches is not None:
            num_batches = as_int("num_batches", num_batches, 0)
        fields = None if fields is None else list(fields)
        host = is_host_device(device)
        if device is None:
            dev = None
        elif host:
            dev = torch_module().device("cpu")
        else:
            from .torch import resolve
            dev = resolve(device)
        count = 0
        if self._local and not host and not self._staged(table):   # the zero-copy GPU path, batch by batch
            while num_batches is None or count < num_batches:
                yield self.sample(table, batch_size, timeout, fields, device)
                count += 1
            return
        sampler = self._native.sampler(table, batch_size, timeout, fields, max_in_flight)
        while num_batches is None or count < num_batches:
            yield sampler.next() if dev is None else on_device(sampler.next, dev)
            count += 1

    def _staged(self, table: str) -> bool:
        """Whether a device cannot gather ``table``'s rows in place: the rule of
        ``Store._staged`` (compressed or stacked fields, or a file store), from what
        the server said of the store. Local clients; once per table."""
        known = self._staged_tables.get(table)
        if known is None:
            _, _, _, fields, _, on_disk = self._native.store_memory(table)
            known = on_disk or any(level is not None or stack > 1 for _, _, _, level, stack, _ in fields)
            self._staged_tables[table] = known
        return known

    def _columns_for(self, table: str, device):
        """The server's shared-memory columns of ``table``'s store, registered for
        ``device`` once per store (local clients)."""
        (address, nbytes), layout, capacity, fields, *_ = self._native.store_memory(table)
        key = (address, device)
        views = self._host_views.get(key)
        if views is None:
            from .torch.columns import HostColumns
            signature = {name: Field(tuple(shape), dtype) for name, shape, dtype, *_ in fields}
            views = HostColumns((address, nbytes), layout, signature, capacity, device, owner=self._native)
            self._host_views[key] = views
        return views

    def update_priorities(self, table: str, keys, priorities) -> int:
        """Sets priorities by key; keys no longer present are skipped. Returns how many applied."""
        return self._native.update_priorities(table, keys, priorities)

    def attributes(self, table: str) -> dict:
        """``{name: dtype}`` of ``table``'s item attributes."""
        return dict(self._native.attributes(table))

    def set_version(self, table: str, version: int) -> int:
        """``table.set_version(version)`` on the server: returns how many items left
        as stale (see ``Table.set_version``)."""
        return self._native.set_version(table, as_int("version", version, minimum=-(1 << 63)))

    def update_attributes(self, table: str, keys, attributes: dict) -> int:
        """``table.update_attributes`` on the server: ``{name: array[len(keys)] or
        scalar}``; keys no longer present are skipped. Every value is checked
        before any is sent. Returns how many items were updated."""
        import numpy as np
        from ._attributes import values
        keys = np.ascontiguousarray(keys, dtype=np.uint64)
        if not isinstance(attributes, dict) or not attributes:
            raise InvalidArgument(f"table '{table}': update_attributes takes {{name: values}}, got {attributes!r}")
        schema = self._native.attributes(table)
        staged = [(name, values(schema, table, name, v, len(keys))) for name, v in attributes.items()]
        if "group" in attributes:
            from ._attributes import check_fixed
            check_fixed(f"table '{table}'", attributes, False, self.info()[table]["groups"] is not None)
        # The version first: under max_staleness the server refuses it before anything changed.
        staged.sort(key=lambda nv: nv[0] != "version")
        return min(self._native.update_attribute(table, keys, name, v) for name, v in staged)

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

    def snapshot(self) -> dict:
        """What the server is doing, read now: the dashboard's data.

        ``{"version", "time" (unix seconds), "uptime_seconds", "server": {"name",
        "address"}, "tables": [info() of each table plus "stats": its stats()],
        "clients": [{"id", "kind" ("local"/"remote"), "peer", "connected_seconds",
        "inserts": {table: n}, "samples": {table: n}}], "bytes": {"received", "sent"}}``
        (bytes: step data through the remote service). See docs/observability.md."""
        return _parse_snapshot(self._native.snapshot_json())

    def stats(self) -> dict:
        """``{table name: table.stats()}``: what each served table's extensions report."""
        return {t["name"]: t["stats"] for t in self.snapshot()["tables"]}

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


def _parse_snapshot(text: str) -> dict:
    """A snapshot's JSON text as a dict; unbounded rate-limiter limits (JSON null)
    become the infinities ``info()`` reports."""
    import json
    snap = json.loads(text)
    for t in snap.get("tables", []):
        limiter = t.get("rate_limiter", {})
        for key, inf in (("min_diff", float("-inf")), ("max_diff", float("inf"))):
            if key in limiter and limiter[key] is None:
                limiter[key] = inf
    return snap
