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
    dashboard_address = "127.0.0.1:8080" # the live page: http://127.0.0.1:8080/ (or --dashboard ADDRESS)
    max_connections = 1024              # open connections; more are closed as they arrive
    max_connections_per_peer = 128      # open connections from one IP address
    idle_timeout_seconds = 600          # close a connection with no call in progress (0: never)
    stall_timeout_seconds = 120         # close a connection that stopped reading its samples (0: never)
    keepalive_seconds = 30              # HTTP/2 pings find half-open connections (0: off)
    auth_failures_per_minute = 20       # wrong tokens logged per IP address and minute

    [tls]                               # optional
    cert = "server.pem"
    key = "server.key"

    [[stores]]
    name = "replay"
    capacity = 1_000_000
    block_steps = 64
    directory = "/dev/shm"              # where the store's shared-memory file lives (the default)
    huge_pages = false                  # true: 2 MiB pages; directory must be hugetlbfs or a huge= tmpfs
    # backing = "file"                  # a file store in directory (on a disk), reopened at the next start
    # durable = true                    # file stores: a writer's flush returns once its items are on disk
    fields = { obs = { shape = [4], dtype = "float32" }, action = { dtype = "int64" } }
    # a field may be stored compressed: frame = { shape = [84, 84], dtype = "uint8", compress = "zstd", level = 3 }
    # and stacked (one frame stored per step, sampled as the last 4): add stack = 4 (and padding = "zero")

    [[tables]]
    name = "replay"
    store = "replay"
    sampler = { kind = "Prioritized", priority_exponent = 0.6 }   # or "Uniform", "Fifo", ...
    remover = "Fifo"
    max_size = 500_000
    max_times_sampled = 0
    rate_limiter = { kind = "SampleToInsertRatio", samples_per_insert = 4.0, min_size_to_sample = 200, error_buffer = 2000.0 }
    extensions = ["PriorityHistogram", { kind = "UniqueSamples", window = 1000 }]   # default: every built-in

Every key at every level is checked: a misspelled or unknown key, or a value of the wrong
kind, stops ``reprise serve`` with exit code 2 and a message naming the file, the key, its
section and the closest valid key. A value the key's kind allows but its store, field or
table refuses is named the same way: ``config 'reprise.toml': stores[0] ('replay').fields.obs:
unknown dtype 'f32': expected one of bool, ...``.

On SIGTERM or SIGINT the server stops accepting calls, lets calls in progress finish
(``--grace`` seconds), writes a checkpoint when ``checkpoint_on_exit`` is set, and exits 0.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import inspect
import os
import signal
import sys
import threading

from . import extensions, rate_limiters, selectors
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
_EXTENSIONS = {c.__name__: c for c in extensions.BUILT_INS}

# What each section may hold: key -> the kind of value expected. Anything else is refused with
# the closest valid key, so a misspelling never runs silently with a default.
_TOP = {"address": "string", "token": "string", "token_file": "string", "checkpoint_dir": "string",
        "checkpoint_on_exit": "boolean", "max_message_bytes": "integer", "max_batch_items": "integer",
        "name": "string", "tls": "table", "stores": "array of tables", "tables": "array of tables",
        "metrics_address": "string", "dashboard_address": "string", "max_connections": "integer",
        "max_connections_per_peer": "integer", "idle_timeout_seconds": "number", "stall_timeout_seconds": "number",
        "keepalive_seconds": "number", "auth_failures_per_minute": "integer"}
_TLS = {"cert": "string", "key": "string"}
_STORE = {"name": "string", "capacity": "integer", "block_steps": "integer", "directory": "string",
          "huge_pages": "boolean", "backing": "string", "durable": "boolean", "fields": "table"}
_FIELD = {"shape": "array of integers", "dtype": "string", "compress": "string", "level": "integer",
          "stack": "integer", "padding": "string"}
_TABLE = {"name": "string", "store": "string", "sampler": "string or table", "remover": "string or table",
          "rate_limiter": "string or table", "max_size": "integer", "max_times_sampled": "integer",
          "seed": "integer", "evict_when_store_full": "boolean", "extensions": "array of names or tables"}
_ANNOTATION = {"int": "integer", "float": "number", "int | None": "integer", "float | None": "number"}


