"""The limit for the remote comparison: plain TCP over loopback, no RPC system at all:
``python -m benchmarks.remote.loopback_socket [--quick]``.

For n in the config's ``clients``: n pairs of spawned processes, each pair one TCP connection on
127.0.0.1 (TCP_NODELAY), the sender calling ``sendall`` with a 4 MiB buffer back to
back, the receiver ``recv_into`` a preallocated 4 MiB buffer. GB/s = bytes received
inside the window by all receivers / window, timed as the systems' points are
(``workloads``: common start, warm-up, window, median over rounds). The bytes are
copied twice (into and out of the kernel), as a replay service's payload is at least.
Standard library and numpy only; any python runs it.
"""

from __future__ import annotations

import os
import socket
import statistics

from benchmarks.common.bench import Bench
from benchmarks.common.processes import Group
from benchmarks.common.timing import Window, now
from benchmarks.remote.workloads import SOCKET_BUFFER, remote_bench


def receiver(ports, warmup: float, window: float):
    """Listen, publish the port, accept one sender; run(start) counts bytes received
    inside the window and reads until the sender closes."""
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(1)
    ports.put(lsock.getsockname()[1])
    conn, _ = lsock.accept()
    lsock.close()
    buf = memoryview(bytearray(SOCKET_BUFFER))

    def run(start):
        win = Window(start, warmup, window)
        counted = 0
        while True:
            n = conn.recv_into(buf)
            if n == 0:
                break
            t = now()
            if win.begin <= t <= win.end:
                counted += n
        conn.close()
        return {"bytes": counted}
    return run


def sender(ports, warmup: float, window: float):
    conn = socket.create_connection(("127.0.0.1", ports.get(timeout=60)))
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buf = bytearray(os.urandom(SOCKET_BUFFER))

    def run(start):
        win = Window(start, warmup, window)
        win.wait_start()
        while now() < win.end:
            conn.sendall(buf)
        conn.close()
        return {}
    return run


def streams(bench: Bench, n: int) -> dict:
    cfg = bench.cfg
    rates = []
    for _ in range(cfg.rounds):
        g = Group(cfg)
        ports = g.ctx.Queue()
        for i in range(n):
            g.add(f"recv{i}", receiver, ports, cfg.warmup_seconds, cfg.window_seconds)
            g.add(f"send{i}", sender, ports, cfg.warmup_seconds, cfg.window_seconds)
        res = g.run(timeout=cfg.warmup_seconds + cfg.window_seconds + 60)
        total = sum(v["bytes"] for k, v in res.items() if k.startswith("recv"))
        rates.append(total / cfg.window_seconds / 1e9)
    return {"gb_per_s": statistics.median(rates), "rounds": rates, "streams": n,
            "path": f"{n} sender/receiver process pairs, sendall / recv_into of "
                    f"{SOCKET_BUFFER >> 20} MiB buffers over 127.0.0.1"}


def main() -> None:
    bench = remote_bench("socket")
    bench.notes.append("plain TCP over loopback: the transport limit, no RPC system")
    for n in bench.cfg.clients:
        bench.run(f"socket[{n}c]", streams, bench, n)
    bench.finish()


if __name__ == "__main__":
    main()
