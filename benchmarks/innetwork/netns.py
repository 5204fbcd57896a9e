"""Throwaway network topologies on one machine: a star of network namespaces joined by veth pairs.

A :class:`Network` is a hub host and leaf hosts; every leaf gets its own veth pair to the hub and
its own subnet, and the hub forwards, so leaves reach each other *through* the hub (two hops),
as actors, a middle node and a learner would on real machines::

    with Network(["actor0", "actor1", "learner"], hub="replay") as net:
        server = net.popen("replay", ["reprise", "serve", "--config", "replay.toml"])
        net.run("actor0", ["python", "-c", "..."], timeout=30)
        print(net.address("replay"), net.link_bytes("learner"))

Layout (namespaced)
-------------------
* Namespaces are named ``{prefix}-{host}``; the prefix is unique per instance
  (``rp{pid % 10000}{counter}``) so parallel tests do not collide.
* Leaf ``i`` (0-based, in the order given) is linked to the hub by the veth pair
  ``{prefix}l{i}`` (in the leaf) / ``{prefix}h{i}`` (in the hub), subnet ``10.201.{i+1}.0/24``:
  the hub is ``10.201.{i+1}.1``, the leaf ``10.201.{i+1}.2``; the leaf's default route is via
  the hub, and the hub has ``net.ipv4.ip_forward=1``. Loopback is up in every namespace.
* ``address(leaf)`` is the leaf's address. ``address(hub)`` is the hub's address on the
  *first* leaf's link (``10.201.1.1``): every leaf reaches it (it is a local address of the hub,
  the next hop of every leaf). ``address(hub, facing=leaf)`` gives the hub's address on that
  leaf's own link, which keeps the traffic on that link only (one hop, no forwarding).
* Traffic between two leaves crosses both leaves' links; traffic between a leaf and the hub
  crosses only that leaf's link. :meth:`link_bytes` reads a leaf's interface counters, so
  ``link_bytes("learner")`` is exactly what crossed the learner's link.

Fallback (no namespaces)
------------------------
When namespaces cannot be made (not root, no ``ip``) or ``namespaces=False``, every host gets
a distinct loopback address ``127.{b}.{k}.1`` (Linux routes all of 127/8 to ``lo``, ``b``
differs per instance), commands run unchanged in this namespace, and what needs a link
(:meth:`link_bytes`, :meth:`shape`, :meth:`drop`) says it cannot (``None`` / ``False``), so the
same tests and benchmarks run everywhere and skip only what the fallback cannot do.

Cleanup
-------
:meth:`close` (also the context manager's exit, and registered with ``atexit``) kills every
process started with :meth:`popen` (its whole process group), deletes the namespaces (which
destroys their veths and qdiscs and nftables rules with them) and any veth of the prefix left
in the root namespace by a half-finished setup. Every subprocess here has a timeout.
:func:`cleanup_stale` removes what a killed run (``SIGKILL``, no atexit) left behind.
"""

from __future__ import annotations

import atexit
import itertools
import json
import os
import re
import shutil
import signal
import subprocess

from benchmarks.common.processes import stop_all

__all__ = ["Network", "NamespaceError", "can_namespace", "cleanup_stale", "rate_bits"]

CMD_TIMEOUT_S = 15.0  # every setup/teardown command
_counter = itertools.count()
SUBNET = "10.201"  # 10.201.{i+1}.0/24 per leaf link


class NamespaceError(RuntimeError):
    """Namespaces were required (``namespaces=True``) but could not be made."""


def _sh(argv: list[str], *, timeout: float = CMD_TIMEOUT_S, check: bool = True,
        input: str | None = None) -> subprocess.CompletedProcess:
    r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, input=input)
    if check and r.returncode != 0:
        raise NamespaceError(f"{' '.join(argv)} -> {r.returncode}: {r.stderr.strip()}")
    return r