def _limits(config: dict) -> dict:
    """The connection limits of a config as ``Server`` keywords (a timeout of 0 is off)."""
    out = {k: config[k] for k in ("max_connections", "max_connections_per_peer", "auth_failures_per_minute")
           if k in config}
    for key in ("idle_timeout", "stall_timeout", "keepalive"):
        if f"{key}_seconds" in config:
            seconds = config[f"{key}_seconds"]
            if seconds != 0 and not seconds >= 1:
                raise InvalidArgument(f"top level.{key}_seconds: expected 0 (off) or seconds >= 1, got {seconds!r}")
            out[key] = None if seconds == 0 else seconds
    return out


def _is(value, kind: str) -> bool:
    integer = isinstance(value, int) and not isinstance(value, bool)
    return {"string": isinstance(value, str),
            "integer": integer,
            "number": integer or isinstance(value, float),
            "boolean": isinstance(value, bool),
            "table": isinstance(value, dict),
            "array of tables": isinstance(value, list) and all(isinstance(v, dict) for v in value),
            "array of names or tables": isinstance(value, list) and all(isinstance(v, (str, dict)) for v in value),
            "array of strings": isinstance(value, list) and all(isinstance(v, str) for v in value),
            "array of integers": isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool)
                                                                 for v in value),
            "string or table": isinstance(value, (str, dict))}[kind]


def _describe(value) -> str:
    kind = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "an array",
            dict: "a table"}.get(type(value), type(value).__name__)
    return f"{kind} ({value!r})" if not isinstance(value, (dict, list)) else kind


def _check(where: str, section: dict, schema: dict, what: str) -> None:
    """Every key of ``section`` is in ``schema`` with a value of the kind it names."""
    for key, value in section.items():
        if key not in schema:
            close = difflib.get_close_matches(key, list(schema), n=1, cutoff=0.6)
            hint = f"did you mean {close[0]!r}? " if close else ""
            valid = f"{what} keys are {', '.join(schema)}" if schema else f"{what} takes no keys"
            raise InvalidArgument(f"{where}: unknown key {key!r}; {hint}{valid}")
        if not _is(value, schema[key]):
            raise InvalidArgument(f"{where}.{key}: expected {schema[key]}, got {_describe(value)}")


def _where(section: str, i: int, entry: dict) -> str:
    """Where an entry of an array of tables is, as every message names it:
    ``stores[0] ('main')`` (the index alone while it has no string name)."""
    name = entry.get("name")
    return f"{section}[{i}]" + (f" ({name!r})" if isinstance(name, str) else "")


@contextlib.contextmanager
def _at(where: str):
    """A Reprise error raised inside names ``where`` first (a file, a store, a
    field), keeping its type: ``config 'reprise.toml': stores[0] ('main').fields.obs:
    unknown dtype 'f32': expected one of ...``. Without ``where``, as raised."""
    try:
        yield
    except RepriseError as e:
        if not where:
            raise
        raise type(e)(f"{where}: {e}") from None


def _in_file(path: str | None):
    """``_at`` the config file ``path`` (None: a config not read from a file)."""
    return _at(None if path is None else f"config {path!r}")


def _parameters(cls) -> dict:
    """A selector's or rate limiter's keyword arguments -> (kind, required), from its signature."""
    target = cls.__new__ if "__new__" in vars(cls) else cls.__init__
    params = list(inspect.signature(target).parameters.values())[1:]   # past cls / self
    return {p.name: (_ANNOTATION.get(str(p.annotation), "number"), p.default is inspect.Parameter.empty)
            for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}


def _kind(where: str, spec, known: dict):
    """``"Name"`` or ``{kind = "Name", arg = ...}`` -> ``known[Name](**args)``, every argument checked."""
    if isinstance(spec, str):
        spec = {"kind": spec}
    if not isinstance(spec, dict) or "kind" not in spec:
        raise InvalidArgument(f"{where}: expected a name or a table with 'kind', got {_describe(spec)}")
    args = dict(spec)
    kind = args.pop("kind")
    if kind not in known:
        close = difflib.get_close_matches(str(kind), list(known), n=1, cutoff=0.6)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise InvalidArgument(f"{where}: unknown kind {kind!r}; {hint}expected one of {', '.join(known)}")
    params = _parameters(known[kind])
    _check(where, args, {name: k for name, (k, _) in params.items()}, kind)
    missing = [name for name, (_, required) in params.items() if required and name not in args]
    if missing:
        raise InvalidArgument(f"{where}: {kind} needs {', '.join(repr(m) for m in missing)} "
                              f"({kind}'s keys are {', '.join(params)})")
    try:
        return known[kind](**args)
    except InvalidArgument as e:
        raise InvalidArgument(f"{where}: {kind}: {e}") from None


