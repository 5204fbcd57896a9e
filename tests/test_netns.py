"""benchmarks/innetwork/netns.py: namespaced star topologies (when root) and the loopback fallback.

Every process has a timeout, every network is closed by its fixture; what the fallback cannot do
(link counters, shaping, drops) is skipped with a reason.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from benchmarks.innetwork.netns import Network, can_namespace, rate_bits

CAN_NS, WHY_NOT = can_namespace()

# A tiny UDP/TCP peer: `serve-udp ADDR PORT`, `serve-tcp ADDR PORT`, `udp ADDR PORT N SIZE WAIT`
# (prints JSON {sent, echoed}), `tcp ADDR PORT NBYTES` (prints JSON {seconds}).
PEER = r"""
import json, socket, sys, time
mode, addr, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
if mode == "serve-udp":
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind((addr, port))
    print("READY", flush=True)
    while True:
        data, peer = s.recvfrom(65536); s.sendto(data, peer)
elif mode == "serve-tcp":
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((addr, port)); s.listen(4); print("READY", flush=True)
    while True:
        c, _ = s.accept(); n = 0
        while True:
            b = c.recv(1 << 16)
            if not b: break
            n += len(b)
        c.sendall(b"x"); c.close()
elif mode == "udp":
    n, size, wait = int(sys.argv[4]), int(sys.argv[5]), float(sys.argv[6])
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(wait)
    echoed = 0
    for i in range(n):
        s.sendto(bytes(size), (addr, port))
        try:
            if len(s.recvfrom(65536)[0]) == size: echoed += 1
        except socket.timeout:
            pass
    print(json.dumps({"sent": n, "echoed": echoed}))
elif mode == "tcp":
    nbytes = int(sys.argv[4]); buf = bytes(1 << 16)
    s = socket.create_connection((addr, port), timeout=10); t0 = time.perf_counter(); sent = 0
    while sent < nbytes:
        sent += s.send(buf[: min(len(buf), nbytes - sent)])
    s.shutdown(socket.SHUT_WR); s.recv(1)
    print(json.dumps({"seconds": time.perf_counter() - t0}))
