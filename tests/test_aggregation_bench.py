"""The in-network aggregation benchmark's harness (benchmarks/innetwork/): the delay relay, the TCP
parameter-server baseline, and the benchmark's ``--quick`` run.

The quick run uses namespaces when this process is root and has ``ip`` and ``tc`` (else
loopback addresses) and records no error for any present system; the delay section is
skipped, with its reason, without namespaces or without ``nft``, and the daemon's part where
``reprise.aggregate`` cannot be imported. Every socket and subprocess has a timeout.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUICK_TIMEOUT_S = 150  # ~15-30 s on 2 busy cores


@pytest.fixture(autouse=True)
def benchmarks_importable(monkeypatch):
    monkeypatch.syspath_prepend(ROOT)


def _udp_echo():
    srv = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    srv.bind(("127.0.0.1", 0))
    srv.settimeout(0.2)
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            try:
                data, addr = srv.recvfrom(65536)
            except socket.timeout:
                continue
            srv.sendto(data, addr)
        srv.close()

    threading.Thread(target=serve, daemon=True).start()
    return srv.getsockname(), stop


def _tcp_echo():
    lsock = socket.create_server(("127.0.0.1", 0))
    lsock.settimeout(10)

    def serve():
        try:
            conn, _ = lsock.accept()
        except OSError:
            return
        conn.settimeout(10)
        with conn:
            while True:
                data = conn.recv(1 << 20)
                if not data:
                    break
                conn.sendall(data)
        lsock.close()

    threading.Thread(target=serve, daemon=True).start()
    return lsock.getsockname()


def test_relay_holds_udp_and_tcp_for_the_delay_each_way_and_keeps_streams_intact():
    from benchmarks.innetwork.relay import Relay

    delay = 3000  # us per hop: far above timer noise, so the lower bound is exact
    echo, stop = _udp_echo()
    relay = Relay(delay_us=delay, jitter_us=0, seed=1)
    udp = relay.udp("127.0.0.1:0", echo, hops=1)
    tcp = relay.tcp("127.0.0.1:0", _tcp_echo(), hops=2)
    relay.start()
    try:
        c = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        c.settimeout(5)
        rtts = []
        for i in range(5):
            t0 = time.monotonic()
            c.sendto(b"ping%d" % i, udp)
            data, _ = c.recvfrom(100)
            rtts.append(time.monotonic() - t0)
            assert data == b"ping%d" % i
        assert min(rtts) >= 2 * delay * 1e-6, rtts           # held once each way
        assert sorted(rtts)[2] < 2 * delay * 1e-6 + 0.05, rtts
        t = socket.create_connection(tcp, timeout=5)
        blob = np.random.default_rng(0).integers(0, 256, 3_000_000, dtype=np.uint8).tobytes()
        t0 = time.monotonic()
        t.sendall(blob)
        got = bytearray()
        while len(got) < len(blob):
            chunk = t.recv(1 << 20)
            assert chunk, "the relay closed the stream early"
            got += chunk
        assert time.monotonic() - t0 >= 2 * 2 * delay * 1e-6   # 2 hops each way
        assert bytes(got) == blob
        t.close()
    finally:
        relay.stop()
        stop.set()
    st = relay.stats()
    assert st["udp_up"] == st["udp_down"] == 5 and st["tcp_connections"] == 1 and "error" not in st
    assert st["late_us"]["p50"] >= 0


def test_relay_command_prints_ready_and_its_statistics():
    echo, stop = _udp_echo()
    p = subprocess.Popen([sys.executable, "-m", "benchmarks.innetwork.relay", "--delay-us", "500",
                          "--udp", f"127.0.0.1:0={echo[0]}:{echo[1]}"], cwd=ROOT, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        line = p.stdout.readline()
        assert line.startswith("READY "), line + p.stderr.read()
        host, port = json.loads(line[6:])["udp"][0].rsplit(":", 1)
        c = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        c.settimeout(5)
        c.sendto(b"x", (host, int(port)))
        assert c.recvfrom(10)[0] == b"x"
        p.send_signal(signal.SIGTERM)
        out, _ = p.communicate(timeout=10)
        assert p.returncode == 0
        st = json.loads(out.strip().splitlines()[-1])
        assert st["udp_up"] == 1 and st["udp_down"] == 1 and st["delay_us"] == 500
    finally:
        if p.poll() is None:
            p.kill()
        stop.set()


@pytest.mark.parametrize("workers", [2, 3])
def test_param_server_returns_every_worker_the_sum(workers):
    from benchmarks.innetwork.param_server import ParamServer, PSWorker

    srv = ParamServer("127.0.0.1:0", workers, accept_timeout=20).start()
    sizes = [1, 7, 40_000, 400_001, 3]  # several rounds, lengths that change, one past CHUNK
    inputs = {r: [np.random.default_rng(100 * r + i).standard_normal(n).astype(np.float32)
                  for i, n in enumerate(sizes)] for r in range(workers)}
    got, errors = {}, []

    def work(r):
        try:
            w = PSWorker(srv.address, r, workers, timeout=20)
            got[r] = [w.allreduce(x) for x in inputs[r]]
            got[r].append(w.allreduce(inputs[r][1].reshape(1, 7), average=True, workers=workers))
            w.close()
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(r,)) for r in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    srv.stop()
    assert not errors and not any(t.is_alive() for t in threads), errors
    assert srv.error is None and srv.rounds == len(sizes) + 1
    for i in range(len(sizes)):
        expected = inputs[0][i].copy()
        for r in range(1, workers):
            np.add(expected, inputs[r][i], out=expected)   # the server's order: exact equality
        for r in range(workers):
            assert got[r][i].dtype == np.float32 and np.array_equal(got[r][i], expected), (workers, i, r)
    mean = sum(inputs[r][1] for r in range(workers)) / workers
    assert got[0][-1].shape == (1, 7) and np.allclose(got[0][-1].reshape(-1), mean, atol=1e-6)


def test_param_server_command_serves_until_its_workers_leave():
    from benchmarks.innetwork.param_server import PSWorker

    p = subprocess.Popen([sys.executable, "-m", "benchmarks.innetwork.param_server", "--workers", "2",
                          "--accept-timeout", "20"], cwd=ROOT, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        line = p.stdout.readline()
        assert line.startswith("READY "), line + p.stderr.read()
        addr = line.split()[1]
        ws = [PSWorker(addr, r, 2, timeout=20) for r in range(2)]
        res = [None, None]
        t = threading.Thread(target=lambda: res.__setitem__(1, ws[1].allreduce(np.full(5, 2, np.float32))))
        t.start()
        res[0] = ws[0].allreduce(np.ones(5, np.float32))
        t.join(20)
        assert all(np.array_equal(r, np.full(5, 3, np.float32)) for r in res)
        for w in ws:
            w.close()
        out, _ = p.communicate(timeout=20)
        assert p.returncode == 0
        assert json.loads(out.strip().splitlines()[-1])["rounds"] == 1
    finally:
        if p.poll() is None:
            p.kill()


# --- the benchmark's --quick run ------------------------------------------------------------
def errors_in(tree, path: str = "") -> list[str]:
    found = []
    if isinstance(tree, dict):
        if "error" in tree:
            found.append(f"{path}: {str(tree['error']).strip().splitlines()[-1][:300]}")
        for k, v in tree.items():
            found += errors_in(v, f"{path}/{k}")
    elif isinstance(tree, list):
        for i, v in enumerate(tree):
            found += errors_in(v, f"{path}[{i}]")
    return found


def _no_shaping() -> str | None:
    """Why namespaces that could be made must not be: the benchmark shapes every link with
    ``tc``, part of iproute2 but missing where only ``ip`` was installed."""
    from benchmarks.innetwork.netns import can_namespace
    if can_namespace()[0] and shutil.which("tc") is None:
        return "no `tc` command (iproute2): links cannot be shaped, so the run uses loopback addresses"
    return None


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("agg")
    argv = [sys.executable, "-m", "benchmarks.innetwork.aggregation", "--quick", "--out-dir", str(out)]
    if _no_shaping():
        argv.append("--no-namespaces")
    r = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=QUICK_TIMEOUT_S)
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-6000:]}"
    paths = glob.glob(os.path.join(str(out), "innetwork-aggregation-*-quick.json"))
    assert len(paths) == 1, paths
    with open(paths[0]) as f:
        return json.load(f), r


def _points(report: dict) -> list[dict]:
    return report["matrix"] + report["delay"]


def test_aggregation_quick_measures_the_baselines_without_errors(quick_run):
    report, r = quick_run
    errors = [e for e in errors_in(report) if "/daemon" not in e and not e.startswith(("/goodput", "/loss"))]
    assert not errors, errors
    points = _points(report)
    assert points, "no network configuration ran"
    if not report["network"]["namespaced"]:
        assert "links not shaped" in r.stdout
    for p in points:
        for name in ("ps", "gloo"):
            if name in report["skipped"]:
                assert f"== {name}: SKIPPED" in r.stderr
                continue
            sizes = p["systems"][name]["sizes"]
            for size in p["sizes"]:
                e = sizes[str(size)]
                assert e["n"] >= 1 and e["p50_us"] > 0 and e["max_abs_err"] == 0, (name, size, e)
    assert "## Against the issue's goals" in r.stdout and "| rate | workers | gradient |" in r.stdout


def test_aggregation_quick_runs_the_delay_section_or_says_why_not(quick_run):
    """The delay section needs namespaces (root, `ip`, `tc`) and nftables (`nft`) for its
    transparent relay; where one is missing the report says which, and this test skips."""
    report, r = quick_run
    if not report["delay"]:
        why = report.get("delay_skipped")
        assert why, "the delay section neither ran nor said why"
        assert f"Not run: {why}." in r.stdout
        if not report["network"]["namespaced"]:
            assert why.startswith("no namespaces"), why
            pytest.skip(f"delay section: {_no_shaping() or report['network']['reason']}: {why}")
        assert shutil.which("nft") is None and "no `nft` command" in why, why
        pytest.skip(f"delay section: {why}")
    assert report["network"]["namespaced"] and shutil.which("nft") is not None
    relays = report["delay"][0]["relays"]
    assert relays and all(x["tcp_connections"] > 0 and x["udp_up"] >= 0 for x in relays), relays


def test_aggregation_quick_measures_the_daemon_or_says_why_not(quick_run):
    report, r = quick_run
    daemon_errors = [e for e in errors_in(report) if "/daemon" in e or e.startswith(("/goodput", "/loss"))]
    if "daemon-f32" in report["skipped"]:
        assert "== daemon: SKIPPED" in r.stderr
        assert report["goodput"].get("skipped") and report["loss"].get("skipped")
        pytest.skip(f"reprise.aggregate unavailable: {report['skipped']['daemon-f32']}")
    assert not daemon_errors, daemon_errors
    for p in _points(report):
        for name in ("daemon-f32", "daemon-i32"):
            for size in p["sizes"]:
                e = p["systems"][name]["sizes"][str(size)]
                assert e["n"] >= 1 and e["p50_us"] > 0 and e["max_abs_err"] == 0, (name, size, e)
    for seg, e in report["goodput"]["by_segment"].items():
        assert e["input_bytes"] > 0 and e["daemon_cpu_s"] >= 0, (seg, e)
    loss = report["loss"]["systems"]
    assert loss["loss"]["sizes"][str(report["loss"]["sizes"][0])]["max_abs_err"] == 0  # exact despite drops
    assert report["loss"]["daemon_processes"]["loss"]["stats"]["dropped_seeded"] > 0
