"""Serving tables to other processes: local clients (same host) and, with an
address, remote clients (gRPC).

Local clients write step data straight into the stores' shared memory, in place;
only small control records (block leases, item commits, sample selections,
priority updates) cross the server's Unix socket. Remote clients stream steps and
samples over gRPC."""

from __future__ import annotations

import os
import urllib.parse
import weakref

from collections.abc import Sequence

from . import _native
from ._convert import as_int
from .errors import InvalidArgument
from .table import Table


class Server:
    """Serves ``tables`` to clients on this host at ``local_address``.

    The server runs in this process, on threads, over the same tables: the owner
    can keep using them directly. ``name`` (letters, digits, ``-_.``) names the
    socket; starting a second live server under the same name fails, and the
    leftovers of a dead one are cleaned up. A client that dies (even by SIGKILL)
    leaves no partial item, and the blocks it held return to the store.

    ``checkpoint_dir``: ``checkpoint()`` writes there, and at start the newest valid
    checkpoint in it (if any) is loaded: its tables replace the given tables of the
    same names, which must be empty (``server.tables`` lists what is served). Tables
    over file stores are left as they are: their stores keep them (``Store.open``).
    ``address`` (``"host:port"``; port 0 picks a free one, see ``server.address``) also
    serves the tables over gRPC to remote ``rp.Client("host:port", token=...)``. A
    ``token`` is required unless the address is loopback, and is then checked on every
    call. ``tls_cert``/``tls_key`` (PEM files) serve TLS. ``max_message_bytes`` bounds
    every request and response, ``max_batch_items`` one sample. ``metrics_address``
    (``"host:port"``) serves Prometheus metrics at ``http://<metrics_address>/metrics``
    (with a ``token``, every scrape must send it as a bearer token; off loopback the
    metrics endpoint needs a token).

    ``dashboard_address`` (``"host:port"``) serves the live dashboard at
    ``http://<dashboard_address>/``: tables, rates, rate-limiter blocking, priority and
    sampled-age histograms, bytes, connected clients (``server.dashboard_url``). Its
    data endpoints (``/api/snapshot``, ``/api/events``) follow the metrics rule: with a
    ``token`` they need it (the page asks for it, or takes it from the link
    ``server.dashboard_link``), and off loopback a token is required. It works with or
    without ``address``: local clients are shown too.

    Limits of the remote service (docs/remote.md, "Limits"): at most ``max_connections``
    open connections, ``max_connections_per_peer`` from one IP address (more are closed
    as they arrive, and logged); a connection with no call in progress for
    ``idle_timeout`` seconds is closed (clients reconnect on their next call); one whose
    client has not read what the server sends (a sample stream it stopped consuming) for
    ``stall_timeout`` seconds is closed, releasing the rows it held; HTTP/2 pings every
    ``keepalive`` seconds close half-open connections; wrong or missing tokens are logged
    per IP address, at most ``auth_failures_per_minute`` lines a minute each (later ones
    are refused saying so; the right token is always accepted). None turns a timeout off.
    """

    def __init__(self, tables: Sequence[Table], address: str | None = None, token: str | None = None,
                 checkpoint_dir: str | None = None, name: str | None = None, tls_cert: str | None = None,
                 tls_key: str | None = None, max_message_bytes: int = 64 << 20, max_batch_items: int = 1 << 16,
                 metrics_address: str | None = None, dashboard_address: str | None = None,
                 max_connections: int = 1024, max_connections_per_peer: int = 128,
                 idle_timeout: float | None = 600.0, stall_timeout: float | None = 120.0,
                 keepalive: float | None = 30.0, auth_failures_per_minute: int = 20):
        if isinstance(tables, Table):
            tables = [tables]
        tables = list(tables)
        if not tables or not all(isinstance(t, Table) for t in tables):
            raise InvalidArgument(f"tables must be a non-empty list of reprise.Table, got {tables!r}")
        if address is None and (tls_cert is not None or tls_key is not None or metrics_address is not None
                                or (token is not None and dashboard_address is None)):
            raise InvalidArgument("token, tls_cert/tls_key and metrics_address are for the remote service "
                                  "(a token also guards dashboard_address): pass address='host:port' too")
        if (tls_cert is None) != (tls_key is None):
            raise InvalidArgument("TLS needs both tls_cert and tls_key (PEM files)")
        tls = None
        if tls_cert is not None:
            tls = []
            for what, path in (("tls_cert", tls_cert), ("tls_key", tls_key)):
                try:
                    with open(os.fspath(path), "rb") as f:
                        tls.append(f.read())
                except OSError as e:
                    raise InvalidArgument(f"{what} {path!r}: cannot read it ({e.strerror})") from None
        self._checkpoint_dir = None if checkpoint_dir is None else os.fspath(checkpoint_dir)
        self.restored_from = None
        if self._checkpoint_dir is not None:
            from . import checkpoint
            found = checkpoint.latest(self._checkpoint_dir)
            # Tables over file stores come back with their stores (Store.open), not from here.
            restorable = [t for t in tables if t.store.backing != "file"]
            if found is not None:
                for t in restorable:
                    if len(t):
                        raise InvalidArgument(
                            f"checkpoint_dir {self._checkpoint_dir!r} holds a checkpoint to restore, but table "
                            f"'{t.name}' is not empty: pass empty tables (or another directory)"
                        )
                loaded = checkpoint.load(found, **_placement(tables))
                try:
                    for t in restorable:
                        got = loaded.get(t.name)
                        if got is None:
                            continue
                        for what, mine, saved in (("signature", t.store.signature, got.store.signature),
                                                  ("capacity", t.store.capacity, got.store.capacity),
                                                  ("block_steps", t.store.block_steps, got.store.block_steps)):
                            if mine != saved:
                                raise InvalidArgument(
                                    f"checkpoint {found}: table '{t.name}' was saved from a store with {what} "
                                    f"{saved!r}, but the given table's store has {mine!r}; restore onto a matching store"
                                )
                except InvalidArgument:
                    for s in {id(x.store): x.store for x in loaded.values()}.values():
                        s.close()
                    raise
                replaced = {t.name for t in restorable if t.name in loaded}
                tables = [loaded[t.name] if t.name in replaced else t for t in tables]
                self.restored_from = found if replaced else None
        for t in tables:
            if t.store._device_columns is not None:
                raise InvalidArgument(
                    f"table '{t.name}' is over a device store ({t.store.device}): its data lives in this "
                    "process's GPU memory, which other processes cannot map; serve a host store"
                )
            if t._selection is not None:
                raise InvalidArgument(
                    f"table '{t.name}' selects on a device (selection_device): sample it in this process"
                )
        self._tables = tables
        me = weakref.ref(self)

        def checkpointer():  # a client's checkpoint(), run on its connection's thread
            server = me()
            if server is None:
                raise InvalidArgument("the server is gone")
            return server.checkpoint()

        checkpoint = None if self._checkpoint_dir is None else checkpointer
        limits = {"max_connections": as_int("max_connections", max_connections, 1),
                  "max_connections_per_peer": as_int("max_connections_per_peer", max_connections_per_peer, 1),
                  "auth_failures_per_minute": as_int("auth_failures_per_minute", auth_failures_per_minute, 1)}
        for key, value in (("idle_timeout", idle_timeout), ("stall_timeout", stall_timeout), ("keepalive", keepalive)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 1):
                raise InvalidArgument(f"{key} must be None (off) or seconds >= 1, got {value!r}")
            limits[key] = None if value is None else float(value)
        if dashboard_address is not None and not isinstance(dashboard_address, str):
            raise InvalidArgument(f"dashboard_address must be 'host:port', got {dashboard_address!r}")
        self._monitor = _native.Monitor([t._native for t in tables])
        self._native = _native.LocalServer([t._native for t in tables], name, checkpoint, self._monitor)
        self._remote = None
        self._dashboard = None
        self._dashboard_token = token   # for dashboard_link
        try:
            if address is not None:
                self._remote = _native.RemoteServer([t._native for t in tables], address, token,
                                                    None if tls is None else tls[0], None if tls is None else tls[1],
                                                    as_int("max_message_bytes", max_message_bytes, 4096),
                                                    as_int("max_batch_items", max_batch_items, 1), 64, checkpoint,
                                                    metrics_address, self._monitor, limits)
            if dashboard_address is not None:
                from . import dashboard
                files = os.path.dirname(os.path.abspath(dashboard.__file__))
                self._dashboard = _native.Dashboard(self._monitor, dashboard_address, token, files)
        except BaseException:
            if self._remote is not None:
                self._remote.stop(0.0)
            self._native.stop()
            raise

    @property
    def local_address(self) -> str:
        """``unix:///...``: what ``rp.Client`` takes, for processes on this host."""
        return self._native.local_address

    @property
    def address(self) -> str | None:
        """``host:port`` of the remote (gRPC) service (the port chosen when 0 was
        given); None without ``address=``."""
        return None if self._remote is None else self._remote.address

    @property
    def metrics_address(self) -> str | None:
        """``host:port`` of the Prometheus endpoint (``GET /metrics``), or None."""
        return None if self._remote is None else self._remote.metrics_address

    @property
    def dashboard_address(self) -> str | None:
        """``host:port`` of the live dashboard, or None."""
        return None if self._dashboard is None else self._dashboard.address

    @property
    def dashboard_url(self) -> str | None:
        """``http://host:port/``: the dashboard page, or None. It holds no secret (safe to
        log); on a server with a token the page asks for it: ``dashboard_link`` carries it."""
        a = self.dashboard_address
        return None if a is None else f"http://{a}/"

    @property
    def dashboard_link(self) -> str | None:
        """``dashboard_url`` with the token in its fragment (``http://host:port/#token=...``)
        when the server has one, so that the page opens without asking; else
        ``dashboard_url``. The fragment stays in the browser (it is not sent to the server,
        so no access log holds it, and the page removes it from the address bar), but the link
        is the token: show it only where the token may be seen."""
        url = self.dashboard_url
        if url is None or self._dashboard_token is None:
            return url
        return f"{url}#token={urllib.parse.quote(self._dashboard_token, safe='')}"

    def snapshot(self) -> dict:
        """What the dashboard shows, read now (``Client.snapshot`` has the format)."""
        from .client import _parse_snapshot
        return _parse_snapshot(self._monitor.snapshot_json())

    @property
    def name(self) -> str:
        return self._native.name

    @property
    def tables(self) -> list[Table]:
        return list(self._tables)

    def checkpoint(self, compression: str | None = None) -> str:
        """Writes a checkpoint of the served tables into ``checkpoint_dir`` (online:
        clients keep inserting and sampling). Returns its path."""
        if self._checkpoint_dir is None:
            raise InvalidArgument("this server has no checkpoint_dir: pass checkpoint_dir= to rp.Server")
        from . import checkpoint
        return checkpoint.save(self._checkpoint_dir, self._tables, compression=compression)

    def stop(self, grace: float = 5.0):
        """Stops the remote service (calls in progress get up to ``grace`` seconds to
        finish; blocked waits give up), then closes every local client connection
        (releasing what they held) and removes the socket."""
        if self._dashboard is not None:
            self._dashboard.stop()
        if self._remote is not None:
            self._remote.stop(grace)
        self._native.stop()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
        return False

    def __repr__(self):
        remote = "" if self._remote is None else f", address={self.address!r}"
        return f"Server({self.name!r}, local_address={self.local_address!r}{remote}, tables={[t.name for t in self._tables]})"


def _placement(tables) -> dict:
    """Where a restored checkpoint's host stores go: the directory and huge pages of
    the given tables' stores, when they all agree (the usual one store); otherwise
    the defaults, said on the ``reprise`` logger."""
    places = {(os.path.dirname(t.store.path), t.store.huge_pages)
              for t in tables if t.store._device_columns is None}
    if len(places) == 1:
        directory, huge = places.pop()
        return {"directory": directory, "huge_pages": huge}
    if places:
        import logging
        logging.getLogger("reprise").warning(
            "the served tables' stores differ in directory or huge pages (%s): the checkpoint's stores "
            "are restored to /dev/shm on small pages", sorted(places))
    return {}
