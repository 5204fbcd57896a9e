"""A TCP parameter-server baseline for gradient aggregation: N workers connect; every round each
sends its float32 gradient, the server sums and sends the sum back to every worker.

It is a baseline to be fair to, so it pipelines as a switch would, over TCP:

* every socket has ``TCP_NODELAY`` and 4 MiB buffers; the server is one thread around
  ``select`` on non-blocking sockets, reading each worker's bytes straight into a preallocated
  buffer (``recv_into``, no copies) as they arrive, from whichever worker is ready;
* it sums in chunks of :data:`CHUNK` bytes (numpy, ``np.add(..., out=)``) as soon as every
  worker's bytes up to that offset have arrived, and starts sending a summed chunk to every
  worker at once, so receiving, summing and sending overlap for large gradients;
* a worker sends its 8-byte header and its gradient in one ``sendmsg`` and reads the result
  while it is still sending (one non-blocking loop), so neither side waits on a full buffer.

Wire format (little-endian): the worker opens with ``b"RPPS"`` + rank (u32) + workers (u32);
each round it sends its gradient's byte length (u64) then the bytes; the server answers with
exactly that many bytes (the sum). Every worker of a round must send the same length.

    srv = ParamServer("127.0.0.1:0", workers=2); srv.start()         # a thread
    w = PSWorker(srv.address, rank=0, workers=2); y = w.allreduce(x)   # y = sum over workers

or ``python -m benchmarks.innetwork.param_server --address 0.0.0.0:7200 --workers 4`` (prints
``READY ip:port``; serves until every worker has left, or SIGTERM; then prints its statistics,
rounds and CPU seconds, as one JSON line).
"""

from __future__ import annotations

import argparse
import json
import os
import select
import signal
import socket
import struct
import sys
import threading
import time

import numpy as np

__all__ = ["ParamServer", "PSWorker", "CHUNK"]

HELLO = struct.Struct("<4sII")
MAGIC = b"RPPS"
HEADER = struct.Struct("<Q")
CHUNK = 256 << 10          # bytes summed (and then sent) at a time
SOCKET_BUFFER = 4 << 20


def _tune(s: socket.socket) -> None:
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for opt in (socket.SO_RCVBUF, socket.SO_SNDBUF):
        try:
            s.setsockopt(socket.SOL_SOCKET, opt, SOCKET_BUFFER)
        except OSError:
            pass


