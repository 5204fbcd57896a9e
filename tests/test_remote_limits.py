"""The remote service under size, compression and abuse (issue 18): samples larger than one
message arrive whole, zstd compression round-trips, connections past the limits are refused,
idle and stalled connections are closed, failed tokens are rate limited, and a writer that
never ends its episode cannot fill the store."""

import logging
import time

import numpy as np
import pytest

import reprise as rp
from test_serving import wait_until

ROW = 25_000  # float32 values per step: 100 KB rows


@pytest.fixture
def big(make_store):
    """A table of 64 one-step items of 100 KB each; step i holds the value i everywhere."""
    store = make_store({"obs": rp.Field((ROW,), "float32"), "id": rp.Field((), "int64")}, capacity=256, block_steps=8)
    table = rp.Table("t", store, sampler=rp.selectors.Uniform(), remover=rp.selectors.Fifo(), max_size=200)
    with store.writer() as w:
        for i in range(64):
            w.append({"obs": np.full(ROW, i, np.float32), "id": i})
            w.create_item(table, 1, 1.0)
    return table


def serve(tables, **kw):
    if not isinstance(tables, list):
        tables = [tables]
    return rp.Server(tables, address="127.0.0.1:0", **kw)


def check_rows(sample):
    obs, ids = sample.data["obs"], sample.data["id"]
    assert obs.shape == (len(sample.keys), 1, ROW) and ids.shape == (len(sample.keys), 1)
    assert (obs == ids[:, :, None].astype(np.float32)).all()


def test_a_sample_larger_than_a_message_arrives_whole(big):
    # 40 x 100 KB = 4 MB against 1 MiB messages: parts, joined in order.
    server = serve(big, max_message_bytes=1 << 20)
    try:
        for compression in ("none", "zstd"):
            with rp.Client(server.address, compression=compression) as c:
                s = c.sample("t", 40)
                check_rows(s)
                assert len(set(s.data["id"][:, 0])) > 1
                for batch, _ in zip(c.iterate("t", 30, max_in_flight=3), range(4)):
                    check_rows(batch)
        assert server.snapshot()["bytes"]["sent"] >= 2 * (40 + 4 * 30) * (ROW * 4 + 8)
    finally:
        server.stop()


def test_one_step_larger_than_a_message_arrives_whole(make_store):
    store = make_store({"obs": rp.Field((400_000,), "uint8")}, capacity=16, block_steps=4)
    table = rp.Table("t", store, max_size=10)
    with store.writer() as w:
        for i in range(3):
            w.append({"obs": np.arange(400_000, dtype=np.int64).astype(np.uint8) + i})
        w.create_item(table, 3, 1.0)
    server = serve(table, max_message_bytes=64 << 10)
    try:
        with rp.Client(server.address) as c:
            s = c.sample("t", 2)
        want = np.stack([np.arange(400_000, dtype=np.int64).astype(np.uint8) + i for i in range(3)])
        assert s.data["obs"].shape == (2, 3, 400_000)
        assert (s.data["obs"] == want).all()
    finally:
        server.stop()


def test_too_many_items_for_one_message_names_the_limit(big):
    server = serve(big, max_message_bytes=4096)
    try:
        with rp.Client(server.address) as c, pytest.raises(rp.errors.ResourceExhausted, match=r"200 items.*max_message_bytes \(4096\).*fewer items"):
            c.sample("t", 200)
        assert big.info()["num_samples"] == 0
    finally:
        server.stop()


def test_compression_setting_is_checked():
    with pytest.raises(rp.errors.InvalidArgument, match=r"compression must be 'auto', 'zstd' or 'none', got 'gzip'"):
        rp.Client("127.0.0.1:1", compression="gzip")
    with pytest.raises(rp.errors.InvalidArgument, match="compression is for remote"):
        rp.Client("unix:///nonexistent.sock", compression="zstd")


def test_compressed_inserts_store_the_same_steps(make_store):
    store = make_store({"obs": rp.Field((84, 84), "uint8")}, capacity=512, block_steps=16)
    table = rp.Table("t", store, sampler=rp.selectors.Fifo(), max_size=100)
    server = serve(table)
    frames = [np.zeros((84, 84), np.uint8) for _ in range(20)]
    for i, f in enumerate(frames):
        f[i:i + 4, 10:14] = 200
    try:
        with rp.Client(server.address, compression="zstd") as c:
            with c.writer("t") as w:
                for f in frames:
                    w.append({"obs": f})
                w.create_item("t", 20, 1.0)
            s = c.sample("t", 1)
        assert (s.data["obs"][0] == np.stack(frames)).all()
    finally:
        server.stop()