def load_config(path: str, check_config=None) -> dict:
    """The parsed TOML of ``path``, every key at every level checked by ``check_config``
    (``check``: a ``reprise serve`` config)."""
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
    with _in_file(path):
        (check_config or check)(config)
    return config


def check(config: dict) -> None:
    """Refuses unknown keys and values of the wrong kind at every level of a server config:
    the top level, ``[tls]``, ``[[stores]]`` and their fields, ``[[tables]]``. Selector and
    rate-limiter arguments are checked when they are built."""
    _check("top level", config, _TOP, "top-level")
    _check("tls", config.get("tls", {}), _TLS, "[tls]")
    for i, s in enumerate(config.get("stores", [])):
        where = _where("stores", i, s)
        _check(where, s, _STORE, "[[stores]]")
        for fname, f in s.get("fields", {}).items():
            if not isinstance(f, dict):
                raise InvalidArgument(f"{where}.fields.{fname}: expected a table {{shape = [...], dtype = \"...\"}}, "
                                      f"got {_describe(f)}")
            _check(f"{where}.fields.{fname}", f, _FIELD, "field")
    for i, t in enumerate(config.get("tables", [])):
        _check(_where("tables", i, t), t, _TABLE, "[[tables]]")


def build(config: dict, directory: str = ".", path: str | None = None) -> tuple[list[Store], list[Table]]:
    """The stores and tables a config describes (relative paths are from ``directory``).
    Every error names where in the config it is (``stores[0] ('main').fields.obs``),
    after ``path``, the file the config was read from, when given. A config that fails
    leaves no store behind."""
    with _in_file(path):
        check(config)
        stores: dict[str, Store] = {}
        try:
            for i, s in enumerate(config.get("stores") or []):
                name = s.get("name", f"store{i}")
                if name in stores:
                    raise InvalidArgument(f"{_where('stores', i, s)}: a store named {name!r} is already "
                                          f"configured; expected every [[stores]] name once")
                stores[name] = _store(_where("stores", i, s), s, directory)
            if not config.get("tables"):
                raise InvalidArgument("no [[tables]]; a server needs at least one table")
            tables = [_table(_where("tables", i, t), t, i, stores) for i, t in enumerate(config["tables"])]
        except BaseException:
            for s in stores.values():
                s.close()
            raise
    return list(stores.values()), tables


def _store(where: str, s: dict, directory: str) -> Store:
    """The store of a checked ``[[stores]]`` entry; errors name ``where`` and the field."""
    fields = s.get("fields")
    if not fields:
        raise InvalidArgument(f"{where}: 'fields' must be a non-empty table of name = {{shape, dtype}}")
    signature = {}
    for fname, f in fields.items():
        with _at(f"{where}.fields.{fname}"):
            signature[fname] = Field(tuple(f.get("shape", ())), f.get("dtype", "float32"), compress=f.get("compress"),
                                     level=f.get("level"), stack=f.get("stack", 1), padding=f.get("padding", "reset"))
    if "capacity" not in s:
        raise InvalidArgument(f"{where}: 'capacity' (steps) is required")
    store_dir = os.path.join(directory, s["directory"]) if "directory" in s else None
    backing, durable = s.get("backing", "memory"), s.get("durable", False)
    with _at(where):
        if backing == "file" and store_dir is not None and os.path.exists(os.path.join(store_dir, "store.json")):
            return _reopen(store_dir, signature, s, durable)
        return Store(signature, capacity=s["capacity"], block_steps=s.get("block_steps", 64),
                     directory=store_dir, huge_pages=s.get("huge_pages", False), backing=backing, durable=durable)


