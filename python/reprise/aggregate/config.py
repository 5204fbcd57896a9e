"""``reprise aggregate --config aggregate.toml``: the aggregation daemon from a TOML config,
with the same conventions as ``reprise serve``::

    address = "0.0.0.0:7100"            # "127.0.0.1:0" picks a free loopback port
    token = "change-me"                 # or token_file = "...", or $REPRISE_TOKEN
    allow = ["10.0.0.0/8"]              # member addresses that may send anything (default: any)
    metrics_address = "127.0.0.1:9100"  # Prometheus: GET /metrics (with a token, scrapes send it)
    member_timeout_seconds = 30         # drop a member an open segment waited this long for
    max_jobs = 64
    max_job_bytes = 268435456           # memory a job may hold (256 MiB); a bigger Join is refused
    max_total_bytes = 1073741824        # memory all jobs together may hold (1 GiB)
    busy_poll = false                   # spin on the socket instead of sleeping (takes a core)
    offload = true                      # UDP segmentation/receive offload where the kernel has it
    transparent = false                 # on-path mode: take packets nftables TPROXY diverts here
    tos = 0x3C                          # the ToS byte of the daemon's packets

    [upstream]                          # hierarchical mode: this daemon aggregates one rack
    address = "10.0.0.1:7100"           # the parent daemon
    member = 0                          # this rack's member id at the parent
    size = 2                            # racks the parent aggregates

Beyond loopback the daemon needs a token or an allow-list. Every key is checked: an unknown
key or a value of the wrong kind stops ``reprise aggregate`` with exit code 2 and a message
naming it. SIGTERM or SIGINT stops the daemon and exits 0.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading

from ..errors import InvalidArgument, RepriseError
from .. import server_config
from ..server_config import _check, _token

_TOP = {"address": "string", "token": "string", "token_file": "string", "allow": "array of strings",
        "metrics_address": "string", "member_timeout_seconds": "number", "max_jobs": "integer",
        "max_job_bytes": "integer", "max_total_bytes": "integer",
        "busy_poll": "boolean", "offload": "boolean", "transparent": "boolean", "tos": "integer", "drop_rate": "number",
        "seed": "integer", "upstream": "table"}
_UPSTREAM = {"address": "string", "member": "integer", "size": "integer"}


def load_config(path: str) -> dict:
    """The parsed TOML of ``path``, every key checked."""
    return server_config.load_config(path, check)


def check(config: dict) -> None:
    _check("top level", config, _TOP, "top-level")
    upstream = config.get("upstream", {})
    _check("upstream", upstream, _UPSTREAM, "[upstream]")
    if upstream:
        missing = [k for k in _UPSTREAM if k not in upstream]
        if missing:
            raise InvalidArgument(f"upstream: needs {', '.join(repr(k) for k in missing)} (the parent's address, "
                                  f"this rack's member id there, and how many racks the parent aggregates)")
    if "member_timeout_seconds" in config and not config["member_timeout_seconds"] > 0:
        raise InvalidArgument(f"top level.member_timeout_seconds: expected seconds > 0, got {config['member_timeout_seconds']!r}")
    if "tos" in config and not 0 <= config["tos"] <= 255:
        raise InvalidArgument(f"top level.tos: expected a byte (0..255), got {config['tos']!r}")


def daemon_kwargs(config: dict, directory: str = ".") -> dict:
    """``Daemon`` keywords from a checked config."""
    upstream = config.get("upstream") or {}
    kwargs = {"token": _token(config, directory), "allow": config.get("allow"),
              "metrics_address": config.get("metrics_address"), "max_jobs": config.get("max_jobs", 64),
              "max_job_bytes": config.get("max_job_bytes", 256 << 20),
              "max_total_bytes": config.get("max_total_bytes", 1 << 30),
              "busy_poll": config.get("busy_poll", False), "offload": config.get("offload", True),
              "transparent": config.get("transparent", False),
              "tos": config.get("tos"), "drop_rate": config.get("drop_rate", 0.0), "seed": config.get("seed", 0)}
    if "member_timeout_seconds" in config:
        kwargs["member_timeout"] = float(config["member_timeout_seconds"])
    if upstream:
        kwargs.update(upstream=upstream["address"], upstream_member=upstream["member"], upstream_size=upstream["size"])
    return kwargs


def main(argv: list[str] | None = None) -> int:
    from . import Daemon

    p = argparse.ArgumentParser(prog="reprise aggregate",
                                description="Run the in-network gradient aggregation daemon (UDP).")
    p.add_argument("--config", help="a TOML file: address, token, allow, metrics_address, upstream, ...")
    p.add_argument("--address", help="IP:PORT to bind (overrides the config's; default 127.0.0.1:7100)")
    p.add_argument("--token", help="the token members send in their Join (overrides the config's and $REPRISE_TOKEN)")
    p.add_argument("--metrics", metavar="ADDRESS", help="serve Prometheus metrics at http://ADDRESS/metrics")
    a = p.parse_args(argv)
    try:
        config = load_config(a.config) if a.config else {}
        directory = os.path.dirname(os.path.abspath(a.config)) if a.config else "."
        kwargs = daemon_kwargs(config, directory)
        if a.token:
            kwargs["token"] = a.token
        elif not a.config:
            kwargs["token"] = os.environ.get("REPRISE_TOKEN") or None
        if a.metrics:
            kwargs["metrics_address"] = a.metrics
        daemon = Daemon(a.address or config.get("address", "127.0.0.1:7100"), **kwargs)
    except RepriseError as e:
        print(f"reprise aggregate: {e}", file=sys.stderr)
        return 2
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    metrics = f", metrics at http://{daemon.metrics_address}/metrics" if daemon.metrics_address else ""
    print(f"reprise aggregate: listening on {daemon.address}{metrics}", flush=True)
    while not stop.wait(0.5):
        pass
    stats = daemon.stats()
    daemon.stop()
    print(f"reprise aggregate: stopped after {stats['segments_completed']} segments "
          f"({stats['values_aggregated']} values aggregated)", flush=True)
    return 0
