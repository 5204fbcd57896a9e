"""Durable file stores (issue 36): ``rp.Store(..., backing="file", durable=True)``. A writer's
``flush()`` returns once its items are on disk, and a store whose process is SIGKILLed comes
back, at ``rp.Store.open`` or ``reprise serve``'s next start, with every item a flush covered.
The ledgers below record what each flush returned for; the store reopened after each kill
must hold all of it, with the rows that were written."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import reprise as rp
from reprise.errors import Corrupt, InvalidArgument

SIG = {"x": rp.Field((2,), "int64")}  # [step value, writer]


def contents(table, fields=("x",)):
    """Every item's ``x`` row as a set of tuples: uniform draws of 40x the table's size
    (seeded, so the same store always gives the same draws; missing one item of 2,000
    in 80,000 draws has probability 2,000 * e^-40)."""
    seen = set()
    for _ in range(40):
        s = table.sample(table.size, fields=list(fields))
        x = s.data["x"]
        assert (s.lengths == 1).all()
        seen.update(map(tuple, x[:, 0, :].tolist()))
    return seen


CHILD = textwrap.dedent("""
    import os, sys
    import numpy as np
    import reprise as rp
    directory, first = sys.argv[1], int(sys.argv[2])
    if os.path.exists(os.path.join(directory, "store.json")):
        store = rp.Store.open(directory)
        table = store.tables["t"]
    else:
        store = rp.Store({"x": rp.Field((2,), "int64")}, capacity=1 << 16, block_steps=16, directory=directory,
                         backing="file", durable=True)
        table = rp.Table("t", store, max_size=1 << 15, seed=3)
    print("ready", table.size, flush=True)
    w = store.writer()
    i = first
    while True:
        w.append({"x": np.array([i, 0])})
        w.create_item(table, 1, 1.0)
        if i % 7 == 6:
            w.flush()
            print(i, flush=True)   # every step up to i is durable
        if i % 40 == 39:
            w.end_episode()
        i += 1