def _addr(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


class _Peer:
    def __init__(self, sock: socket.socket, rank: int):
        self.sock, self.rank = sock, rank
        self.hdr = bytearray(HEADER.size)
        self.hdr_got = 0
        self.nbytes = -1          # this round's length, once its header arrived
        self.buf = bytearray()
        self.view = memoryview(self.buf)
        self.got = 0              # body bytes received this round
        self.sent = 0             # result bytes sent this round
        self.round = 0            # the round this peer's data belongs to

    def body(self, nbytes: int) -> None:
        if len(self.buf) != nbytes:
            self.buf = bytearray(nbytes)
            self.view = memoryview(self.buf)
        self.nbytes, self.got, self.sent = nbytes, 0, 0

    def next_round(self) -> None:
        self.round += 1
        self.nbytes, self.hdr_got, self.got, self.sent = -1, 0, 0, 0


class ParamServer:
    """The server (see the module docstring). ``start()`` runs it in a thread; ``serve()`` in
    this one, until every worker has disconnected or :meth:`stop`."""

    def __init__(self, address: str = "127.0.0.1:0", workers: int = 2, accept_timeout: float = 60.0):
        if workers < 1:
            raise ValueError("workers must be >= 1")
        self.workers = workers
        self.accept_timeout = accept_timeout
        self._lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._lsock.bind(_addr(address))
        self._lsock.listen(workers + 8)
        host, port = self._lsock.getsockname()
        self.address = f"{host}:{port}"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.rounds = 0
        self.bytes_in = 0
        self.error: str | None = None

    def start(self) -> "ParamServer":
        self._thread = threading.Thread(target=self._serve_noraise, name="param-server", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _serve_noraise(self) -> None:
        try:
            self.serve()
        except Exception as e:  # noqa: BLE001 - kept for the caller
            self.error = f"{type(e).__name__}: {e}"

    def _accept(self) -> list[_Peer]:
        peers: dict[int, _Peer] = {}
        deadline = time.monotonic() + self.accept_timeout
        self._lsock.settimeout(0.2)
        while len(peers) < self.workers:
            if self._stop.is_set():
                return []
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(peers)} of {self.workers} workers connected "
                                   f"within {self.accept_timeout:.0f} s")
            try:
                s, _ = self._lsock.accept()
            except socket.timeout:
                continue
            _tune(s)
            s.settimeout(10.0)
            hello = bytearray(HELLO.size)
            got = 0
            while got < HELLO.size:
                n = s.recv_into(memoryview(hello)[got:])
                if n == 0:
                    raise ConnectionError("a worker closed during its hello")
                got += n
            magic, rank, world = HELLO.unpack(hello)
            if magic != MAGIC or world != self.workers or rank >= world or rank in peers:
                s.close()
                raise ValueError(f"bad hello: magic {magic!r}, rank {rank}, workers {world} "
                                 f"(server expects {self.workers})")
            s.setblocking(False)
            peers[rank] = _Peer(s, rank)
        return [peers[r] for r in range(self.workers)]

    def serve(self) -> None:
        peers = self._accept()
        try:
            self._loop(peers)
        finally:
            for p in peers:
                p.sock.close()
            self._lsock.close()

    def _loop(self, peers: list[_Peer]) -> None:
        """Round ``rnd``: every peer's header, then its bytes summed chunk by chunk and the sum
        sent back. A peer that has all of its result moves on (``p.round = rnd + 1``) and may send
        its next gradient while the others still receive theirs; the round ends when all moved."""
        acc = np.zeros(0, dtype=np.float32)
        acc_bytes = memoryview(acc.view(np.uint8))
        rnd = 0
        nbytes = -1        # the round's length (-1: waiting for every header)
        summed = 0         # bytes of acc that hold the round's sum
        while not self._stop.is_set():
            sending = [p.sock for p in peers if p.round == rnd and 0 <= p.sent < summed]
            r, w, _ = select.select([p.sock for p in peers], sending, [], 0.2)
            for s in r:
                p = next(q for q in peers if q.sock is s)
                if not self._read(p):
                    return          # a worker left: the job is over
            if nbytes < 0 and all(p.round == rnd and p.nbytes >= 0 for p in peers):
                lengths = {p.nbytes for p in peers}
                if len(lengths) != 1:
                    raise ValueError(f"workers sent different lengths in round {rnd}: {sorted(lengths)}")
                nbytes = lengths.pop()
                if nbytes % 4:
                    raise ValueError(f"a gradient of {nbytes} bytes is not float32")
                if acc.nbytes != nbytes:
                    acc = np.empty(nbytes // 4, dtype=np.float32)
                    acc_bytes = memoryview(acc.view(np.uint8))
                summed = 0
            if nbytes < 0:
                continue
            if summed < nbytes:
                ready = min(p.got for p in peers)
                ready -= ready % 4
                if ready == nbytes or ready - summed >= CHUNK:
                    a, b = summed // 4, ready // 4
                    if b > a:
                        np.copyto(acc[a:b], np.frombuffer(peers[0].buf, np.float32)[a:b])
                        for p in peers[1:]:
                            np.add(acc[a:b], np.frombuffer(p.buf, np.float32)[a:b], out=acc[a:b])
                    summed = ready
            for p in peers:
                if p.round == rnd and p.sent < summed:
                    try:
                        p.sent += p.sock.send(acc_bytes[p.sent:summed])
                    except (BlockingIOError, InterruptedError):
                        pass
                    except ConnectionError:
                        return
                if p.round == rnd and p.sent == nbytes:
                    p.next_round()
            if all(p.round == rnd + 1 for p in peers):
                self.rounds += 1
                self.bytes_in += nbytes * len(peers)
                rnd, nbytes, summed = rnd + 1, -1, 0

    def _read(self, p: _Peer) -> bool:
        """Read what ``p`` has; False when it closed."""
        try:
            if p.nbytes < 0:
                n = p.sock.recv_into(memoryview(p.hdr)[p.hdr_got:])
                if n == 0:
                    return False
                p.hdr_got += n
                if p.hdr_got == HEADER.size:
                    p.body(HEADER.unpack(p.hdr)[0])
                return True
            if p.got < p.nbytes:
                n = p.sock.recv_into(p.view[p.got:])
                if n == 0:
                    return False
                p.got += n
                return True
            if p.sock.recv(1, socket.MSG_PEEK) == b"":
                return False
            raise ValueError(f"worker {p.rank} sent data before receiving its result")
        except (BlockingIOError, InterruptedError):
            return True
        except ConnectionError:
            return False


class PSWorker:
    """One worker's connection. ``allreduce(x)`` returns the sum of every worker's ``x``
    (float32 numpy array or torch tensor, any shape; the same type and shape back)."""

    def __init__(self, address: str, rank: int, workers: int, timeout: float = 60.0,
                 connect_timeout: float = 30.0):
        self.timeout = timeout
        deadline = time.monotonic() + connect_timeout
        while True:  # the server may still be starting
            try:
                self.sock = socket.create_connection(_addr(address), timeout=5.0)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        _tune(self.sock)
        self.sock.sendall(HELLO.pack(MAGIC, rank, workers))
        self.sock.setblocking(False)

    def allreduce(self, x, average: bool = False, workers: int | None = None):
        is_torch = type(x).__module__.startswith("torch")
        arr = x.detach().contiguous().numpy() if is_torch else np.ascontiguousarray(x)
        if arr.dtype != np.float32:
            raise TypeError(f"float32 gradients only, got {arr.dtype}")
        out = np.empty_like(arr)
        self._exchange(memoryview(arr.reshape(-1).view(np.uint8)),
                       memoryview(out.reshape(-1).view(np.uint8)))
        if average:
            out /= workers
        if is_torch:
            import torch
            return torch.from_numpy(out)
        return out

    def _exchange(self, src: memoryview, dst: memoryview) -> None:
        n = len(src)
        parts = [memoryview(HEADER.pack(n)), src]
        total, sent, got = HEADER.size + n, 0, 0
        deadline = time.monotonic() + self.timeout
        s = self.sock
        while sent < total or got < n:
            progress = False
            if sent < total:
                try:
                    k = s.sendmsg(parts)
                    sent += k
                    progress = k > 0
                    while parts and k >= len(parts[0]):
                        k -= len(parts[0])
                        parts.pop(0)
                    if parts and k:
                        parts[0] = parts[0][k:]
                except (BlockingIOError, InterruptedError):
                    pass
            if got < n:
                try:
                    k = s.recv_into(dst[got:])
                    if k == 0:
                        raise ConnectionError("the parameter server closed the connection")
                    got += k
                    progress = True
                except (BlockingIOError, InterruptedError):
                    pass
            if not progress and (sent < total or got < n):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"allreduce of {n} bytes: no result within {self.timeout:.0f} s "
                                       f"(sent {sent}/{total}, received {got}/{n})")
                select.select([s] if got < n else [], [s] if sent < total else [], [], min(left, 1.0))

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def _cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--address", default="127.0.0.1:0")
    ap.add_argument("--workers", type=int, required=True)
    ap.add_argument("--accept-timeout", type=float, default=120.0)
    args = ap.parse_args(argv)
    srv = ParamServer(args.address, args.workers, args.accept_timeout)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: srv._stop.set())
    print(f"READY {srv.address}", flush=True)
    cpu0 = _cpu_seconds()
    srv._serve_noraise()
    print(json.dumps({"rounds": srv.rounds, "bytes_in": srv.bytes_in,
                      "cpu_s": _cpu_seconds() - cpu0, "error": srv.error} if srv.error else
                     {"rounds": srv.rounds, "bytes_in": srv.bytes_in, "cpu_s": _cpu_seconds() - cpu0}),
          flush=True)
    return 1 if srv.error else 0


if __name__ == "__main__":
    sys.exit(main())
