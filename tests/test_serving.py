"""rp.Server / rp.Client across processes on one host (issue 3).

Child processes are spawned (multiprocessing "spawn") and run functions of
serving_workers.py. Every wait is bounded: a bug fails a test instead of hanging
the suite."""

import contextlib
import glob
import json
import multiprocessing as mp
import os
import random
import signal
import socket
import stat
import struct
import threading
import time
import uuid
from collections import Counter

import numpy as np
import pytest

import reprise as rp
import serving_workers as W

CTX = mp.get_context("spawn")
SPAWN_S = 20.0  # how long a spawned child may take to start (import numpy and reprise)


# --- helpers --------------------------------------------------------------------------------------


def wait_until(predicate, timeout, interval=0.01):
    """Polls ``predicate`` until it is true or ``timeout`` seconds passed; returns its last value."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(interval)


def bounded(fn, timeout):
    """Runs ``fn`` on a daemon thread; returns ``(value, exception)``. Fails the test if
    it is still running after ``timeout`` seconds (the thread is left behind)."""
    out = {}

    def run():
        try:
            out["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            out["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), f"{fn} still running after {timeout} s: a hang"
    return out.get("value"), out.get("error")


def join_all(processes, timeout):
    deadline = time.monotonic() + timeout
    for p in processes:
        p.join(max(0.0, deadline - time.monotonic()))
        assert not p.is_alive(), f"process {p.name} (pid {p.pid}) did not finish within {timeout} s"


def shm_files_of(pid):
    return glob.glob(f"/dev/shm/reprise-{pid}-*")


@pytest.fixture
def procs():
    """Processes a test started; any still alive at teardown are SIGKILLed (by pid), and
    what killed ones left is removed (remove_leftovers_of)."""
    started = []
    yield started
    for p in started:
        if p.is_alive():
            os.kill(p.pid, signal.SIGKILL)
        p.join(5)
    remove_leftovers_of([p.pid for p in started if p.exitcode is not None and p.exitcode < 0])


@pytest.fixture
def serve():
    """``serve(tables, name=None)``: an ``rp.Server`` stopped at teardown."""
    servers = []

    def make(tables, name=None):
        s = rp.Server(tables, name=name)
        servers.append(s)
        return s

    yield make
    for s in servers:
        _, err = bounded(s.stop, 10)
        assert err is None, err


def unique_name(tag):
    return f"test-{tag}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def socket_dir():
    """Where servers put their sockets (crates/server/src/naming.rs)."""
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg and os.path.isdir(xdg):
        return os.path.join(xdg, "reprise")
    return f"/tmp/reprise-{os.getuid()}"


def remove_leftovers_of(pids):
    """Removes what processes killed by a test (SIGKILL gives them no chance to clean up)
    left: their store files in /dev/shm, and the socket and lock file of every name in the
    socket directory whose lock nobody holds, as the next server start would
    (crates/server/src/naming.rs)."""
    import fcntl

    for pid in pids:
        for path in shm_files_of(pid):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
    d = socket_dir()
    for lock_path in glob.glob(os.path.join(d, "*.lock")):
        try:
            f = open(lock_path, "rb")
        except FileNotFoundError:
            continue
        with f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # a live server's
            try:
                held, at_path = os.fstat(f.fileno()), os.stat(lock_path)
            except FileNotFoundError:
                continue
            if (held.st_dev, held.st_ino) != (at_path.st_dev, at_path.st_ino):
                continue  # a stopping server removed it; the name may be another's now
            # Ours now: its socket is a dead server's. The lock file goes last, still locked.
            for path in (lock_path[: -len(".lock")] + ".sock", lock_path):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)


def start_server_child(procs, name):
    """A server in a child process (serving_workers.serve_in_child): (process, address, store path)."""
    parent, child = CTX.Pipe()
    p = CTX.Process(target=W.serve_in_child, args=(name, child), name=f"server-{name}")
    p.start()
    procs.append(p)
    child.close()
    assert parent.poll(SPAWN_S), "the server child did not report its address"
    address, store_path, pid = parent.recv()
    assert pid == p.pid
    return p, address, store_path


def sigkill(p):
    os.kill(p.pid, signal.SIGKILL)
    p.join(10)
    assert p.exitcode == -signal.SIGKILL


# A raw connection speaking the local protocol (crates/wire/src/local.rs), to act
# as a client that reads sampled rows slowly or sends what the real client never would.
HELLO, LEASE, RELEASE, CREATE, SAMPLE, SAMPLE_DONE, INFO = 1, 2, 3, 4, 5, 6, 9
HELLO_OK, LEASED, CREATED, SAMPLED, INFO_OK, ERROR = 129, 130, 131, 132, 134, 136
PROTOCOL_VERSION = 8   # reprise_wire::local::VERSION
ERROR_CODES = {1: "InvalidArgument", 2: "NotFound", 3: "Timeout", 4: "ResourceExhausted", 5: "Corrupt", 6: "Io"}


class Raw:
    def __init__(self, address):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(5.0)
        self.sock.connect(address[len("unix://"):])

    def send(self, kind, payload=b""):
        self.sock.sendall(struct.pack("<IB", len(payload) + 1, kind) + payload)

    def _exact(self, n):
        buf = b""
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("the server closed the connection")
            buf += chunk
        return buf

    def recv(self):
        (n,) = struct.unpack("<I", self._exact(4))
        body = self._exact(n)
        return body[0], body[1:]

    def call(self, kind, payload=b""):
        self.send(kind, payload)
        return self.recv()

    def hello(self):
        kind, _ = self.call(HELLO, struct.pack("<I", PROTOCOL_VERSION))
        assert kind == HELLO_OK

    def lease(self, store=0, spares=0):
        """The leased block, or with ``spares`` the list of blocks handed out."""
        kind, body = self.call(LEASE, struct.pack("<II", store, spares))
        assert kind == LEASED, (kind, body)
        n, = struct.unpack_from("<I", body)
        blocks = list(struct.unpack_from(f"<{n}I", body, 4))
        assert len(body) == 4 + 4 * n
        return blocks if spares else blocks[0]

    def create(self, items, timeout_ms=2000):
        """``items``: [(table, priority, [(start, len), ...])]; returns (kind, body)."""
        out = struct.pack("<qI", timeout_ms, len(items))
        for table, priority, ranges in items:
            out += struct.pack("<IdI", table, priority, len(ranges))
            out += b"".join(struct.pack("<QI", s, n) for s, n in ranges)
            out += struct.pack("<I", 0)  # the item's attribute record: none
        return self.call(CREATE, out)

    def sample(self, table, n, timeout_ms=2000):
        """Returns ``(sample id, [(key, [(start, len), ...])])``."""
        kind, body = self.call(SAMPLE, struct.pack("<IIqQ", table, n, timeout_ms, 0))  # no token budget
        assert kind == SAMPLED, error_of(kind, body)
        at = 1
        (mlen,) = struct.unpack_from("<I", body, at)
        at += 4 + mlen
        sid, _size, count = struct.unpack_from("<QQI", body, at)
        at += 20
        items = []
        for _ in range(count):
            key, _p, _prio, _ts, _length, nr = struct.unpack_from("<QddIII", body, at)
            at += struct.calcsize("<QddIII")
            ranges = []
            for _ in range(nr):
                ranges.append(struct.unpack_from("<QI", body, at))
                at += 12
            items.append((key, ranges))
        (records,) = struct.unpack_from("<I", body, at)  # the items' attribute records
        at += 4 + records
        assert at == len(body)
        return sid, items

    def sample_done(self, sid):
        self.send(SAMPLE_DONE, struct.pack("<Q", sid))

    def close(self):
        self.sock.close()


def error_of(kind, body):
    """``(error kind name, message)`` of an ERROR reply, or None."""
    if kind != ERROR:
        return None
    (n,) = struct.unpack_from("<I", body, 1)
    return ERROR_CODES.get(body[0], body[0]), body[5:5 + n].decode()


# --- 1. N writers and M samplers in processes: exact accounting --------------------------------------


def test_writer_and_sampler_processes_account_for_every_item(make_store, serve, procs, tmp_path):
    store = make_store(W.accounting_signature(), capacity=4096, block_steps=16)
    q = rp.Table.queue(W.QUEUE, store, max_size=64)
    server = serve([q])
    n_writers, steps = 3, 500
    stop = CTX.Event()
    writers = [CTX.Process(target=W.accounting_writer, args=(server.local_address, wid, steps), name=f"writer-{wid}")
               for wid in range(n_writers)]
    outs = [tmp_path / f"sampler-{i}.json" for i in range(2)]
    samplers = [CTX.Process(target=W.accounting_sampler, args=(server.local_address, stop, str(out), batch, 40.0),
                            name=f"sampler-{i}") for i, (out, batch) in enumerate(zip(outs, (5, 8)))]
    procs.extend(writers + samplers)
    for p in writers + samplers:
        p.start()
    join_all(writers, 40)
    assert [p.exitcode for p in writers] == [0] * n_writers
    # Every writer has flushed: all its items are in the queue or already drawn.
    assert wait_until(lambda: q.size == 0, 20), f"{q.size} items never sampled"
    stop.set()
    join_all(samplers, 20)
    assert [p.exitcode for p in samplers] == [0, 0]

    results = [json.loads(out.read_text()) for out in outs]
    errors = [e for r in results for e in r["errors"]]
    assert errors == []
    drawn = [tuple(d) for r in results for d in r["got"]]
    planned = [item for wid in range(n_writers) for item in W.accounting_plan(wid, steps)]
    keys = [d[0] for d in drawn]
    assert len(keys) == len(set(keys)), "an item was sampled twice"
    assert Counter(d[1:] for d in drawn) == Counter(planned), "items lost or invented"
    # Each sampler sees each writer's items in the order they were created (Fifo).
    for r in results:
        for wid in range(n_writers):
            last = [d[2] for d in r["got"] if d[1] == wid]
            assert last == sorted(last)
    info = q.info()
    assert (info["size"], info["num_inserts"], info["num_samples"]) == (0, len(planned), len(planned))
    # Writers closed and every sample finished: every block is free again.
    assert wait_until(lambda: store.free_blocks == store.num_blocks, 5), (store.free_blocks, store.num_blocks)


# --- 2. a client's sample is the table's sample ---------------------------------------------------------


def _fill(writer, table_ref, flush):
    for i in range(40):
        writer.append({"x": i, "v": np.full((2, 3), i / 4, np.float32), "u": i % 256})
        if i % 10 >= 2:
            writer.create_item(table_ref, num_steps=1 + i % 3, priority=float(1 + i))
        if i % 10 == 9:
            writer.end_episode()
    flush()


@pytest.mark.parametrize("sampler", [rp.selectors.Fifo(), rp.selectors.Prioritized(0.8), rp.selectors.Uniform()],
                         ids=["fifo", "prioritized", "uniform"])
def test_client_sample_equals_table_sample(make_store, serve, sampler):
    sig = {"x": rp.Field((), "int64"), "v": rp.Field((2, 3), "float32"), "u": rp.Field((), "uint8")}
    local_store, served_store = make_store(sig, capacity=512, block_steps=8), make_store(sig, capacity=512, block_steps=8)
    local = rp.Table("replay", local_store, sampler=sampler, seed=7)
    served = rp.Table("replay", served_store, sampler=sampler, seed=7)
    server = serve([served])
    client = rp.Client(server.local_address)
    with local_store.writer() as w:
        _fill(w, local, lambda: None)
    with client.writer() as w:  # the served table is filled through the client
        _fill(w, "replay", lambda: w.flush(timeout=5))
    assert served.items() == local.items()
    for n, fields in ((16, None), (5, ["x"]), (3, ["v", "u"])):
        a = local.sample(n, fields=fields)
        b = client.sample("replay", n, fields=fields)
        assert type(b) is type(a) is rp.Sample
        assert b.table_size == a.table_size
        for f in ("keys", "probabilities", "priorities", "times_sampled", "lengths"):
            x, y = getattr(a, f), getattr(b, f)
            assert y.dtype == x.dtype and y.shape == x.shape, f
            np.testing.assert_array_equal(y, x, err_msg=f)
        assert list(b.data) == list(a.data)
        for f in a.data:
            assert b.data[f].dtype == a.data[f].dtype and b.data[f].shape == a.data[f].shape, f
            np.testing.assert_array_equal(b.data[f], a.data[f], err_msg=f)
    assert client.info()["replay"] == served.info()


def test_client_sample_timeout_and_partial_like_the_table(make_store, serve):
    store = make_store({"x": rp.Field((), "int64")}, capacity=256, block_steps=8)
    q = rp.Table.queue("q", store, max_size=16)
    server = serve([q])
    client = rp.Client(server.local_address)
    t0 = time.monotonic()
    with pytest.raises(rp.errors.Timeout) as e:
        client.sample("q", 2, timeout=0.2)
    assert 0.15 < time.monotonic() - t0 < 5 and e.value.partial is None
    with client.writer() as w:
        for i in range(3):
            w.append({"x": 10 + i})
            w.create_item("q", num_steps=1, priority=1.0)
    with pytest.raises(rp.errors.Timeout) as e:
        client.sample("q", 5, timeout=0.2)
    assert isinstance(e.value.partial, rp.Sample)
    assert e.value.partial.data["x"][:, 0].tolist() == [10, 11, 12]
    assert q.size == 0


def test_a_flush_that_timed_out_leaves_the_writer_in_step(make_store, serve):
    """flush(timeout) gives up while the server still holds the commit; its reply arrives
    later. The writer must neither lose track of it nor take it for another reply."""
    store = make_store(capacity=256, block_steps=8)
    q = rp.Table.queue("q", store, max_size=2)
    server = serve([q])
    client = rp.Client(server.local_address)
    w = client.writer()
    for i in range(4):
        w.append({"x": i})
        w.create_item("q", num_steps=1, priority=1.0)
    with pytest.raises(rp.errors.Timeout):
        w.flush(timeout=0.2)
    assert q.sample(2, timeout=2).data["x"][:, 0].tolist() == [0, 1]
    assert wait_until(lambda: q.size == 2, 2)
    w.flush(timeout=2)
    assert q.sample(2, timeout=2).data["x"][:, 0].tolist() == [2, 3]
    for i in range(4, 30):  # needs new leases: their replies must not be confused with commits
        w.append({"x": i})
    w.create_item("q", num_steps=2, priority=1.0)
    w.flush(timeout=2)
    w.close()
    assert q.sample(1, timeout=2).data["x"].tolist() == [[28, 29]]
    assert wait_until(lambda: store.free_blocks == store.num_blocks, 2)


def test_one_server_several_stores_and_tables(make_store, serve):
    s1 = make_store({"x": rp.Field((), "int64")}, capacity=64, block_steps=8)
    s2 = make_store({"obs": rp.Field((2,), "uint8"), "r": rp.Field((), "float32")}, capacity=64, block_steps=4)
    fifo = rp.selectors.Fifo()
    b, a, c = rp.Table("b", s2, sampler=fifo), rp.Table("a", s1, sampler=fifo), rp.Table("c", s1, sampler=fifo)
    server = serve([b, a, c])
    client = rp.Client(server.local_address)
    assert client.tables == ["b", "a", "c"]
    with client.writer("a") as w:  # a writer into s1 feeds both of its tables
        for i in range(5):
            w.append({"x": i})
        w.create_item("a", num_steps=2, priority=1.0)
        w.create_item("c", num_steps=3, priority=1.0)
        with pytest.raises(rp.errors.InvalidArgument, match="different store"):
            w.create_item("b", num_steps=1, priority=1.0)
    with client.writer() as w:  # the first table's store
        for i in range(5):
            w.append({"obs": np.array([i, i + 1], np.uint8), "r": i / 2})
        w.create_item("b", num_steps=2, priority=1.0)
    assert client.sample("a", 1).data["x"].tolist() == [[3, 4]]
    assert client.sample("c", 1).data["x"].tolist() == [[2, 3, 4]]
    sb = client.sample("b", 1)
    assert sb.data["obs"].tolist() == [[[3, 4], [4, 5]]] and sb.data["r"].tolist() == [[1.5, 2.0]]
    assert set(client.info()) == {"a", "b", "c"}


# --- 3. SIGKILL of writer processes at random points ---------------------------------------------------


def _check_kill_item(s, j):
    length = int(s.lengths[j])
    ep, k, v = s.data["ep"][j, :length], s.data["k"][j, :length], s.data["v"][j, :length]
    assert (ep == ep[0]).all(), f"one item, several episodes: {ep.tolist()}"
    assert k.tolist() == list(range(int(k[0]), int(k[0]) + length)), f"steps not consecutive: {k.tolist()}"
    want = ((ep * 1000 + k) % (1 << 31)).astype(np.int32)
    assert (v == want[:, None]).all(), "a step's row is torn or unwritten"
    return int(ep[0])


def test_sigkilled_writers_leave_no_partial_item_and_return_their_blocks(make_store, serve, procs):
    store = make_store(W.kill_signature(), capacity=8192, block_steps=8)
    t = rp.Table(W.KILL_TABLE, store, sampler=rp.selectors.Fifo(), remover=rp.selectors.Fifo(),
                 max_times_sampled=1, max_size=8192)
    server = serve([t])
    other = rp.Client(server.local_address)  # stays connected through every kill
    rng = random.Random(20240611)
    killed_mid_work = 0
    for it in range(8):
        seed = it + 1
        # Lock-free values: a child killed while holding a value's lock would hang our reads.
        attempted, committed, done = (CTX.Value("q", 0, lock=False) for _ in range(3))
        started = CTX.Event()
        p = CTX.Process(target=W.killable_writer, name=f"killable-{it}",
                        args=(server.local_address, seed, started, attempted, committed, done, 6000,
                              rng.choice([2, 10, 60, 400])))
        p.start()
        procs.append(p)
        assert started.wait(SPAWN_S), "the writer never started"
        time.sleep(rng.uniform(0.0, 0.02))  # a writer of 6000 steps is done in ~30-150 ms here
        sigkill(p)
        confirmed, asked = committed.value, attempted.value
        killed_mid_work += done.value == 0

        # Another client keeps working: write an item and find it among the rest.
        marker = -(it + 1)
        with other.writer(W.KILL_TABLE) as w:
            for k in range(3):
                w.append(W.kill_step(marker, k))
            w.create_item(W.KILL_TABLE, num_steps=3, priority=1.0)
            w.flush(timeout=5)

        # Drain the table through the client: every item is whole and self-consistent.
        episodes, keys = [], []
        while t.size:
            s, err = bounded(lambda: other.sample(W.KILL_TABLE, t.size, timeout=2.0), 10)
            assert err is None, err
            episodes += [_check_kill_item(s, j) for j in range(len(s))]
            keys += s.keys.tolist()
        assert len(keys) == len(set(keys))
        assert episodes.count(marker) == 1
        dead = [e for e in episodes if e != marker]
        assert all(e // 100_000 == seed and e % 100_000 > 0 for e in dead), "an item nobody wrote"
        assert confirmed <= len(dead) <= asked, (confirmed, len(dead), asked)

        # Once the server has seen the connection drop, what the dead writer leased is free;
        # the table is empty and nothing else holds a block.
        assert wait_until(lambda: store.free_blocks == store.num_blocks, 2.0), (
            f"iteration {it}: {store.num_blocks - store.free_blocks} blocks still held after the kill")
    assert killed_mid_work >= 6, "the kills mostly missed the writers' work; retune the delays"
    assert other.info()[W.KILL_TABLE]["size"] == 0


def server_connections(address):
    """How many connections the server listening at ``address`` (``unix://...``) holds open:
    the sockets /proc/net/unix lists under its path, less the listening one."""
    path = address[len("unix://"):]
    with open("/proc/net/unix") as f:
        rows = [line.split() for line in f]
    return sum(1 for r in rows if r[-1] == path and not int(r[3], 16) & 0x10000)  # __SO_ACCEPTCON


def test_samplers_killed_while_blocked_in_the_server_consume_nothing(make_store, serve, procs):
    store = make_store(capacity=256, block_steps=8)
    queues = [rp.Table.queue(f"q{i}", store, max_size=8) for i in range(2)]  # one per sampler
    server = serve(queues)
    ready = [CTX.Event() for _ in queues]
    samplers = [CTX.Process(target=W.blocked_sampler, args=(server.local_address, q.name, r), name=f"blocked-{i}")
                for i, (q, r) in enumerate(zip(queues, ready))]
    procs.extend(samplers)
    for p in samplers:
        p.start()
    assert all(r.wait(SPAWN_S) for r in ready)
    # Each sampler's SAMPLE request waits in the server: its queue's limiter counts time blocked.
    assert wait_until(lambda: all(q.info()["rate_limiter"]["blocked_sample_seconds"] > 0 for q in queues), SPAWN_S), (
        "the samplers' requests never waited in the server")
    assert all(p.is_alive() for p in samplers) and server_connections(server.local_address) == 2
    for p in samplers:
        sigkill(p)
    # Items arrive at once, maybe before the server notices the deaths: a dead request still
    # waiting must not take them.
    with store.writer() as w:
        for i in range(3):
            w.append({"x": i})
            for q in queues:
                w.create_item(q, num_steps=1, priority=1.0)
    # Once the server has closed both dead connections, no request of theirs is left to act.
    assert wait_until(lambda: server_connections(server.local_address) == 0, 10), (
        f"{server_connections(server.local_address)} dead samplers' connections still open in the server")
    for q in queues:
        assert q.size == 3 and q.info()["num_samples"] == 0, f"a dead sampler consumed items of {q.name}"
    client = rp.Client(server.local_address)
    for q in queues:
        assert client.sample(q.name, 3, timeout=2).data["x"][:, 0].tolist() == [0, 1, 2]
    assert wait_until(lambda: store.free_blocks == store.num_blocks, 2)


def test_a_writer_killed_while_the_server_holds_its_commit_returns_its_blocks(make_store, serve, procs):
    """The queue is full, so the server is inside the writer's commit, waiting for room; the
    writer waits at its next lease. Killing it must end that wait and release its blocks."""
    store = make_store(capacity=256, block_steps=4)
    q = rp.Table.queue("q", store, max_size=2)
    server = serve([q])
    p = CTX.Process(target=W.blocked_writer, args=(server.local_address, 40, 8), name="blocked-writer")
    p.start()
    procs.append(p)
    # Items over steps 7 and 15 fill the queue; the commit of step 23's item waits in the
    # server; the writer holds its episode's blocks 0..5 (steps 0..23).
    assert wait_until(lambda: q.size == 2 and store.free_blocks == store.num_blocks - 6, SPAWN_S), (
        q.size, store.num_blocks - store.free_blocks)
    time.sleep(0.2)
    assert p.is_alive() and q.size == 2
    sigkill(p)
    # The items' two blocks stay; the other four the dead writer held come back.
    assert wait_until(lambda: store.free_blocks == store.num_blocks - 2, 2.0), (
        f"{store.num_blocks - store.free_blocks} blocks held after the kill; expected 2")
    assert q.sample(2, timeout=2).data["x"][:, 0].tolist() == [7, 15]
    time.sleep(0.3)
    # The interrupted commit was never acknowledged: if it lands at all, it is whole.
    if q.size:
        assert q.sample(1, timeout=2).data["x"][:, 0].tolist() == [23]
    assert q.size == 0
    assert wait_until(lambda: store.free_blocks == store.num_blocks, 2.0)
    client = rp.Client(server.local_address)  # the server keeps serving
    with client.writer() as w:
        w.append({"x": 99})
        w.create_item("q", num_steps=1, priority=1.0)
    assert q.sample(1, timeout=2).data["x"].tolist() == [[99]]


# --- 4. sampled rows stay valid while a client reads them --------------------------------------------


def test_sampled_blocks_are_not_reused_until_the_client_is_done(make_store, serve):
    """A raw client samples and does not say SAMPLE_DONE (a slow reader). The items are gone
    from the table and a writer cycles the store many times: the sampled rows must not be
    handed out again, so reading them straight from shared memory still gives the item."""
    store = make_store({"x": rp.Field((2,), "int64")}, capacity=64, block_steps=8)  # 8 blocks
    t = rp.Table("ring", store, sampler=rp.selectors.Fifo(), max_times_sampled=1, max_size=64)
    server = serve([t])
    client = rp.Client(server.local_address)
    with client.writer() as w:
        for i in range(24):  # gen 1: rows 0..23
            w.append({"x": np.array([1, i], np.int64)})
            if i in (9, 20):
                w.create_item("ring", num_steps=4, priority=1.0)  # steps 6..9 and 17..20
        w.flush(timeout=5)
    rows = np.memmap(store.path, dtype=np.int64, mode="r", shape=(store.capacity, 2))

    raw = Raw(server.local_address)
    raw.hello()
    sid, items = raw.sample(0, 2)
    ranges = [r for _, rs in items for r in rs]
    assert sorted(n for _, n in ranges) == [4, 4]
    sampled_rows = [row for start, n in ranges for row in range(start, start + n)]
    held = {row // store.block_steps for row in sampled_rows}
    written = [[1, i] for i in (6, 7, 8, 9, 17, 18, 19, 20)]
    assert sorted(np.array(rows[sampled_rows]).tolist()) == written
    assert t.size == 0  # max_times_sampled=1: the items left the table when drawn
    t.reset()
    # Only the slow reader's sample still holds blocks.
    assert wait_until(lambda: store.free_blocks == store.num_blocks - len(held), 2), (store.free_blocks, held)

    with client.writer() as w:  # gen 2 cycles the store ~12 times, evicting as it goes
        for i in range(800):
            w.append({"x": np.array([2, i], np.int64)})
            w.create_item("ring", num_steps=1, priority=1.0)
            if i % 4 == 3:
                w.end_episode()
        w.flush(timeout=5)
    assert t.info()["num_store_evictions"] > 0
    snapshot = np.array(rows)
    free_rows = [r for r in range(store.capacity) if r // store.block_steps not in held]
    assert (snapshot[free_rows, 0] == 2).all(), "the writer did not cycle every free block"
    assert sorted(snapshot[sampled_rows].tolist()) == written, "sampled rows were reused under the reader"
    t.reset()
    # (A closed client writer's blocks come back as the server reads its last messages.)
    assert wait_until(lambda: store.free_blocks == store.num_blocks - len(held), 2), (store.free_blocks, held)

    raw.sample_done(sid)
    assert wait_until(lambda: store.free_blocks == store.num_blocks, 2), "SAMPLE_DONE did not release the rows"

    # A reader that dies (closes its connection) without SAMPLE_DONE releases them too.
    with client.writer() as w:
        for i in range(8):
            w.append({"x": np.array([3, i], np.int64)})
        w.create_item("ring", num_steps=8, priority=1.0)
    _, items = raw.sample(0, 1)
    held = {row // store.block_steps for start, n in items[0][1] for row in range(start, start + n)}
    t.reset()
    assert wait_until(lambda: store.free_blocks == store.num_blocks - len(held), 2), (store.free_blocks, held)
    raw.close()
    assert wait_until(lambda: store.free_blocks == store.num_blocks, 2), "a closed reader's rows stayed held"
    del rows


def test_client_samples_stay_whole_while_a_writer_process_evicts(make_store, serve, procs):
    """Big rows (32 KB a step) in a small store that a writer process keeps cycling: every
    item the parent samples through its client reads back exactly as written."""
    row = 4096
    store = make_store({"x": rp.Field((row,), "int64")}, capacity=64, block_steps=4)
    t = rp.Table("ring", store, max_size=12, seed=3)
    server = serve([t])
    client = rp.Client(server.local_address)
    started = CTX.Event()
    p = CTX.Process(target=W.evicting_writer, args=(server.local_address, started, 6000, row), name="evicting-writer")
    p.start()
    procs.append(p)
    assert started.wait(SPAWN_S)
    checked = 0
    deadline = time.monotonic() + 20
    while (p.is_alive() or checked < 64) and time.monotonic() < deadline:
        s, err = bounded(lambda: client.sample("ring", 8, timeout=2.0), 10)
        assert err is None, err
        x = s.data["x"]
        assert (s.lengths == 4).all()
        first = x[:, :, :1]
        assert (x == first).all(), "a step's row was overwritten while it was copied"
        ep, k = first[:, :, 0] // 16, first[:, :, 0] % 16
        assert (ep == ep[:, :1]).all() and (k == np.arange(4)).all(), "an item's steps were reused"
        checked += len(s)
    join_all([p], 20)
    assert p.exitcode == 0
    assert checked >= 64
    info = t.info()
    assert info["num_inserts"] == 1500 and info["num_evictions"] + info["num_store_evictions"] >= 1488
    t.reset()
    assert wait_until(lambda: store.free_blocks == store.num_blocks, 2)


# --- 5. clients of a dead server -------------------------------------------------------------------


def test_clients_of_a_killed_server_get_an_error_not_a_hang(procs):
    name = unique_name("dead")
    p, address, store_path = start_server_child(procs, name)
    sock = address[len("unix://"):]
    try:
        client = rp.Client(address)
        w = client.writer("replay")
        for i in range(3):
            w.append({"x": i})
            w.create_item("replay", num_steps=1, priority=1.0)
        w.flush(timeout=5)
        assert client.sample("replay", 2, timeout=5).data["x"][:, 0].tolist() == [0, 0]
        w2 = client.writer("replay")
        w2.append({"x": 100})
        w2.create_item("replay", num_steps=1, priority=1.0)  # queued, sent with the next flush
        # A sample blocked in the server (the queue is empty) when the server dies.
        blocked = {}

        def blocked_sample():
            try:
                rp.Client(address).sample("queue", 1)  # no timeout
            except BaseException as e:  # noqa: BLE001
                blocked["error"] = e

        bt = threading.Thread(target=blocked_sample, daemon=True)
        bt.start()
        time.sleep(0.2)
        assert bt.is_alive() and not blocked

        sigkill(p)
        t0 = time.monotonic()
        bt.join(5)
        assert not bt.is_alive(), "a sample blocked in the dead server hangs"
        assert isinstance(blocked.get("error"), rp.errors.RepriseError), blocked

        calls = {
            "sample": lambda: client.sample("replay", 1, timeout=1.0),
            "info": client.info,
            "update_priorities": lambda: client.update_priorities("replay", [1], [1.0]),
            "flush": lambda: w2.flush(timeout=2.0),
            # 3 steps in the 8-step block: the writer needs a new lease within 6 appends.
            "append": lambda: [w.append({"x": 10 + i}) for i in range(16)],
        }
        for what, call in calls.items():
            _, err = bounded(call, 5)
            assert isinstance(err, rp.errors.RepriseError), f"{what}: {err!r}"
            assert not isinstance(err, rp.errors.Timeout), f"{what}: {err!r}"
            assert "connection" in str(err) or "server" in str(err), f"{what}: {err}"
        _, err = bounded(lambda: rp.Client(address), 5)
        assert isinstance(err, rp.errors.RepriseError) and "connect" in str(err), err
        assert time.monotonic() - t0 < 15
        for wr in (w, w2):
            bounded(wr.close, 5)  # may raise; must not hang
    finally:  # what the killed server left behind
        if p.is_alive():
            sigkill(p)
        for f in shm_files_of(p.pid):
            os.unlink(f)
        if os.path.exists(sock):
            os.unlink(sock)


def test_server_stop_ends_every_session_promptly(make_store, serve):
    store = make_store(capacity=256, block_steps=8)
    q = rp.Table.queue("q", store, max_size=1)
    empty = rp.Table.queue("empty", store, max_size=1)
    server = serve([q, empty])
    client = rp.Client(server.local_address)
    w = client.writer()
    w.append({"x": 1})
    w.create_item("q", num_steps=1, priority=1.0)
    w.flush(timeout=2)
    stuck = client.writer()  # its commit will wait in the server: the queue is full
    stuck.append({"x": 2})
    stuck.create_item("q", num_steps=1, priority=1.0)
    errors = {}

    def run(what, fn):
        try:
            fn()
        except BaseException as e:  # noqa: BLE001
            errors[what] = e

    threads = [threading.Thread(target=run, args=("flush", stuck.flush), daemon=True),
               threading.Thread(target=run, args=("sample", lambda: client.sample("empty", 1)), daemon=True)]
    for t in threads:
        t.start()
    time.sleep(0.3)
    assert all(t.is_alive() for t in threads) and not errors
    _, err = bounded(server.stop, 5)
    assert err is None, err
    for t in threads:
        t.join(5)
        assert not t.is_alive(), "a client call hangs after server.stop()"
    for what in ("flush", "sample"):
        assert isinstance(errors.get(what), rp.errors.RepriseError), (what, errors)
    for what, call in {"sample": lambda: client.sample("q", 1, timeout=1), "info": client.info,
                       "connect": lambda: rp.Client(server.local_address)}.items():
        _, err = bounded(call, 5)
        assert isinstance(err, rp.errors.RepriseError), (what, err)
    bounded(w.close, 5)
    bounded(stuck.close, 5)
    # The owner's tables are untouched, and whatever clients held is back.
    assert q.sample(1).data["x"].tolist() == [[1]] and empty.size == 0
    assert wait_until(lambda: store.free_blocks == store.num_blocks, 2), (store.free_blocks, store.num_blocks)
    _, err = bounded(server.stop, 5)  # idempotent
    assert err is None


def test_server_stop_returns_when_its_socket_file_is_gone(procs):
    """The socket file can vanish under a live server (a /tmp cleaner; before f6a8118, a
    racing start that took it for stale): stop() - also run at process exit - must still
    return. (Before f6a8118 stop() woke its accept thread by connecting to its own socket
    path, and hung here.) Run in a child so that a hang costs a kill, not the suite."""
    parent, child = CTX.Pipe()
    p = CTX.Process(target=W.stop_without_socket, args=(unique_name("nosock"), child), name="nosock")
    p.start()
    procs.append(p)
    child.close()
    try:
        assert parent.poll(SPAWN_S) and parent.recv() == "started"
        assert parent.poll(5), "server.stop() hangs once its socket file has been removed"
        assert parent.recv() == "stopped"
        join_all([p], 5)
    finally:
        if p.is_alive():
            sigkill(p)
        for f in shm_files_of(p.pid):
            os.unlink(f)


# --- 6. two servers, one name -----------------------------------------------------------------------


def test_a_name_serves_once_in_process(make_store, serve):
    store = make_store()
    a, b = rp.Table("a", store), rp.Table("b", store)
    name = unique_name("dup")
    first = serve([a], name=name)
    assert first.name == name and first.local_address.endswith(f"/{name}.sock")
    with pytest.raises(rp.errors.InvalidArgument, match=name):
        rp.Server([b], name=name)
    assert rp.Client(first.local_address).tables == ["a"]  # the first one still serves
    first.stop()
    assert not os.path.exists(first.local_address[len("unix://"):])
    again = serve([b], name=name)  # a stopped server's name is free
    assert rp.Client(again.local_address).tables == ["b"]


def test_a_stopped_server_leaves_nothing_in_the_socket_directory(make_store):
    t = rp.Table("t", make_store())
    names = []
    for name in (None, unique_name("tidy")):
        server = rp.Server([t], name=name)
        names.append(server.name)
        server.stop()
    left = sorted(f for f in os.listdir(socket_dir()) for n in names if f.startswith(n + "."))
    assert left == []


def test_a_dead_servers_name_socket_and_shm_files_are_reclaimed(make_store, serve, procs):
    name = unique_name("stale")
    p, address, child_store = start_server_child(procs, name)
    store = make_store()
    t = rp.Table("mine", store)
    with pytest.raises(rp.errors.InvalidArgument, match=name):
        serve([t], name=name)
    child_files = shm_files_of(p.pid)
    assert child_store in child_files
    sigkill(p)
    sock = address[len("unix://"):]
    assert os.path.exists(sock) and os.path.exists(child_store), "nothing stale left to clean up"
    server = serve([t], name=name)
    assert server.local_address == address
    assert rp.Client(address).tables == ["mine"]
    assert shm_files_of(p.pid) == [], "the dead server's shared-memory files were left behind"
    assert os.path.exists(store.path)  # a live store's file is not touched


def test_concurrent_starts_over_a_stale_socket_fail_with_invalid_argument(procs):
    """Servers started at once under the name of a dead server: one serves, the others fail
    with InvalidArgument naming the name, as a later start would. (Before f6a8118 the stale
    socket was checked, removed and re-bound without a lock: losers got 'Address already in
    use' or 'cannot remove the stale socket', and now and then two servers started, the
    first one's socket unlinked and its stop() hung. In a child, so a hang costs a kill.)"""
    parent, child = CTX.Pipe()
    p = CTX.Process(target=W.race_starts, args=(unique_name("race"), 30, 4, child), name="race-starts")
    p.start()
    procs.append(p)
    child.close()
    try:
        assert parent.poll(SPAWN_S + 20), "the racing starts did not report"
        report = parent.recv()
        join_all([p], 5)
    finally:
        if p.is_alive():
            sigkill(p)
        for f in shm_files_of(p.pid):
            os.unlink(f)
    assert not report["stop_hung"], report
    assert report["errors"] == [], (
        f"{len(report['errors'])} bad errors from losing starts in {report['attempts']} attempts: {report['errors'][0]}")
    assert report["serve_errors"] == [], f"a winner did not serve: {report['serve_errors']}"
    assert report["attempts"] == 30 and report["winners"] == [1] * 30, (
        f"servers started per attempt (exactly one each expected): {report['winners']}")


# --- 7. access -----------------------------------------------------------------------------------------


def test_socket_and_shared_memory_are_private(make_store, serve, procs):
    store = make_store()
    server = serve([rp.Table("t", store)], name=unique_name("perm"))
    sock = server.local_address[len("unix://"):]
    assert stat.S_ISSOCK(os.stat(sock).st_mode)
    assert stat.S_IMODE(os.stat(sock).st_mode) == 0o600
    sdir = os.path.dirname(sock)
    assert stat.S_IMODE(os.stat(sdir).st_mode) == 0o700 and os.stat(sdir).st_uid == os.getuid()
    assert stat.S_IMODE(os.stat(store.path).st_mode) == 0o600
    assert os.stat(store.path).st_uid == os.getuid()
    for f in glob.glob(os.path.join(sdir, server.name + ".*")):  # the socket, and a lock file if any
        assert stat.S_IMODE(os.stat(f).st_mode) == 0o600, f

    if os.getuid() != 0:
        return  # only root can become another user to try
    parent, child = CTX.Pipe()
    p = CTX.Process(target=W.foreign_user_attach, args=(server.local_address, store.path, 65534, child), name="foreign")
    p.start()
    procs.append(p)
    child.close()
    assert parent.poll(SPAWN_S)
    report = parent.recv()
    join_all([p], 10)
    assert report["client"].startswith("RepriseError"), report
    assert report["socket"] != "ok", report
    assert report["shm"].startswith("PermissionError"), report


def test_socket_directory_must_be_private(make_store, monkeypatch, tmp_path):
    store = make_store()
    t = rp.Table("t", store)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    server = rp.Server([t], name=unique_name("xdg"))
    try:
        assert server.local_address == f"unix://{tmp_path}/reprise/{server.name}.sock"
        assert stat.S_IMODE(os.stat(tmp_path / "reprise").st_mode) == 0o700
        assert rp.Client(server.local_address).tables == ["t"]
    finally:
        server.stop()
    os.chmod(tmp_path / "reprise", 0o755)
    with pytest.raises(rp.errors.RepriseError, match="0700"):
        rp.Server([t], name=unique_name("xdg"))


# --- 8. bad input over the socket ---------------------------------------------------------------------


@pytest.fixture
def served(make_store, serve):
    store = make_store({"x": rp.Field((), "int64"), "v": rp.Field((3,), "float32")}, capacity=256, block_steps=8)
    t = rp.Table("replay", store, sampler=rp.selectors.Fifo(), seed=1)
    server = serve([t])
    return store, t, server, rp.Client(server.local_address)


def test_unknown_tables_are_not_found(served):
    store, t, server, client = served
    with client.writer() as w:
        w.append({"x": 1, "v": np.zeros(3, np.float32)})
        w.create_item("replay", num_steps=1, priority=1.0)
    calls = [
        lambda: client.sample("nope", 1, timeout=1),
        lambda: client.writer("nope"),
        lambda: client.update_priorities("nope", [1], [1.0]),
        lambda: client.delete("nope", [1]),
        lambda: client.reset("nope"),
    ]
    for call in calls:
        with pytest.raises(rp.errors.NotFound, match="nope"):
            call()
    with client.writer() as w:
        w.append({"x": 2, "v": np.zeros(3, np.float32)})
        with pytest.raises(rp.errors.NotFound, match="nope"):
            w.create_item("nope", num_steps=1, priority=1.0)
    assert client.sample("replay", 1).data["x"].tolist() == [[1]]  # the connection still works
    assert t.size == 1


BAD_STEPS = [
    ({"x": 1}, "missing_field"),
    ({"x": 1, "v": np.zeros(3, np.float32), "y": 2}, "unknown_field"),
    ({"x": 1, "v": np.zeros(4, np.float32)}, "shape"),
    ({"x": 1, "v": np.zeros((3, 1), np.float32)}, "shape"),
    ({"x": 1, "v": np.zeros(3, np.float64)}, "dtype"),
    ({"x": 1.5, "v": np.zeros(3, np.float32)}, "lossy"),
    ({"x": "a", "v": np.zeros(3, np.float32)}, "string"),
]


@pytest.mark.parametrize("step, what", BAD_STEPS, ids=[w for _, w in BAD_STEPS])
def test_bad_steps_are_refused_by_client_writers_as_in_process(served, step, what):
    store, t, server, client = served
    with store.writer() as local:
        with pytest.raises(rp.errors.RepriseError) as in_process:
            local.append(step)
    with client.writer() as w:
        with pytest.raises(rp.errors.RepriseError) as remote:
            w.append(step)
        assert type(remote.value) is type(in_process.value)
        assert isinstance(remote.value, (rp.errors.InvalidArgument, rp.errors.NotFound))
        with pytest.raises(type(remote.value)):
            w.extend({k: np.stack([v, v]) if isinstance(v, np.ndarray) else [v, v] for k, v in step.items()})
        # Nothing was written: the writer goes on from where it was.
        w.append({"x": 7, "v": np.ones(3, np.float32)})
        assert w.episode_steps == 1
        w.create_item("replay", num_steps=1, priority=1.0)
        w.flush(timeout=5)
    assert t.size == 1 and client.sample("replay", 1).data["x"].tolist() == [[7]]


@pytest.mark.parametrize("priority", [float("nan"), float("inf"), -1.0])
def test_bad_priorities_are_invalid(served, priority):
    store, t, server, client = served
    with client.writer() as w:
        w.append({"x": 1, "v": np.zeros(3, np.float32)})
        with pytest.raises(rp.errors.InvalidArgument, match="priority"):
            w.create_item("replay", num_steps=1, priority=priority)
        w.create_item("replay", num_steps=1, priority=2.0)
    key = t.items()[0][0]
    with pytest.raises(rp.errors.InvalidArgument, match="priority"):
        client.update_priorities("replay", [key], [priority])
    with pytest.raises(rp.errors.InvalidArgument, match="priority"):
        client.update_priorities("replay", [key, key], [1.0, priority])  # nothing applied
    assert t.items() == [(key, 2.0, 0, 1)]
    assert client.update_priorities("replay", [key], [3.0]) == 1


def test_bad_addresses(served, tmp_path):
    for address in ("unix://", "/tmp/x.sock", "tcp://127.0.0.1:1", "", "nohost", "host:port", ":80"):
        with pytest.raises(rp.errors.InvalidArgument, match="expected"):
            rp.Client(address)
    with pytest.raises(rp.errors.RepriseError, match="cannot connect to the replay server at 127.0.0.1:1"):
        rp.Client("127.0.0.1:1")
    with pytest.raises(rp.errors.RepriseError, match="connect"):
        rp.Client(f"unix://{tmp_path}/missing.sock")
    not_a_server = tmp_path / "plain"
    not_a_server.write_text("")
    with pytest.raises(rp.errors.RepriseError):
        rp.Client(f"unix://{not_a_server}")


def test_raw_requests_the_real_client_never_sends_are_refused(served):
    """Over the socket itself: a NaN priority, rows of blocks the connection does not
    hold, rows outside the store, releasing another connection's block, garbage. Each is
    refused and changes nothing; the server and other clients keep working."""
    store, t, server, client = served
    raw, other = Raw(server.local_address), Raw(server.local_address)
    raw.hello()
    other.hello()
    block, other_block = raw.lease(), other.lease()
    row, other_row = block * store.block_steps, other_block * store.block_steps
    with client.writer() as w:
        w.append({"x": 5, "v": np.zeros(3, np.float32)})
        w.create_item("replay", num_steps=1, priority=1.0)
    # Held: the two leases and the block of the writer's item.
    assert wait_until(lambda: store.free_blocks == store.num_blocks - 3, 2), store.free_blocks
    free = store.free_blocks
    cases = [
        ([(0, float("nan"), [(row, 1)])], "InvalidArgument"),
        ([(0, 1.0, [(row, 1)]), (0, -3.0, [(row, 1)])], "InvalidArgument"),
        ([(0, 1.0, [(other_row, 1)])], "InvalidArgument"),            # another connection's block
        ([(0, 1.0, [(row, store.block_steps + 1)])], "InvalidArgument"),  # runs past the held block
        ([(0, 1.0, [(store.capacity - 1, 2)])], "InvalidArgument"),   # outside the store
        ([(0, 1.0, [])], "InvalidArgument"),
        ([(7, 1.0, [(row, 1)])], "NotFound"),
    ]
    for items, want in cases:
        kind, body = raw.create(items)
        err = error_of(kind, body)
        assert err is not None and err[0] == want, (items, kind, err)
    assert t.size == 1, "a refused commit inserted something"
    # Releasing a block this connection does not hold is ignored.
    raw.send(RELEASE, struct.pack("<III", 0, 1, other_block))
    kind, body = other.create([(0, 3.0, [(other_row, 1)])])
    assert kind == CREATED, error_of(kind, body)
    kind, body = raw.create([(0, 4.0, [(row, 1)])])  # the connection still works
    assert kind == CREATED, error_of(kind, body)
    assert t.size == 3 and store.free_blocks == free
    # Garbage: an unknown request kind ends this connection, nothing else.
    raw.send(250, b"\x00")
    kind, body = raw.recv()
    assert error_of(kind, body)[0] == "Corrupt"
    with pytest.raises((ConnectionError, OSError)):
        raw.call(INFO)
    raw.close()
    other.close()
    assert client.sample("replay", 1).data["x"].tolist() == [[5]]
    assert sorted(p for _, p, _, _ in t.items()) == [1.0, 3.0, 4.0]
    t.reset()
    assert wait_until(lambda: store.free_blocks == store.num_blocks, 2), (store.free_blocks, store.num_blocks)


def test_a_lease_hands_out_free_spares_and_never_evicts_for_them(make_store, serve):
    """LEASE asks for spare blocks beside the one it waits for: the server gives free
    blocks only, so a full store gives none and evicts nothing for them; more than the
    protocol's limit is refused and nothing is leased."""
    store = make_store({"x": rp.Field((), "int64")}, capacity=16 * 8, block_steps=8)  # 16 blocks
    with pytest.warns(Warning, match="ring semantics"):  # a ring by design
        t = rp.Table("ring", store, sampler=rp.selectors.Fifo(), max_size=128)
    server = serve([t])
    raw = Raw(server.local_address)
    raw.hello()
    blocks = raw.lease(spares=5)
    assert len(blocks) == 6 and len(set(blocks)) == 6
    assert wait_until(lambda: store.free_blocks == 10, 2), store.free_blocks
    kind, body = raw.call(LEASE, struct.pack("<II", 0, 65))
    err = error_of(kind, body)
    assert err is not None and err[0] == "InvalidArgument" and "65 spare blocks; at most 64" in err[1], err
    assert store.free_blocks == 10, "a refused lease leased something"
    # Fill the rest of the store with items, then ask for spares again: only the one
    # block the lease evicts for comes back.
    with rp.Client(server.local_address) as c, c.writer() as w:
        for i in range(10 * 8):
            w.append({"x": i})
            w.create_item("ring", 1, 1.0)
        w.flush(timeout=5)
    assert wait_until(lambda: store.free_blocks == 0, 2), store.free_blocks
    size = t.size
    more = raw.lease(spares=8)
    assert len(more) == 1, "spares came from a full store"
    assert t.size == size - 8, "the lease evicted more than its one block"


def test_a_writer_of_long_sequences_leases_ahead_and_gives_every_block_back(make_store, serve):
    """A local writer in a large store takes spare blocks with its leases (one round trip
    for several blocks); what it writes reads back exactly, and once it closes every block
    that holds no item is free again. In a small store it keeps no spares."""
    for blocks, spares in ((1024, True), (32, False)):
        store = make_store({"x": rp.Field((), "int32")}, capacity=blocks * 64, block_steps=64)
        t = rp.Table("q", store, sampler=rp.selectors.Fifo(), remover=rp.selectors.Fifo(), max_size=100,
                     max_times_sampled=1)
        server = serve([t])
        with rp.Client(server.local_address) as c:
            w = c.writer()
            for k in range(6):
                w.extend({"x": np.arange(k * 1000, k * 1000 + 150, dtype=np.int32)})  # 2-3 blocks each
                w.create_item("q", 150, 1.0)
                w.end_episode()
            w.flush(timeout=5)
            # Items cover 6 x 150 steps back to back (15 blocks, the last the writer's
            # current one); anything more held is spares (up to 1/64 of the store).
            held = store.num_blocks - store.free_blocks
            assert (held > 15) == spares and held <= 15 + blocks // 64, (blocks, held)
            for k in range(6):  # oldest first, each once
                got = c.sample("q", 1, timeout=5)
                assert np.array_equal(got.data["x"][0], np.arange(k * 1000, k * 1000 + 150)), k
            w.close()
            assert wait_until(lambda: store.free_blocks == store.num_blocks, 2), store.free_blocks


def test_a_closed_client_fails_clearly_and_its_writers_keep_working(make_store, serve):
    store = make_store(capacity=256, block_steps=4)
    table = rp.Table("t", store, max_size=64)
    server = serve([table])
    with rp.Client(server.local_address) as client:
        w = client.writer()
    with pytest.raises(rp.errors.RepriseError, match="connection"):
        client.info()
    w.append({"x": 1})
    w.create_item("t", 1, 1.0)
    w.close()
    assert table.size == 1
