"""``reprise info`` and ``reprise top``: a server's tables, rates and clients in a terminal.

Both read ``client.snapshot()`` (the dict the dashboard's ``/api/snapshot`` serves: tables
with their ``info()`` and ``stats()``, clients, bytes in/out). ``info`` prints one snapshot,
as text or ``--json``; ``top`` redraws one every ``--interval`` seconds with ``rich`` until
``q`` or Ctrl-C, in the terminal's alternate screen, and puts the terminal back as it found
it (also on SIGTERM or an error).

This module connects (``resolve_address``, ``connect``, ``fetch``; ``Unreachable`` is the
one line the user sees when that fails) and holds the two commands. ``figures`` turns
snapshots into numbers and text (pure: ``info``'s rendering); ``top`` draws them with
``rich`` and runs the refresh loop. ``figures`` imports nothing of the package; ``top``
imports ``figures``, and takes ``connect`` and ``fetch`` from this module only when its loop
runs (looked up then, so that a replaced ``connect``/``fetch`` is the one used).
"""

from __future__ import annotations

import argparse
import os
import sys

from .render import (SPARK, SPARK_WIDTH, _one_line, figures, finite, printable, render_json, render_text,
                      sparkline)
from .top import _top, render_rich

__all__ = ["ENV_TOKEN", "SPARK", "SPARK_WIDTH", "Unreachable", "connect", "fetch", "figures", "finite", "info_main",
           "printable", "render_json", "render_rich", "render_text", "resolve_address", "sparkline", "top_main"]

ENV_TOKEN = "REPRISE_TOKEN"


# --- connecting --------------------------------------------------------------------------------


class Unreachable(Exception):
    """One line for the user: what could not be reached, and what to check."""


def resolve_address(address: str) -> str:
    """What ``rp.Client`` takes: ``unix:///...`` and ``host:port`` as given; a bare name is a
    local server's (``rp.Server(name=...)``, listed by ``reprise doctor``), whose socket is in
    this user's runtime directory."""
    if address.startswith("unix://") or ":" in address:
        return address
    from .. import _native
    directory = _native.socket_dir()
    path = os.path.join(directory, address + ".sock")
    if not os.path.exists(path):
        try:
            names = sorted(n[:-5] for n in os.listdir(directory) if n.endswith(".sock"))
        except OSError:
            names = []
        found = f"servers there: {', '.join(names)}" if names else "no server sockets there"
        raise Unreachable(f"no local server named {address!r} in {directory} ({found}); pass a local server's "
                          "name, 'unix:///path/to/socket' or 'host:port'")
    return "unix://" + path


def connect(address: str, token: str | None = None, tls: bool = False, tls_ca: str | None = None,
            tls_domain: str | None = None, connect_timeout: float = 5.0):
    """An ``rp.Client`` for ``address``, or ``Unreachable`` with one line saying what to check.
    ``token=None`` takes ``$REPRISE_TOKEN`` for a remote address (a local one needs none)."""
    from ..client import Client
    target = resolve_address(address)
    local = target.startswith("unix://")
    if local and (token is not None or tls or tls_ca is not None or tls_domain is not None):
        raise Unreachable(f"{address} is a local server: --token and --tls* are for remote 'host:port' "
                          "addresses (local clients are authenticated by the socket's permissions)")
    if not local and token is None:
        token = os.environ.get(ENV_TOKEN) or None
    try:
        return Client(target, token=token, tls=tls, tls_ca=tls_ca, tls_domain=tls_domain,
                      connect_timeout=None if local else connect_timeout)
    except BaseException as e:
        raise _unreachable(address, local, e) from None


def _unreachable(address: str, local: bool, e: BaseException) -> BaseException:
    from ..errors import InvalidArgument, RepriseError, Unauthenticated
    if isinstance(e, Unauthenticated):
        return Unreachable(f"{address} refused the token ({_one_line(e)}): check --token or ${ENV_TOKEN}")
    if isinstance(e, InvalidArgument):
        return Unreachable(_one_line(e))
    if isinstance(e, RepriseError):
        check = ("that the server is running on this host (reprise doctor lists local servers)" if local else
                 "that the server is running, the host and port, and --tls/--tls-ca if it serves TLS")
        return Unreachable(f"cannot reach {address} ({_one_line(e)}): check {check}")
    return e


def fetch(client) -> dict:
    """One snapshot of the server behind ``client`` (the dashboard's ``/api/snapshot`` dict)."""
    return client.snapshot()


def _close(client):
    try:
        client.close()
    except Exception:  # noqa: BLE001 - a dead connection has nothing left to close
        pass



# --- commands ----------------------------------------------------------------------------------


def _parser(prog: str, description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=description)
    p.add_argument("address", metavar="ADDRESS",
                   help="'host:port' of a remote server, or a local server's name (rp.Server(name=...), "
                        "listed by reprise doctor) or 'unix:///path/to/socket'")
    p.add_argument("--token", default=None, help=f"the server's token (remote only; default: ${ENV_TOKEN})")
    p.add_argument("--tls", action="store_true", help="connect with TLS (remote only)")
    p.add_argument("--tls-ca", default=None, metavar="PEM", help="CA certificate for a private CA (implies --tls)")
    p.add_argument("--tls-domain", default=None, metavar="NAME", help="the name the server's certificate holds, "
                                                                       "when it is not the host")
    p.add_argument("--connect-timeout", type=float, default=5.0, metavar="SECONDS",
                   help="how long to wait for a remote server to answer")
    return p


def info_main(argv: list[str] | None = None) -> int:
    p = _parser("reprise info", "Print one snapshot of a replay server: its tables (size, rates, rate-limiter "
                                "blocked time, sampled age, unique samples, priorities), clients and bytes.")
    p.add_argument("--json", action="store_true", help="print the snapshot as one JSON object")
    a = p.parse_args(argv)
    try:
        client = connect(a.address, a.token, a.tls, a.tls_ca, a.tls_domain, a.connect_timeout)
        try:
            snapshot = fetch(client)
        except BaseException as e:
            raise _unreachable(a.address, client.address.startswith("unix://"), e) from None
        finally:
            _close(client)
    except Unreachable as e:
        print(f"reprise info: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    print(render_json(snapshot) if a.json else render_text(snapshot))
    return 0


def top_main(argv: list[str] | None = None) -> int:
    p = _parser("reprise top", "Watch a replay server's tables and clients, redrawn every --interval seconds; "
                               "q or Ctrl-C quits.")
    p.add_argument("--interval", type=float, default=1.0, metavar="SECONDS", help="seconds between snapshots")
    a = p.parse_args(argv)
    if not a.interval > 0:
        p.error(f"--interval must be > 0 seconds, got {a.interval}")
    try:
        return _top(a)
    except Unreachable as e:
        print(f"reprise top: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 0