def _reopen(store_dir: str, signature: dict, s: dict, durable: bool) -> Store:
    """The file store an earlier run left in ``store_dir``, with its tables, checked against its
    ``[[stores]]`` entry."""
    store = Store.open(store_dir)
    want = {"fields": signature, "capacity": s["capacity"], "block_steps": s.get("block_steps", 64), "durable": durable}
    have = {"fields": store.signature, "capacity": store.capacity, "block_steps": store.block_steps,
            "durable": store.durable}
    # Capacity is kept in whole blocks: the config's capacity rounds up to the store's.
    bs = have["block_steps"]
    want["capacity"] = -(-want["capacity"] // bs) * bs if want["block_steps"] == bs else want["capacity"]
    for key in want:
        if want[key] != have[key]:
            store.close()
            raise InvalidArgument(f"the file store in {store_dir} has {key} {have[key]!r} and the config asks for "
                                  f"{want[key]!r}: make the config match the store, or give it another directory")
    return store


def _table(where: str, t: dict, i: int, stores: dict) -> Table:
    """The table of a checked ``[[tables]]`` entry over one of ``stores``; errors name ``where``."""
    store = stores.get(t.get("store"))
    if store is None:
        close = difflib.get_close_matches(str(t.get("store")), list(stores), n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise InvalidArgument(f"{where}.store: {t.get('store')!r} is not one of the [[stores]] "
                              f"{sorted(stores)}{hint}")
    kwargs = {}
    if "sampler" in t:
        kwargs["sampler"] = _kind(f"{where}.sampler", t["sampler"], _SELECTORS)
    if "remover" in t:
        kwargs["remover"] = _kind(f"{where}.remover", t["remover"], _SELECTORS)
    if "rate_limiter" in t:
        kwargs["rate_limiter"] = _kind(f"{where}.rate_limiter", t["rate_limiter"], _LIMITERS)
    if "extensions" in t:
        kwargs["extensions"] = [_kind(f"{where}.extensions[{k}]", e, _EXTENSIONS)
                                for k, e in enumerate(t["extensions"])]
    for key in ("max_size", "max_times_sampled", "seed", "evict_when_store_full"):
        if key in t:
            kwargs[key] = t[key]
    name = t.get("name", f"table{i}")
    if name in store._restored:
        # A file store brought it back with its items: it keeps the settings it was made with.
        return store._restored[name]
    with _at(where):
        return Table(name, store, **kwargs)


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


def _few_malloc_arenas() -> None:
    """A server process runs tens of threads; glibc gives each its own malloc arena (up to 8
    per core), and each keeps the high-water mark of the buffers its thread used (checkpoint
    saves, samples), so the heap creeps up for a long while. Two arenas keep it flat (the soak:
    heap +67% without, +15% with, over 3 minutes). Only in ``reprise serve``'s own process."""
    if sys.platform != "linux":
        return
    try:
        import ctypes
        libc = ctypes.CDLL(None)
        libc.mallopt(-8, 2)   # M_ARENA_MAX; a no-op where malloc is not glibc's
    except (OSError, AttributeError):
        pass


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="reprise serve", description="Serve replay tables over gRPC (and locally).")
    p.add_argument("--config", required=True, help="a TOML file: stores, tables, address, token, TLS, checkpoint_dir")
    p.add_argument("--address", help="overrides the config's address")
    p.add_argument("--dashboard", metavar="ADDRESS",
                   help="serve the live dashboard at http://ADDRESS/ (overrides the config's dashboard_address)")
    p.add_argument("--grace", type=float, default=10.0, help="seconds calls in progress get at shutdown")
    a = p.parse_args(argv)
    _few_malloc_arenas()
    stores: list[Store] = []
    try:
        config = load_config(a.config)
        directory = os.path.dirname(os.path.abspath(a.config))
        stores, tables = build(config, directory, a.config)
        with _in_file(a.config):
            limits = _limits(config)
        tls = config.get("tls") or {}
        path = lambda v: None if v is None else os.path.join(directory, v)  # noqa: E731
        ckpt = path(config.get("checkpoint_dir"))
        server = Server(tables, address=a.address or config.get("address", "127.0.0.1:7070"), token=_token(config, directory),
                        checkpoint_dir=ckpt, name=config.get("name"), tls_cert=path(tls.get("cert")),
                        tls_key=path(tls.get("key")), max_message_bytes=config.get("max_message_bytes", 64 << 20),
                        max_batch_items=config.get("max_batch_items", 1 << 16),
                        metrics_address=config.get("metrics_address"),
                        dashboard_address=a.dashboard or config.get("dashboard_address"),
                        **limits)
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
    metrics += f", dashboard at {server.dashboard_link}" if server.dashboard_link else ""
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
