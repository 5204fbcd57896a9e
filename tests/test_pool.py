"""rp.ClientPool's episode routing: round robin per episode over the servers, held by the
pool, so it holds for one long-lived writer, one new writer per episode, and several threads
(issue 17). Sampling, priorities and dead servers are in test_remote.py."""

import threading

import pytest

import reprise as rp

STEPS = 2  # steps per episode, one single-step item each


@pytest.fixture
def servers():
    """Two loopback servers of a queue 'replay' (so a test can read back every item);
    ``[(table, server)]``."""
    made, stores = [], []
    try:
        for i in range(2):
            store = rp.Store({"x": rp.Field((), "int64")}, capacity=4096, block_steps=8)
            stores.append(store)
            t = rp.Table.queue("replay", store, max_size=4096)
            made.append((t, rp.Server([t], address="127.0.0.1:0")))
        yield made
    finally:
        for _, s in made:
            s.stop()
        for store in stores:
            store.close()


def write_episode(w, e):
    for t in range(STEPS):
        w.append({"x": e * STEPS + t})
        w.create_item("replay", 1, 1.0)
    w.end_episode()


def items_per_server(servers):
    return [t.size for t, _ in servers]


def episodes_of(table):
    """The episode numbers a server's queue holds, in the order they came (drains it)."""
    return list(dict.fromkeys(int(v) // STEPS for v in table.sample(table.size).data["x"][:, 0]))


def test_one_writer_sends_episodes_round_robin(servers):
    with rp.ClientPool([s.address for _, s in servers]) as pool, pool.writer("replay") as w:
        went = []
        for e in range(30):
            went.append(w.server)
            write_episode(w, e)
    assert went == [s.address for _, s in servers] * 15
    assert items_per_server(servers) == [30, 30]
    assert episodes_of(servers[0][0]) == list(range(0, 30, 2))


def test_a_new_writer_per_episode_still_goes_round_robin(servers):
    with rp.ClientPool([s.address for _, s in servers]) as pool:
        for e in range(30):
            with pool.writer("replay") as w:
                write_episode(w, e)
    assert items_per_server(servers) == [30, 30]
    assert episodes_of(servers[0][0]) == list(range(0, 30, 2))
    assert episodes_of(servers[1][0]) == list(range(1, 30, 2))


def test_a_writer_that_writes_nothing_takes_no_turn(servers):
    with rp.ClientPool([s.address for _, s in servers]) as pool:
        for e in range(10):
            with pool.writer("replay") as w:
                w.end_episode()                 # no episode in progress: nothing to end
                assert w.episode_steps == 0
            with pool.writer("replay") as w:
                write_episode(w, e)
                w.end_episode()                 # a second end is no new episode either
    assert items_per_server(servers) == [10, 10]


def test_episodes_from_several_threads_share_one_rotation(servers):
    threads_n, per_thread = 4, 15
    errors = []
    with rp.ClientPool([s.address for _, s in servers]) as pool:
        def run(k):
            try:
                if k % 2:                               # one writer per episode
                    for e in range(per_thread):
                        with pool.writer("replay") as w:
                            write_episode(w, k * per_thread + e)
                else:                                   # one writer for the thread
                    with pool.writer("replay") as w:
                        for e in range(per_thread):
                            write_episode(w, k * per_thread + e)
            except BaseException as e:  # noqa: BLE001 - reported by the test
                errors.append(e)

        threads = [threading.Thread(target=run, args=(k,)) for k in range(threads_n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not any(t.is_alive() for t in threads), "a writer thread hung"
    assert errors == []
    # Each episode took one turn of the pool's rotation, so the servers are even.
    total = threads_n * per_thread * STEPS
    assert items_per_server(servers) == [total // 2, total // 2]
    got = [episodes_of(t) for t, _ in servers]
    assert sorted(got[0] + got[1]) == list(range(threads_n * per_thread))


def test_a_writer_for_an_unknown_table_is_refused_at_once(servers):
    with rp.ClientPool([s.address for _, s in servers]) as pool:
        with pytest.raises(rp.errors.NotFound, match="no table named 'nope'"):
            pool.writer("nope")
        with pytest.raises(rp.errors.InvalidArgument, match="max_sequence_length"):
            pool.writer("replay", max_sequence_length=0)
        with pool.writer("replay") as w:        # the refused writers took no turn
            write_episode(w, 0)
    assert items_per_server(servers) == [STEPS, 0]


def test_a_server_lost_with_unflushed_writes_is_reported_not_swallowed(servers):
    (t0, s0), (t1, s1) = servers
    with rp.ClientPool([s0.address, s1.address]) as pool:
        w = pool.writer("replay")
        write_episode(w, 0)                                 # to s0, flushed by end_episode
        assert w.server == s1.address
        w.append({"x": 100})
        w.create_item("replay", 1, 1.0)
        s1.stop()
        with pytest.raises(rp.errors.RepriseError, match=rf"lost the replay server {s1.address}.*since its last successful flush may be lost"):
            w.flush()
        # The writer carries on with the live server; a later flush says nothing more.
        write_episode(w, 1)
        w.flush()
        w.close()
    assert t0.size == 2 * STEPS


def test_a_pool_writer_left_on_an_error_waits_for_nothing_and_its_timeouts_hold():
    """Queues of 2 items: the third item waits on the server's limiter. A flush with a
    timeout gives up, and leaving the block on that error aborts at once."""
    import time

    stores, made = [], []
    try:
        for _ in range(2):
            store = rp.Store({"x": rp.Field((), "int64")}, capacity=64, block_steps=8)
            stores.append(store)
            t = rp.Table.queue("replay", store, max_size=2)
            made.append((t, rp.Server([t], address="127.0.0.1:0")))
        t0 = time.monotonic()
        with rp.ClientPool([s.address for _, s in made]) as pool:
            with pytest.raises(rp.errors.Timeout):
                with pool.writer("replay") as w:
                    for t in range(4):
                        w.append({"x": t})
                        w.create_item("replay", 1, 1.0)
                    w.end_episode(timeout=0.3)
        assert time.monotonic() - t0 < 10, "leaving the block waited for the limiter"
        time.sleep(0.3)
        assert sorted(t.size for t, _ in made) == [0, 2], "the committed items of the episode were lost"
    finally:
        for _, s in made:
            s.stop()
        for store in stores:
            store.close()