""")


def test_every_flushed_item_survives_its_process_killed_in_a_loop(disk):
    flushed = set()
    first = 0
    for round in range(4):
        p = subprocess.Popen([sys.executable, "-c", CHILD, disk, str(first)], stdout=subprocess.PIPE, text=True,
                             env=dict(os.environ, PYTHONWARNINGS="ignore"))
        try:
            assert p.stdout.readline().split()[0] == "ready"
            last, began = None, time.monotonic()
            for line in p.stdout:
                last = int(line)
                if time.monotonic() - began > 0.3 + 0.2 * round:
                    break
        finally:
            p.kill()
            p.wait()
        assert last is not None
        flushed.update((v, 0) for v in range(first, last + 1))
        store = rp.Store.open(disk)
        try:
            t = store.tables["t"]
            have = contents(t)
            assert flushed <= have, f"round {round}: {len(flushed - have)} flushed items lost"
            # Nothing else: at most the steps written after the last flush the parent read.
            assert all(v >= first or (v, 0) in flushed for v, _ in have)
        finally:
            store.close()
        first = last + 1000
    assert len(flushed) > 50


def test_a_durable_store_left_open_is_recovered_and_says_so(disk, caplog):
    code = textwrap.dedent(f"""
        import os, numpy as np, reprise as rp
        store = rp.Store({{"x": rp.Field((2,), "int64")}}, capacity=256, block_steps=8, directory={disk!r},
                         backing="file", durable=True)
        t = rp.Table("t", store, max_size=200)
        w = store.writer()
        for i in range(10):
            w.append({{"x": np.array([i, 0])}})
            w.create_item(t, 1, 1.0)
        w.flush()
        for i in range(10, 15):  # not flushed: gone
            w.append({{"x": np.array([i, 0])}})
            w.create_item(t, 1, 1.0)
        os.kill(os.getpid(), 9)
    """)
    subprocess.run([sys.executable, "-c", code], check=False)
    assert os.path.exists(os.path.join(disk, "open"))
    with caplog.at_level("WARNING", logger="reprise"):
        store = rp.Store.open(disk)
    try:
        assert "was not closed: reopened as its last commit left it (10 items in 1 tables)" in caplog.text
        assert store.durable and contents(store.tables["t"]) == {(i, 0) for i in range(10)}
    finally:
        store.close()
    assert not os.path.exists(os.path.join(disk, "open"))


@pytest.mark.filterwarnings("ignore::reprise.errors.CapacityWarning")
def test_concurrent_flushes_share_commits_and_a_full_store_keeps_turning(disk):
    """Eight writers flushing at once over a store that fills many times over: flushes that
    arrive during a commit share the next one, and a full store evicts its oldest items
    (a group per commit) instead of refusing."""
    store = rp.Store(SIG, capacity=2048, block_steps=16, directory=disk, backing="file", durable=True)
    t = rp.Table("t", store, max_size=2000, seed=1)   # bounded by the store: it evicts
    big = rp.Table("idle", store, max_size=10)           # a second table over the same store
    flushes = []
    errors = []

    def write(k):
        try:
            with store.writer(max_sequence_length=1) as w:
                for i in range(600):
                    w.append({"x": np.array([i, k])})
                    w.create_item(t, 1, 1.0)
                    if i % 5 == 4:
                        w.flush()
                        flushes.append(1)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=write, args=(k,)) for k in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    commits = store.commits()
    assert 0 < commits["commits"] < len(flushes), (commits, len(flushes))
    assert t.info()["num_store_evictions"] > 0
    assert t.size < 4800 and len(big) == 0
    # Each writer's newest flushed steps are there.
    have = contents(t)
    for k in range(8):
        assert (599, k) in have
    store.close()
    again = rp.Store.open(disk)
    try:
        assert contents(again.tables["t"]) == have
    finally:
        again.close()


def test_commit_covers_table_inserts(disk):
    store = rp.Store(SIG, capacity=256, block_steps=8, directory=disk, backing="file", durable=True)
    t = rp.Table("t", store, max_size=100)
    t.insert({"x": np.arange(20).reshape(10, 1, 2)}, np.ones(10))
    before = store.commits()["commits"]
    store.commit()
    assert store.commits()["commits"] == before + 1
    index = os.path.join(disk, "index")
    assert len([n for n in os.listdir(index) if n.startswith("ckpt-")]) == 1
    store.close()


def test_bad_durable_arguments_are_refused_and_nothing_is_made(disk, tmp_path):
    cases = [
        (dict(durable=True), "durable=True keeps a file store's items on disk: pass backing='file'"),
        (dict(durable="yes", backing="file", directory=disk), "durable must be True or False, got 'yes'"),
    ]
    for kwargs, message in cases:
        with pytest.raises(InvalidArgument, match=message.replace("(", r"\(").replace(")", r"\)")):
            rp.Store(SIG, capacity=64, **kwargs)
        assert not os.path.exists(disk)
    packed = {"x": rp.Field((2,), "int64"), "img": rp.Field((8, 8), "uint8", compress="zstd")}
    with pytest.raises(InvalidArgument, match="a durable store cannot have compressed fields yet .field 'img'"):
        rp.Store(packed, capacity=64, directory=disk, backing="file", durable=True)
    assert not os.path.exists(disk)
    with rp.Store(SIG, capacity=64) as memory:
        with pytest.raises(InvalidArgument, match="commit.. is for durable file stores .* this store is in memory"):
            memory.commit()
    plain = rp.Store(SIG, capacity=64, directory=disk, backing="file")
    try:
        with pytest.raises(InvalidArgument, match="this store is a file store without durable"):
            plain.commit()
        assert not plain.durable and not os.path.exists(os.path.join(disk, "index"))
    finally:
        plain.close()


def test_a_plain_file_store_left_open_is_still_refused(disk):
    code = textwrap.dedent(f"""
        import os, numpy as np, reprise as rp
        store = rp.Store({{"x": rp.Field((2,), "int64")}}, capacity=64, directory={disk!r}, backing="file")
        os.kill(os.getpid(), 9)
    """)
    subprocess.run([sys.executable, "-c", code], check=False)
    with pytest.raises(Corrupt, match="was not closed"):
        rp.Store.open(disk)


def test_a_durable_transition_buffer_killed_mid_episode_reopens_with_its_committed_transitions(disk):
    code = textwrap.dedent(f"""
        import os, numpy as np, reprise as rp
        buf = rp.TransitionBuffer(500, (4,), "float32", n_step=2, gamma=0.5, alpha=0.6, seed=1,
                                  directory={disk!r}, backing="file", durable=True)
        obs = np.zeros(4, np.float32)
        for i in range(120):
            nxt = np.full(4, i + 1, np.float32)
            buf.add(obs, i % 3, 1.0, nxt, False, i % 40 == 39)
            obs = np.zeros(4, np.float32) if i % 40 == 39 else nxt
        buf.update_priorities(buf.sample(4).keys, np.full(4, 9.0))
        buf.commit()
        print(len(buf), flush=True)
        far = np.full(4, 1000, np.float32)
        for i in range(120, 150):   # not committed
            buf.add(far, 0, 1.0, far + 1, False, False)
        os.kill(os.getpid(), 9)
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    committed = int(r.stdout.split()[0])
    again = rp.TransitionBuffer.open(disk)
    try:
        assert len(again) == committed == 120   # three episodes, each ended by a truncation
        assert again.max_priority >= 9.0
        s = again.sample(500)
        assert (s.obs < 1000).all() and (s.next_obs < 1000).all()   # nothing of after the commit
    finally:
        again.close()
    with rp.TransitionBuffer(10, (2,)) as memory:
        with pytest.raises(InvalidArgument, match="commit.. is for durable buffers"):
            memory.commit()