"""


def start(net: Network, host: str, *args: str) -> subprocess.Popen:
    p = net.popen(host, [sys.executable, "-c", PEER, *args], stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 10
    line = p.stdout.readline()  # READY (the server exits only at close, so this cannot hang long)
    assert line.strip() == "READY" and time.monotonic() < deadline, line
    return p


def client(net: Network, host: str, *args: str, timeout: float = 20) -> dict:
    r = net.run(host, [sys.executable, "-c", PEER, *args], timeout=timeout, capture_output=True,
                text=True)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def root_links(prefix: str) -> list[str]:
    r = subprocess.run(["ip", "-j", "link", "show"], capture_output=True, text=True, timeout=10)
    return [l["ifname"] for l in json.loads(r.stdout or "[]") if l["ifname"].startswith(prefix)]


def namespaces(prefix: str) -> list[str]:
    r = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=10)
    return [l.split()[0] for l in r.stdout.splitlines() if l.startswith(f"{prefix}-")]


@pytest.fixture(params=["namespaced", "fallback"])
def net(request):
    if request.param == "namespaced" and not CAN_NS:
        pytest.skip(f"cannot make namespaces here: {WHY_NOT}")
    n = Network(["a", "b", "c"], hub="hub", namespaces=(request.param == "namespaced"))
    try:
        yield n
    finally:
        n.close()


@pytest.fixture
def nsnet():
    if not CAN_NS:
        pytest.skip(f"cannot make namespaces here: {WHY_NOT}")
    n = Network(["a", "b", "c"], hub="hub", namespaces=True)
    try:
        yield n
    finally:
        n.close()


def test_addresses_are_distinct_and_commands_wrapped(net):
    addrs = [net.address(h) for h in ["a", "b", "c", "hub"]]
    assert len(set(addrs)) == 4, addrs
    if net.namespaced:
        assert net.command("a", ["true"])[:3] == ["ip", "netns", "exec"]
        assert net.address("hub", facing="c") != net.address("hub")
    else:
        assert net.command("a", ["true"]) == ["true"]
        assert all(a.startswith("127.") for a in addrs)
    with pytest.raises(KeyError):
        net.address("nobody")


def test_udp_echo_between_two_leaves_through_the_hub(net):
    start(net, "c", "serve-udp", net.address("c"), "9009")
    before = net.link_bytes("a")
    out = client(net, "a", "udp", net.address("c"), "9009", "50", "1000", "2")
    assert out == {"sent": 50, "echoed": 50}
    # and the hub's own address is reachable from every leaf (forwarding + its local address)
    start(net, "hub", "serve-udp", net.address("hub"), "9010")
    assert client(net, "b", "udp", net.address("hub"), "9010", "5", "100", "2")["echoed"] == 5
    if not net.namespaced:
        assert before is None and net.link_bytes("a") is None
        return
    after = net.link_bytes("a")
    assert after["tx_bytes"] - before["tx_bytes"] >= 50 * 1000
    assert after["rx_bytes"] - before["rx_bytes"] >= 50 * 1000
    assert after["tx_packets"] - before["tx_packets"] >= 50


def test_shape_slows_a_transfer(net):
    if not net.namespaced:
        assert net.shape("a", "10mbit") is False
        pytest.skip("fallback: no link to shape")
    if shutil.which("tc") is None:
        pytest.skip("no `tc` command (iproute2): cannot shape")
    start(net, "c", "serve-tcp", net.address("c"), "9011")
    nbytes = 1_000_000
    fast = client(net, "a", "tcp", net.address("c"), "9011", str(nbytes))["seconds"]
    assert net.shape("a", "10mbit")
    slow = client(net, "a", "tcp", net.address("c"), "9011", str(nbytes))["seconds"]
    ideal = nbytes * 8 / rate_bits("10mbit")  # 0.8 s
    assert slow > 0.6 * ideal and slow > 1.5 * fast, (fast, slow)
    assert net.shape("a", "none")
    again = client(net, "a", "tcp", net.address("c"), "9011", str(nbytes))["seconds"]
    assert again < 0.5 * slow, (fast, slow, again)


def test_drop_everything_then_restore(net):
    if not net.namespaced or shutil.which("nft") is None:
        assert net.drop("c", 100) is False
        pytest.skip("fallback: no link to drop on" if not net.namespaced
                    else "no `nft` command (apt-get install nftables): cannot drop")
    start(net, "c", "serve-udp", net.address("c"), "9012")
    assert client(net, "a", "udp", net.address("c"), "9012", "5", "100", "2")["echoed"] == 5
    assert net.drop("c", 100)
    assert client(net, "a", "udp", net.address("c"), "9012", "5", "100", "0.2")["echoed"] == 0
    assert net.drop("c", 0)
    assert client(net, "a", "udp", net.address("c"), "9012", "5", "100", "2")["echoed"] == 5


def test_fractional_drop_drops_about_that_share(nsnet):
    if shutil.which("nft") is None:
        pytest.skip("no `nft` command (apt-get install nftables): cannot drop")
    start(nsnet, "c", "serve-udp", nsnet.address("c"), "9013")
    assert nsnet.drop("c", 50.0)
    out = client(nsnet, "a", "udp", nsnet.address("c"), "9013", "200", "100", "0.02")
    # each round trip crosses c's input once: ~50% lost (binomial, 200 draws: 70..130 is > 6 sigma)
    assert 70 <= out["echoed"] <= 130, out


def test_close_leaves_nothing_behind():
    if not CAN_NS:
        pytest.skip(f"cannot make namespaces here: {WHY_NOT}")
    n = Network(["x", "y"], hub="m", namespaces=True)
    p = n.popen("x", [sys.executable, "-c", "import time; time.sleep(60)"])
    assert len(namespaces(n.prefix)) == 3
    if shutil.which("tc") is not None:   # a qdisc goes with its namespace too
        n.shape("x", "100mbit")
    n.close()
    n.close()  # idempotent
    assert p.poll() is not None
    assert namespaces(n.prefix) == [] and root_links(n.prefix) == []


def test_two_networks_at_once_do_not_collide():
    a = Network(["p"], hub="h", namespaces=None)
    b = Network(["p"], hub="h", namespaces=None)
    try:
        assert a.prefix != b.prefix
        if not a.namespaced:
            assert a.address("p") != b.address("p")
    finally:
        a.close()
        b.close()


def test_forced_namespaces_raise_when_impossible():
    if CAN_NS:
        pytest.skip("namespaces are possible here")
    from benchmarks.innetwork.netns import NamespaceError
    with pytest.raises(NamespaceError):
        Network(["a"], hub="h", namespaces=True)


def test_rate_parsing():
    assert rate_bits("10mbit") == 10e6 and rate_bits("1gbit") == 1e9 and rate_bits("1mbps") == 8e6
    with pytest.raises(ValueError):
        rate_bits("fast")