@pytest.mark.parametrize("kw, message", [
    ({"idle_timeout": 0.5}, r"idle_timeout must be None \(off\) or seconds >= 1, got 0.5"),
    ({"stall_timeout": "60"}, r"stall_timeout must be None \(off\) or seconds >= 1, got '60'"),
    ({"max_connections": 0}, r"max_connections"),
    ({"auth_failures_per_minute": -1}, r"auth_failures_per_minute"),
])
def test_bad_limits_are_refused(big, kw, message):
    before = big.info()
    with pytest.raises(rp.errors.InvalidArgument, match=message):
        serve(big, **kw)
    assert big.info() == before


def test_connections_past_the_per_peer_limit_are_refused(big):
    server = serve(big, max_connections_per_peer=2, metrics_address="127.0.0.1:0")
    try:
        a, b = rp.Client(server.address), rp.Client(server.address)
        with pytest.raises(rp.errors.RepriseError):
            rp.Client(server.address, connect_timeout=5)
        a.close()
        del a
        # The refused and closed connections are gone: one more fits.
        assert wait_until(lambda: len(server.snapshot()["clients"]) == 1, 10)
        c = rp.Client(server.address)
        assert len(c.sample("t", 1).keys) == 1
        assert len(b.sample("t", 1).keys) == 1
        assert refused(server, "max_connections_per_peer") >= 1
    finally:
        server.stop()


def test_idle_connections_are_closed_and_clients_reconnect(big):
    server = serve(big, idle_timeout=1)
    try:
        c = rp.Client(server.address)
        assert len(server.snapshot()["clients"]) == 1
        assert wait_until(lambda: len(server.snapshot()["clients"]) == 0, 10)
        # The next call opens a new connection.
        assert len(c.sample("t", 2).keys) == 2
    finally:
        server.stop()


def test_a_stalled_reader_is_cut_off_without_stalling_others(big):
    """While the server waits to send to a reader that reads nothing, another client's
    draws go on at their usual pace: the same number of draws as an unloaded baseline
    measured first, done while the stalled connection is still open (before
    stall_timeout cuts it), in a time comparable to the baseline's. A server that let
    the stalled reader hold others up would finish them only after the cut."""
    stall_timeout, draws = 6, 10
    server = serve(big, stall_timeout=stall_timeout)
    try:
        other = rp.Client(server.address)

        def draw_all() -> float:
            start = time.monotonic()
            for _ in range(draws):
                assert len(other.sample("t", 8, timeout=30).keys) == 8
            return time.monotonic() - start

        baseline = draw_all()
        stalled = rp.Client(server.address)
        batches = stalled.iterate("t", 60, max_in_flight=32)
        # Asks for 32 batches of 6 MB, then reads none: past its flow-control window and
        # the server's queue, the server waits to send, and after stall_timeout gives up.
        next(batches)
        sent = [-1, server.snapshot()["bytes"]["sent"]]
        while sent[-1] != sent[-2]:   # until the server stops sending: it waits on the reader
            time.sleep(0.3)
            sent.append(server.snapshot()["bytes"]["sent"])
        started = time.monotonic()
        during = draw_all()
        assert len(server.snapshot()["clients"]) == 2, (
            f"the stalled reader was cut off before the other client's {draws} draws ended "
            f"({time.monotonic() - started:.1f} s): they waited for it")
        assert during < 10 * baseline + 2.0, (during, baseline)
        assert wait_until(lambda: len(server.snapshot()["clients"]) == 1, stall_timeout + 10)
        # The cut comes stall_timeout (+ up to the reaper's 1 s tick) after the server began to
        # wait: it was already waiting when the draws started, or this test exercised nothing.
        assert started >= time.monotonic() - stall_timeout - 1.1, "the draws ran before the server waited"
        with pytest.raises(rp.errors.RepriseError):
            for _ in range(32):
                next(batches)
        assert draw_all() < 10 * baseline + 2.0   # and after the cut, as before it
    finally:
        server.stop()


def scrape(server, token=None):
    import urllib.request
    req = urllib.request.Request(f"http://{server.metrics_address}/metrics")
    if token is not None:
        req.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(req, timeout=10) as r:
        return r.read().decode()


def refused(server, reason, token=None):
    for line in scrape(server, token).splitlines():
        if line.startswith(f'reprise_refused_total{{reason="{reason}"}}'):
            return float(line.split()[-1])
    return 0.0