def can_namespace() -> tuple[bool, str]:
    """Whether this process can make namespaces (root and ``ip`` present), with the reason."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return False, "not root"
    if shutil.which("ip") is None:
        return False, "no `ip` command (iproute2)"
    return True, ""


def rate_bits(rate: str) -> float:
    """``tc`` rate string (``10mbit``, ``1gbit``, ``500kbit``, ``1mbps``, ``800bit``) in bits/s."""
    m = re.fullmatch(r"\s*([0-9.]+)\s*([kmgt]?)(bit|bps|)\s*", rate.lower())
    if not m:
        raise ValueError(f"unrecognised rate {rate!r} (e.g. 10mbit, 1gbit)")
    value = float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}[m.group(2)]
    return value * 8 if m.group(3) == "bps" else value


def _namespaces() -> list[str]:
    r = _sh(["ip", "netns", "list"], check=False)
    return [line.split()[0] for line in r.stdout.splitlines() if line.strip()]


def cleanup_stale(prefix: str) -> int:
    """Delete every namespace named ``{prefix}-*`` and every root-namespace link starting with
    ``prefix`` (what a killed run left). Returns how many things were removed."""
    if not can_namespace()[0]:
        return 0
    removed = 0
    for ns in _namespaces():
        if ns.startswith(f"{prefix}-"):
            _kill_namespace_pids(ns)
            if _sh(["ip", "netns", "del", ns], check=False).returncode == 0:
                removed += 1
    r = _sh(["ip", "-j", "link", "show"], check=False)
    try:
        links = json.loads(r.stdout or "[]")
    except ValueError:
        links = []
    for link in links:
        name = link.get("ifname", "")
        if name.startswith(prefix) and re.fullmatch(re.escape(prefix) + r"[lh]\d+", name):
            if _sh(["ip", "link", "del", name], check=False).returncode == 0:
                removed += 1
    return removed


def _kill_namespace_pids(ns: str) -> None:
    r = _sh(["ip", "netns", "pids", ns], check=False)
    for tok in r.stdout.split():
        try:
            os.kill(int(tok), signal.SIGKILL)
        except (ValueError, ProcessLookupError, PermissionError):
            pass


class Network:
    """A star of hosts around ``hub``: network namespaces + veth pairs, or loopback addresses.

    ``namespaces``: ``None`` uses namespaces when they can be made (else the loopback
    fallback), ``False`` forces the fallback, ``True`` raises :class:`NamespaceError` when
    they cannot be made. ``prefix`` (at most 10 characters, so interface names fit in 15)
    overrides the unique default.
    """

    def __init__(self, hosts: list[str], hub: str, *, namespaces: bool | None = None,
                 prefix: str | None = None):
        hosts = list(hosts)
        if not hosts:
            raise ValueError("at least one leaf host")
        if len(set(hosts)) != len(hosts) or hub in hosts:
            raise ValueError(f"host names must be distinct and not the hub: {hosts}, hub {hub!r}")
        if len(hosts) > 250:
            raise ValueError("at most 250 leaf hosts")
        for h in hosts + [hub]:
            if not re.fullmatch(r"[A-Za-z0-9_.]+", h):
                raise ValueError(f"host name {h!r}: letters, digits, '_' and '.' only")
        n = next(_counter)
        self.prefix = prefix or f"rp{os.getpid() % 10000}{n}"
        if len(self.prefix) > 10 or not re.fullmatch(r"[A-Za-z0-9]+", self.prefix):
            raise ValueError(f"prefix {self.prefix!r}: at most 10 letters/digits")
        self.hosts = hosts
        self.hub = hub
        self.namespaced = False
        self.reason = ""  # why the fallback is in use, when it is
        self._procs: list[subprocess.Popen] = []
        self._closed = False
        self._shaped: set[str] = set()
        self._fallback_base = 100 + (os.getpid() * 7 + n) % 150
        atexit.register(self.close)

        if namespaces is False:
            self.reason = "namespaces=False"
        else:
            ok, why = can_namespace()
            if ok:
                try:
                    self._build()
                    self.namespaced = True
                except (NamespaceError, OSError, subprocess.TimeoutExpired) as e:
                    self._teardown_namespaces()
                    why = f"namespace setup failed: {e}"
                    ok = False
            if not ok:
                if namespaces is True:
                    raise NamespaceError(why)
                self.reason = why

    # --- naming ---------------------------------------------------------------------------
    def namespace(self, host: str) -> str | None:
        """The namespace ``host`` runs in (``None`` in the fallback)."""
        self._check(host)
        return f"{self.prefix}-{host}" if self.namespaced else None

    def interface(self, host: str, hub_side: bool = False) -> str | None:
        """A leaf's veth name (in its namespace), or with ``hub_side`` its peer's in the hub."""
        self._check(host)
        if host == self.hub or not self.namespaced:
            return None
        i = self.hosts.index(host)
        return f"{self.prefix}{'h' if hub_side else 'l'}{i}"

    def address(self, host: str, facing: str | None = None) -> str:
        """The IPv4 address other hosts use to reach ``host``. For the hub: its address on the
        first leaf's link (reachable from every leaf), or with ``facing=leaf`` on that leaf's
        own link. In the fallback: ``host``'s loopback address."""
        self._check(host)
        if not self.namespaced:
            k = 1 if host == self.hub else 2 + self.hosts.index(host)
            return f"127.{self._fallback_base}.{k}.1"
        if host == self.hub:
            i = self.hosts.index(facing) if facing is not None else 0
            return f"{SUBNET}.{i + 1}.1"
        return f"{SUBNET}.{self.hosts.index(host) + 1}.2"

    # --- running things -------------------------------------------------------------------
    def command(self, host: str, argv: list[str]) -> list[str]:
        """``argv`` wrapped to run in ``host``'s namespace (unchanged in the fallback)."""
        ns = self.namespace(host)
        return ["ip", "netns", "exec", ns, *argv] if ns else list(argv)

    def popen(self, host: str, argv: list[str], **kw) -> subprocess.Popen:
        """Start ``argv`` in ``host``; tracked and killed (its process group) at :meth:`close`.
        ``start_new_session`` defaults to True so the whole group can be killed."""
        if self._closed:
            raise RuntimeError("network closed")
        kw.setdefault("start_new_session", True)
        p = subprocess.Popen(self.command(host, argv), **kw)
        self._procs.append(p)
        return p

    def run(self, host: str, argv: list[str], timeout: float = 30, **kw) -> subprocess.CompletedProcess:
        """``subprocess.run`` of ``argv`` in ``host`` with a timeout (raises TimeoutExpired)."""
        return subprocess.run(self.command(host, argv), timeout=timeout, **kw)

    # --- links ----------------------------------------------------------------------------
    def link_bytes(self, host: str) -> dict | None:
        """``{"rx_bytes", "tx_bytes", "rx_packets", "tx_packets"}`` of ``host``'s veth, as seen
        in its namespace (``ip -s -j link``); for the hub, the sum over all its veths. ``None``
        in the fallback."""
        self._check(host)
        if not self.namespaced:
            return None
        if host == self.hub:
            total = dict.fromkeys(("rx_bytes", "tx_bytes", "rx_packets", "tx_packets"), 0)
            for leaf in self.hosts:
                one = self._stats(self.namespace(self.hub), self.interface(leaf, hub_side=True))
                for k in total:
                    total[k] += one[k]
            return total
        return self._stats(self.namespace(host), self.interface(host))

    def shape(self, host: str, rate: str, burst: str | None = None) -> bool:
        """Limit the leaf ``host``'s link to ``rate`` both ways: ``tc tbf`` on its veth and on
        the hub-side peer. ``burst`` defaults to 10 ms at ``rate`` (at least 32 KB, so GSO
        super-packets pass). ``rate=""`` or ``"none"`` removes it. ``False`` in the fallback."""
        self._check(host)
        if not self.namespaced or host == self.hub:
            return False
        ends = [(self.namespace(host), self.interface(host)),
                (self.namespace(self.hub), self.interface(host, hub_side=True))]
        if rate in ("", "none", None):
            for ns, dev in ends:
                _sh(["ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", dev, "root"],
                    check=False)
            self._shaped.discard(host)
            return True
        if burst is None:
            burst = f"{max(32 * 1024, int(rate_bits(rate) / 8 / 100))}b"
        for ns, dev in ends:
            _sh(["ip", "netns", "exec", ns, "tc", "qdisc", "replace", "dev", dev, "root", "tbf",
                 "rate", rate, "burst", burst, "latency", "100ms"])
        self._shaped.add(host)
        return True

    def drop(self, host: str, percent: float) -> bool:
        """Drop ``percent`` % of the packets ``host`` receives (an nftables ``input`` hook in its
        namespace, ``numgen random mod 10000 < round(percent*100)``; for the hub, also its
        ``forward`` hook, so forwarded traffic is dropped too). ``percent <= 0`` removes the
        rule. ``False`` when ``nft`` is missing or in the fallback."""
        self._check(host)
        if not self.namespaced or shutil.which("nft") is None:
            return False
        ns = self.namespace(host)
        table = f"{self.prefix}drop"
        _sh(["ip", "netns", "exec", ns, "nft", "delete", "table", "inet", table], check=False)
        if percent <= 0:
            return True
        n = max(0, min(10000, round(percent * 100)))
        hooks = ["input", "forward"] if host == self.hub else ["input"]
        script = [f"add table inet {table}"]
        match = "" if n >= 10000 else f"numgen random mod 10000 < {n} "  # 100%: every packet
        for hook in hooks:
            script += [f"add chain inet {table} {hook} {{ type filter hook {hook} priority 0; "
                       f"policy accept; }}",
                       f"add rule inet {table} {hook} {match}drop"]
        _sh(["ip", "netns", "exec", ns, "nft", "-f", "-"], input="\n".join(script) + "\n")
        return True

    # --- lifetime -------------------------------------------------------------------------
    def close(self) -> None:
        """Kill the tracked processes, delete the namespaces and any leftover veth. Idempotent."""
        if self._closed:
            return
        self._closed = True
        stop_all(self._procs, 3.0)
        if self.namespaced:
            self._teardown_namespaces()
        try:
            atexit.unregister(self.close)
        except Exception:
            pass

    def __enter__(self) -> "Network":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        mode = "namespaces" if self.namespaced else f"loopback fallback ({self.reason})"
        return f"Network({self.prefix}: {self.hosts} around {self.hub!r}, {mode})"

    # --- internals ------------------------------------------------------------------------
    def _check(self, host: str) -> None:
        if host != self.hub and host not in self.hosts:
            raise KeyError(f"unknown host {host!r} (hosts {self.hosts}, hub {self.hub!r})")

    def _stats(self, ns: str, dev: str) -> dict:
        r = _sh(["ip", "-n", ns, "-s", "-j", "link", "show", "dev", dev])
        link = json.loads(r.stdout)[0]
        st = link.get("stats64") or link.get("stats")
        return {"rx_bytes": st["rx"]["bytes"], "tx_bytes": st["tx"]["bytes"],
                "rx_packets": st["rx"]["packets"], "tx_packets": st["tx"]["packets"]}

    def _build(self) -> None:
        hub_ns = f"{self.prefix}-{self.hub}"
        for h in [self.hub] + self.hosts:
            _sh(["ip", "netns", "add", f"{self.prefix}-{h}"])
            _sh(["ip", "-n", f"{self.prefix}-{h}", "link", "set", "lo", "up"])
        _sh(["ip", "netns", "exec", hub_ns, "sh", "-c",
             "echo 1 > /proc/sys/net/ipv4/ip_forward"])
        for i, h in enumerate(self.hosts):
            ns, leaf_if, hub_if = f"{self.prefix}-{h}", f"{self.prefix}l{i}", f"{self.prefix}h{i}"
            _sh(["ip", "link", "add", leaf_if, "type", "veth", "peer", "name", hub_if])
            _sh(["ip", "link", "set", leaf_if, "netns", ns])
            _sh(["ip", "link", "set", hub_if, "netns", hub_ns])
            _sh(["ip", "-n", ns, "addr", "add", f"{SUBNET}.{i + 1}.2/24", "dev", leaf_if])
            _sh(["ip", "-n", hub_ns, "addr", "add", f"{SUBNET}.{i + 1}.1/24", "dev", hub_if])
            _sh(["ip", "-n", ns, "link", "set", leaf_if, "up"])
            _sh(["ip", "-n", hub_ns, "link", "set", hub_if, "up"])
            _sh(["ip", "-n", ns, "route", "add", "default", "via", f"{SUBNET}.{i + 1}.1"])

    def _teardown_namespaces(self) -> None:
        try:
            cleanup_stale(self.prefix)
        except (OSError, subprocess.TimeoutExpired):
            pass
