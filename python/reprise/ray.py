"""Reprise inside a Ray job (``pip install 'reprise[ray]'``).

The LLM-RL frameworks (verl, OpenRLHF, slime, NeMo RL, ROLL) run on Ray. This module puts a
Reprise server in a Ray actor on a chosen node and hands its addresses to the job's other
actors and tasks; the data never goes through Ray's object store:

    import reprise as rp
    import reprise.ray                                      # imports ray (the rest of reprise never does)

    def make_tables():                                      # runs inside the server's actor
        store = rp.Store({"token": rp.Field((), "int32")}, capacity=1 << 20)
        return [rp.Table("rollouts", store, max_size=10_000)]

    server = rp.ray.serve(make_tables, node_id=None)        # or node_id=..., or scheduling_strategy=PG
    info = server.info                                      # picklable: pass it to actors and tasks
    client = info.client()                                  # in any actor or task

``info.client()`` connects through the server's Unix socket and shared memory
(``local_address``) when the caller runs on the server's node, and over gRPC (``address``,
with the server's token) from any other node. ``serve_per_node`` starts one server on each
alive node. The actor's death stops its server (its process ends); ``max_restarts`` with a
``checkpoint_dir`` restarts it from its newest checkpoint, as ``reprise serve`` restores one,
and ``server.refresh()`` then gives the new addresses. Shared memory and sockets of a killed
server are removed by the next Reprise store or server made on that node (processes that
are gone own them).
"""

from __future__ import annotations

import secrets

from dataclasses import dataclass

import ray

from .client import Client
from .errors import InvalidArgument

__all__ = ["ReplayServer", "ServerInfo", "serve", "serve_per_node"]


@dataclass(frozen=True)
class ServerInfo:
    """Where a served Reprise server is: picklable, for the job's actors and tasks."""

    node_id: str
    node_ip: str
    address: str           # host:port, reachable from every node (gRPC, token required)
    local_address: str     # unix:///..., for processes on node_id (shared memory)
    token: str
    dashboard_url: str | None = None   # with dashboard_address=, on node_ip

    def on_this_node(self) -> bool:
        """Whether the caller (a driver, actor or task) runs on the server's node."""
        return ray.get_runtime_context().get_node_id() == self.node_id

    def client(self, **kwargs) -> Client:
        """A ``reprise.Client`` of the server: the local path on its node, gRPC elsewhere."""
        if self.on_this_node():
            return Client(self.local_address, **kwargs)
        return Client(self.address, token=self.token, **kwargs)


class _ServerActor:
    """The actor that owns the stores, the tables and the server."""

    def __init__(self, make_tables, port: int, token: str, checkpoint_dir, server_kwargs: dict):
        from .server import Server
        tables = make_tables()
        self.tables = list(tables)
        self.server = Server(self.tables, address=f"0.0.0.0:{port}", token=token, checkpoint_dir=checkpoint_dir,
                             **server_kwargs)
        ip = ray.util.get_node_ip_address()
        bound = self.server.address.rsplit(":", 1)[1]
        self._info = ServerInfo(node_id=ray.get_runtime_context().get_node_id(), node_ip=ip,
                                address=f"{ip}:{bound}", local_address=self.server.local_address, token=token,
                                dashboard_url=self.server.dashboard_url)

    def info(self) -> ServerInfo:
        return self._info

    def checkpoint(self) -> str:
        return self.server.checkpoint()

    def restored_from(self):
        return self.server.restored_from

    def pid(self) -> int:
        import os
        return os.getpid()

    def stop(self) -> None:
        """Stops the server and closes the stores (their shared memory is removed): those
        ``make_tables`` made and those a restore loaded in their place."""
        self.server.stop()
        for s in {id(t.store): t.store for t in self.tables + self.server.tables}.values():
            s.close()


class ReplayServer:
    """The driver's handle of a served Reprise server: ``info`` (``ServerInfo``),
    ``checkpoint()``, ``refresh()`` after a restart, ``stop()``."""

    def __init__(self, actor, info: ServerInfo):
        self.actor, self.info = actor, info

    def refresh(self, timeout: float = 60.0) -> ServerInfo:
        """The server's addresses now: a restarted actor binds anew. Waits (up to
        ``timeout``) while Ray restarts the actor."""
        import time
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.info = ray.get(self.actor.info.remote(), timeout=max(0.1, deadline - time.monotonic()))
                return self.info
            except (ray.exceptions.ActorUnavailableError, ray.exceptions.GetTimeoutError):
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.2)

    def checkpoint(self, timeout: float = 300.0) -> str:
        """A checkpoint of every table now (needs ``checkpoint_dir``); returns its path."""
        return ray.get(self.actor.checkpoint.remote(), timeout=timeout)

    def stop(self, timeout: float = 60.0) -> None:
        """Stops the server, closes its stores and ends the actor."""
        try:
            ray.get(self.actor.stop.remote(), timeout=timeout)
        finally:
            ray.kill(self.actor, no_restart=True)

    def __repr__(self):
        return f"ReplayServer(node {self.info.node_id[:8]}, {self.info.address}, {self.info.local_address})"


def serve(make_tables, *, node_id: str | None = None, scheduling_strategy=None, port: int = 0,
          token: str | None = None, checkpoint_dir: str | None = None, max_restarts: int = 0, name: str | None = None,
          num_cpus: float = 0, timeout: float = 120.0, **server_kwargs) -> ReplayServer:
    """Starts a Reprise server in a new Ray actor and returns its handle once it serves.

    ``make_tables()`` runs in the actor and returns the tables to serve (their stores live
    in that node's shared memory). ``node_id``: the node to run on (hard affinity; the
    driver's node when None and no ``scheduling_strategy``); ``scheduling_strategy``: any
    Ray strategy instead (a placement group's, for instance). ``port``: the gRPC port
    (0: a free one). ``token``: the bearer token remote clients need (default: a new random
    one, in ``info.token``). ``checkpoint_dir`` and ``max_restarts``: a restarted actor
    restores the newest checkpoint there. ``name``: a Ray actor name (``ray.get_actor``).
    ``server_kwargs`` go to ``reprise.Server`` (``dashboard_address``, limits, TLS)."""
    if not ray.is_initialized():
        raise InvalidArgument("reprise.ray.serve needs a Ray job: call ray.init() first")
    if node_id is not None and scheduling_strategy is not None:
        raise InvalidArgument("give node_id or scheduling_strategy, not both")
    if "address" in server_kwargs:
        raise InvalidArgument("reprise.ray.serve binds 0.0.0.0:port itself; pass port=, not address=")
    if node_id is None and scheduling_strategy is None:
        node_id = ray.get_runtime_context().get_node_id()
    if node_id is not None:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
        scheduling_strategy = NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)
    token = token or secrets.token_urlsafe(24)
    options = dict(num_cpus=num_cpus, max_restarts=max_restarts, scheduling_strategy=scheduling_strategy)
    if name is not None:
        options["name"] = name
    actor = ray.remote(_ServerActor).options(**options).remote(make_tables, port, token, checkpoint_dir,
                                                                 server_kwargs)
    try:
        info = ray.get(actor.info.remote(), timeout=timeout)
    except BaseException:
        ray.kill(actor, no_restart=True)
        raise
    return ReplayServer(actor, info)


def serve_per_node(make_tables, **kwargs) -> list[ReplayServer]:
    """``serve`` on every alive node of the Ray cluster (one server each, in node order)."""
    nodes = [n["NodeID"] for n in ray.nodes() if n.get("Alive")]
    return [serve(make_tables, node_id=n, **kwargs) for n in nodes]