def test_failed_tokens_are_rate_limited_and_logged(big, caplog):
    server = serve(big, token="right", auth_failures_per_minute=3, metrics_address="127.0.0.1:0")
    try:
        with caplog.at_level(logging.WARNING, logger="reprise"):
            for _ in range(3):
                with pytest.raises(rp.errors.Unauthenticated, match="token"):
                    rp.Client(server.address, token="wrong")
            for _ in range(3):
                with pytest.raises(rp.errors.Unauthenticated, match=r"too many failed token attempts from 127.0.0.1: \d+ in the last minute"):
                    rp.Client(server.address, token="wrong")
            # The right token still works from the same address (clients behind one NAT).
            with rp.Client(server.address, token="right") as c:
                assert len(c.sample("t", 1).keys) == 1
            logged = lambda: sum("refused a call from 127.0.0.1" in r.getMessage() for r in caplog.records)  # noqa: E731
            assert wait_until(lambda: logged() >= 3, 5)
            time.sleep(0.5)
            assert logged() == 3   # past the limit, no line per attempt
        assert refused(server, "auth_failure", "right") == 6
        assert refused(server, "auth_throttled", "right") == 3
    finally:
        server.stop()


def test_a_writer_that_never_ends_its_episode_does_not_fill_the_store(make_store):
    store = make_store({"obs": rp.Field((64,), "float32")}, capacity=256, block_steps=16)
    table = rp.Table("t", store, sampler=rp.selectors.Fifo(), remover=rp.selectors.Fifo(), max_size=256)
    server = serve(table)
    try:
        with rp.Client(server.address) as c, c.writer("t") as w:
            for i in range(10 * 256):
                w.append({"obs": np.full(64, i, np.float32)})
                w.create_item("t", 1, 1.0)
                if i % 100 == 0:
                    w.flush()
            w.flush()
            newest = c.info()["t"]["num_inserts"]
            assert newest == 10 * 256
            # An item longer than what it kept says how to keep more.
            w.create_item("t", 50, 1.0)
            with pytest.raises(rp.errors.InvalidArgument, match=r"max_sequence_length=50"):
                w.flush()
    finally:
        server.stop()


def test_a_full_store_says_what_holds_it(make_store):
    store = make_store({"obs": rp.Field((64,), "float32")}, capacity=64, block_steps=16)
    table = rp.Table("t", store, max_size=64)
    w = store.writer(max_sequence_length=64)
    for i in range(64):
        w.append({"obs": np.zeros(64, np.float32)})
    w.create_item(table, 1, 1.0)
    with pytest.raises(rp.errors.ResourceExhausted,
                       match=r"all 4 blocks \(64 steps\) are held: 4 by writers' episode history.*end_episode\(\).*"
                             r"This writer holds 64 steps of its episode.*max_sequence_length is 64"):
        w.append({"obs": np.zeros(64, np.float32)})
    assert len(table) == 1
    w.close()


def test_an_extend_larger_than_a_message_is_sent_in_runs(make_store):
    store = make_store({"obs": rp.Field((ROW,), "float32"), "id": rp.Field((), "int64")}, capacity=256, block_steps=8)
    table = rp.Table("t", store, sampler=rp.selectors.Fifo(), remover=rp.selectors.Fifo(), max_size=100)
    server = serve(table, max_message_bytes=1 << 20)
    try:
        with rp.Client(server.address) as c, c.writer("t") as w:
            ids = np.arange(40)
            w.extend({"obs": np.repeat(ids[:, None], ROW, axis=1).astype(np.float32), "id": ids})  # 4 MB
            w.create_items("t", 1, [1.0] * 40)
            w.flush()
            assert c.info()["t"]["size"] == 40
            s = c.sample("t", 1)
            assert s.data["id"][0, 0] == 0
        # One step larger than a message cannot be split: the error says what to change.
        wide = make_store({"obs": rp.Field((2 << 20,), "uint8")}, capacity=16, block_steps=4)
        other = rp.Table("w", wide, max_size=10)
        server2 = serve(other, max_message_bytes=1 << 20)
        try:
            with rp.Client(server2.address) as c, c.writer("w") as w:
                with pytest.raises(rp.errors.InvalidArgument, match=r"one step is 2097152 bytes, more than the server's max_message_bytes \(1048576\)"):
                    w.append({"obs": np.zeros(2 << 20, np.uint8)})
                assert w.episode_steps == 0
        finally:
            server2.stop()
    finally:
        server.stop()
