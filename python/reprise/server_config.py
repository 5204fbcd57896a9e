"""``reprise serve --config reprise.toml``: a replay server (`rp.Server`) made from a TOML config.

The config names the stores, the tables over them, the address, the token, TLS and the
checkpoint directory::

    address = "0.0.0.0:7070"            # "127.0.0.1:0" picks a free loopback port
    token = "change-me"                 # or token_file = "...", or $REPRISE_TOKEN; needed off loopback
    checkpoint_dir = "/var/lib/reprise" # restored at start; written on SIGTERM with checkpoint_on_exit
    checkpoint_on_exit = true
    max_message_bytes = 67108864
    max_batch_items = 65536
    metrics_address = "127.0.0.1:9090"  # Prometheus: GET /metrics (with a token, scrapes send it)

    [tls]                               # optional
    cert = "server.pem"
    key = "server.key"

    [[stores]]
    name = "replay"
    capacity = 1_000_000
    block_steps = 64
    fields = { obs = { shape = [4], dtype = "float32" }, action = { dtype = "int64" } }

    [[tables]]
    name = "replay"
    store = "replay"
    sampler = { kind = "Prioritized", priority_exponent = 0.6 }   # or "Uniform", "Fifo", ...
    remover = "Fifo"
    max_size = 500_000
    max_times_sampled = 0
    rate_limiter = { kind = "SampleToInsertRatio", samples_per_insert = 8.0, min_size_to_sample = 1000, error_buffer = 100.0 }

On SIGTERM or SIGINT the server stops accepting calls, lets calls in progress finish
(``--grace`` seconds), writes a checkpoint when ``checkpoint_on_exit`` is set, and exits 0.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading

from . import rate_limiters, selectors
from .errors import InvalidArgument, RepriseError
from .server import Server
from .signature import Field
from .store import Store
from .table import Table

_SELECTORS = {"Fifo": selectors.Fifo, "Lifo": selectors.Lifo, "Uniform": selectors.Uniform,
              "MaxHeap": selectors.MaxHeap, "MinHeap": selectors.MinHeap, "Prioritized": selectors.Prioritized,
              "TopK": selectors.TopK}
_LIMITERS = {"MinSize": rate_limiters.MinSize, "SampleToInsertRatio": rate_limiters.SampleToInsertRatio,
             "Queue": rate_limiters.Queue, "Stack": rate_limiters.Stack, "RateLimiter": rate_limiters.RateLimiter}
_TOP = {"address", "token", "token_file", "checkpoint_dir", "checkpoint_on_exit", "max_message_bytes",
        "max_batch_items", "name", "tls", "stores", "tables", "metrics_address"}


def _kind(where: str, spec, known: dict):
    """``"Name"`` or ``{kind = "Name", arg = ...}`` -> ``known[Name](**args)``."""
    if isinstance(spec, str):
        spec = {"kind": spec}
    if not isinstance(spec, dict) or "kind" not in spec:
        raise InvalidArgument(f"{where}: expected a name or a table with 'kind', got {spec!r}")
    args = dict(spec)
    kind = args.pop("kind")
    if kind not in known:
        raise InvalidArgument(f"{where}: unknown kind {kind!r}; expected one of {sorted(known)}")
    try:
        return known[kind](**args)
    except TypeError as e:
        raise InvalidArgument(f"{where}: {kind}: {e}") from None


def load_config(path: str) -> dict:
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib
    try:
        with open(path, "rb") as f:
            config = tomllib.load(f)
    except OSError as e:
        raise InvalidArgument(f"config {path!r}: cannot read it ({e.strerror})") from None
    except tomllib.TOMLDecodeError as e:
        raise InvalidArgument(f"config {path!r}: not valid TOML ({e})") from None
    unknown = sorted(set(config) - _TOP)
    if unknown:
        raise InvalidArgument(f"config {path!r}: unknown keys {unknown}; expected some of {sorted(_TOP)}")
    return config


def build(config: dict, directory: str = ".") -> tuple[list[Store], list[Table]]:
    """The stores and tables a config describes (relative paths are from ``directory``)."""
    stores: dict[str, Store] = {}
    tables: list[Table] = []
    try:
        for i, s in enumerate(config.get("stores") or []):
            where = f"stores[{i}]"
            name = s.get("name", f"store{i}")
            fields = s.get("fields")
            if not isinstance(fields, dict) or not fields:
                raise InvalidArgument(f"{where} ({name}): 'fields' must be a non-empty table of name = {{shape, dtype}}")
            signature = {}
            for fname, f in fields.items():
                if not isinstance(f, dict):
                    raise InvalidArgument(f"{where}.fields.{fname}: expected {{shape = [...], dtype = \"...\"}}, got {f!r}")
                signature[fname] = Field(tuple(f.get("shape", ())), f.get("dtype", "float32"))
            if "capacity" not in s:
                raise InvalidArgument(f"{where} ({name}): 'capacity' (steps) is required")
            stores[name] = Store(signature, capacity=s["capacity"], block_steps=s.get("block_steps", 64))
        if not config.get("tables"):
            raise InvalidArgument("config: no [[tables]]; a server needs at least one table")
        for i, t in enumerate(config["tables"]):
            where = f"tables[{i}]"
            store = stores.get(t.get("store"))
            if store is None:
                raise InvalidArgument(f"{where}: store {t.get('store')!r} is not one of the [[stores]] {sorted(stores)}")
            kwargs = {}
            if "sampler" in t:
                kwargs["sampler"] = _kind(f"{where}.sampler", t["sampler"], _SELECTORS)
            if "remover" in t:
                kwargs["remover"] = _kind(f"{where}.remover", t["remover"], _SELECTORS)
            if "rate_limiter" in t:
                kwargs["rate_limiter"] = _kind(f"{where}.rate_limiter", t["rate_limiter"], _LIMITERS)
            for key in ("max_size", "max_times_sampled", "seed", "evict_when_store_full"):
                if key in t:
                    kwargs[key] = t[key]
            tables.append(Table(t.get("name", f"table{i}"), store, **kwargs))
    except BaseException:
        for s in stores.values():
            s.close()
        raise
    return list(stores.values()), tables


def _token(config: dict, directory: str) -> str | None:
    if "token" in config:
        return str(config["token"])
    if "token_file" in config:
        path = os.path.join(directory, config["token_file"])
        try:
            with open(path) as f:
                return f.read().strip()
        except OSError as e:
            raise InvalidArgument(f"token_file {path!r}: cannot read it ({e.strerror})") from None
    return os.environ.get("REPRISE_TOKEN") or None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="reprise serve", description="Serve replay tables over gRPC (and locally).")
    p.add_argument("--config", required=True, help="a TOML file: stores, tables, address, token, TLS, checkpoint_dir")
    p.add_argument("--address", help="overrides the config's address")
    p.add_argument("--grace", type=float, default=10.0, help="seconds calls in progress get at shutdown")
    a = p.parse_args(argv)
    stores: list[Store] = []
    try:
        config = load_config(a.config)
        directory = os.path.dirname(os.path.abspath(a.config))
        stores, tables = build(config, directory)
        tls = config.get("tls") or {}
        path = lambda v: None if v is None else os.path.join(directory, v)  # noqa: E731
        ckpt = path(config.get("checkpoint_dir"))
        server = Server(tables, address=a.address or config.get("address", "127.0.0.1:7070"), token=_token(config, directory),
                        checkpoint_dir=ckpt, name=config.get("name"), tls_cert=path(tls.get("cert")),
                        tls_key=path(tls.get("key")), max_message_bytes=config.get("max_message_bytes", 64 << 20),
                        max_batch_items=config.get("max_batch_items", 1 << 16),
                        metrics_address=config.get("metrics_address"))
    except RepriseError as e:
        for s in stores:
            s.close()
        print(f"reprise serve: {e}", file=sys.stderr)
        return 2
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    restored = f" (restored {server.restored_from})" if server.restored_from else ""
    metrics = f", metrics at http://{server.metrics_address}/metrics" if server.metrics_address else ""
    print(f"reprise serve: tables {[t.name for t in server.tables]} at {server.address} "
          f"(local: {server.local_address}{metrics}){restored}", flush=True)
    while not stop.wait(0.5):
        pass
    print("reprise serve: stopping", flush=True)
    server.stop(grace=a.grace)
    if ckpt is not None and config.get("checkpoint_on_exit", False):
        print(f"reprise serve: checkpoint {server.checkpoint()}", flush=True)
    for s in {id(t.store): t.store for t in server.tables}.values():
        s.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