# --- a server killed in a loop --------------------------------------------------------------------

CONFIG = """
address = "127.0.0.1:0"
name = "{name}"

[[stores]]
name = "s"
capacity = 16384
block_steps = 32
directory = "store"
backing = "file"
durable = true
fields = {{ x = {{ shape = [2], dtype = "int64" }} }}

[[tables]]
name = "t"
store = "s"
max_size = 16384
seed = 5
"""


def _serve(config_dir):
    """Starts ``reprise serve`` and returns ``(process, remote address, local address)``."""
    p = subprocess.Popen([sys.executable, "-m", "reprise.cli", "serve", "--config", "reprise.toml"], cwd=config_dir,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = p.stdout.readline()
    if not line.startswith("reprise serve: tables"):
        p.kill()
        raise AssertionError(f"reprise serve did not start: {line!r} {p.stderr.read()!r}")
    remote = line.split(" at ")[1].split(" ")[0]
    local = line.split("(local: ")[1].split(")")[0].split(",")[0]
    return p, remote, local


def test_a_durable_server_killed_in_a_loop_recovers_every_flushed_item(tmp_path, disk):
    config_dir = os.path.dirname(disk)
    with open(os.path.join(config_dir, "reprise.toml"), "w") as f:
        f.write(CONFIG.format(name=f"durable-{os.getpid()}"))
    flushed, lock, failures = set(), threading.Lock(), []
    first = 0
    for round in range(3):
        server, remote, local = _serve(config_dir)
        try:
            stop = threading.Event()

            def write(address, k, start):
                try:
                    with rp.Client(address) as c:
                        w = c.writer("t")
                        i = start
                        while not stop.is_set():
                            for _ in range(4):
                                w.append({"x": np.array([i, k])})
                                w.create_item("t", 1, 1.0)
                                i += 1
                            w.flush(timeout=10)
                            with lock:
                                flushed.update((v, k) for v in range(start, i))
                except rp.errors.RepriseError:
                    pass  # the server was killed under it
                except BaseException as e:  # noqa: BLE001 - reported by the test
                    failures.append(e)

            threads = [threading.Thread(target=write, args=(a, k, first)) for k, a in enumerate((local, remote))]
            for th in threads:
                th.start()
            # Until both writers have flushed twice (however slow the machine), then kill.
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and not failures:
                with lock:
                    counts = [sum(1 for v, k in flushed if k == writer and v >= first) for writer in (0, 1)]
                if min(counts) >= 8:
                    break
                time.sleep(0.05)
            assert min(counts) >= 8 and not failures, (counts, failures)
        finally:
            server.send_signal(signal.SIGKILL)
            server.wait()
            stop.set()
        for th in threads:
            th.join(timeout=30)
            assert not th.is_alive()
        assert not failures, failures
        first += 100_000
    # Once more, stopped cleanly (SIGTERM): the store closes, and the killed servers'
    # socket and lock are cleaned up by this one.
    server, _, _ = _serve(config_dir)
    server.send_signal(signal.SIGTERM)
    assert server.wait(timeout=60) == 0
    assert not os.path.exists(os.path.join(disk, "open"))
    store = rp.Store.open(disk)
    try:
        have = contents(store.tables["t"])
        lost = flushed - have
        assert not lost, f"{len(lost)} of {len(flushed)} flushed items lost"
        assert {k for _, k in have} == {0, 1}   # both the local and the remote writer's
    finally:
        store.close()


def test_reprise_serve_refuses_a_file_store_that_does_not_match_its_config(disk):
    config_dir = os.path.dirname(disk)
    with open(os.path.join(config_dir, "reprise.toml"), "w") as f:
        f.write(CONFIG.format(name=f"durable-m-{os.getpid()}"))
    store = rp.Store(SIG, capacity=8192, block_steps=32, directory=disk, backing="file", durable=True)
    store.close()
    r = subprocess.run([sys.executable, "-m", "reprise.cli", "serve", "--config", "reprise.toml"], cwd=config_dir,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert (f"stores[0] ('s'): the file store in {disk} has capacity 8192 and the config asks for 16384: make the "
            f"config match the store, or give it another directory") in r.stderr
    reopened = rp.Store.open(disk)   # left as it was, closed
    assert reopened.capacity == 8192
    reopened.close()
    meta = json.load(open(os.path.join(disk, "store.json")))
    assert meta["durable"] is True
