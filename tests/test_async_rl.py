"""Asynchronous RL for large models: item attributes, policy versions and bounded
staleness, token budgets, packing and splitting (in process; docs/async-rl.md)."""

import threading

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from test_selectors_stats import CHI2_999, chi_square

import reprise as rp

SIG = {"token": rp.Field((), "int32"), "logprob": rp.Field((), "float32"), "mask": rp.Field((), "bool")}
ATTRS = {"version": "int64", "reward": "float32", "group": "int64"}


def token_store(capacity=1 << 16, block_steps=256):
    return rp.Store(SIG, capacity=capacity, block_steps=block_steps)


def write(table, lengths, versions=None, start=0):
    """Writes one sequence per length; token j of sequence i is ``i * 100_000 + j``.
    Returns the keys."""
    keys = []
    with table.store.writer() as w:
        for k, n in enumerate(lengths):
            i = start + k
            toks = (i * 100_000 + np.arange(n)).astype(np.int32)
            w.extend({"token": toks, "logprob": -toks.astype(np.float32), "mask": toks % 2 == 0})
            v = 0 if versions is None else versions[k]
            keys.append(w.create_item(table, num_steps=n, priority=1.0,
                                      attributes={"version": v, "reward": float(i), "group": i}))
            w.end_episode()
    return np.array(keys, dtype=np.uint64)


def fingerprint(t):
    i = t.info()
    return (i["size"], i["num_inserts"], i["num_samples"], i["stale_removed"], i["stale_dropped"],
            tuple(map(tuple, t.items())))


# --- attributes -----------------------------------------------------------------------

def test_attributes_come_back_with_every_draw_in_their_dtypes():
    store = token_store()
    t = rp.Table("r", store, sampler=rp.selectors.Fifo(), max_size=100, attributes=ATTRS)
    assert t.attributes == ATTRS
    write(t, [3, 5])
    s = t.sample(2)
    assert {k: v.dtype.name for k, v in s.attributes.items()} == ATTRS
    assert s.attributes["reward"].tolist() == [0.0, 0.0] and s.attributes["group"].tolist() == [0, 0]
    keys = t.insert({"token": np.ones((2, 4), np.int32), "logprob": np.zeros((2, 4), np.float32),
                     "mask": np.ones((2, 4), bool)}, [1.0, 2.0], attributes={"version": 7, "reward": [0.5, 1.5],
                                                                             "group": np.array([9, 10])})
    found, ok = t.attributes_of(keys)
    assert ok.all() and found["reward"].tolist() == [0.5, 1.5] and found["version"].tolist() == [7, 7]
    torch = pytest.importorskip("torch")
    assert t.sample(1, device="cpu").attributes["group"].dtype == torch.int64  # torch, as the data


@pytest.mark.parametrize("attributes, message", [
    (None, "every item needs its attributes"),
    ({"version": 1, "reward": 1.0}, "attribute 'group' is missing"),
    ({"version": 1, "reward": 1.0, "group": 1, "extra": 2}, "no attribute 'extra'"),
    ({"version": 1.5, "reward": 1.0, "group": 1}, "would lose their kind"),
    ({"version": [1, 2, 3], "reward": 1.0, "group": 1}, "expected one value for every item, [1]"),
    ({"version": "x", "reward": 1.0, "group": 1}, "must be numeric"),
])
def test_bad_attributes_are_refused_and_change_nothing(attributes, message):
    store = token_store()
    t = rp.Table("r", store, max_size=100, attributes=ATTRS)
    write(t, [4])
    before = fingerprint(t)
    with store.writer() as w:
        w.extend({"token": np.zeros(2, np.int32), "logprob": np.zeros(2, np.float32), "mask": np.zeros(2, bool)})
        with pytest.raises((rp.errors.InvalidArgument, rp.errors.NotFound), match=message.replace("[", r"\[")):
            w.create_item(t, num_steps=2, priority=1.0, attributes=attributes)
    data = {"token": np.zeros((1, 2), np.int32), "logprob": np.zeros((1, 2), np.float32), "mask": np.zeros((1, 2), bool)}
    with pytest.raises((rp.errors.InvalidArgument, rp.errors.NotFound), match=message.replace("[", r"\[")):
        t.insert(data, 1.0, attributes=attributes)
    assert fingerprint(t) == before


def test_attribute_schemas_are_checked():
    store = token_store()
    with pytest.raises(rp.errors.InvalidArgument, match="attribute 'v' has dtype 'nope'"):
        rp.Table("a", store, attributes={"v": "nope"})
    with pytest.raises(rp.errors.InvalidArgument, match="needs an int64 attribute 'version'"):
        rp.Table("b", store, attributes={"reward": "float32"}, max_staleness=1)
    with pytest.raises(rp.errors.InvalidArgument, match="'version' to be int64"):
        rp.Table("c", store, attributes={"version": "float64"}, max_staleness=1)
    with pytest.raises(rp.errors.InvalidArgument, match="max_staleness must be >= 0"):
        rp.Table("d", store, attributes=ATTRS, max_staleness=-1)
    t = rp.Table("e", store)
    with pytest.raises(rp.errors.InvalidArgument, match="has no attributes"):
        t.insert({"token": np.zeros((1, 1), np.int32), "logprob": np.zeros((1, 1), np.float32),
                  "mask": np.zeros((1, 1), bool)}, 1.0, attributes={"x": 1})
    with pytest.raises(rp.errors.InvalidArgument, match="set_version needs an int64 attribute 'version'"):
        t.set_version(1)
    assert t.version is None and len(t) == 0


def test_update_attributes_writes_back_rewards_and_skips_evicted_keys():
    store = token_store()
    t = rp.Table("r", store, max_size=2, attributes=ATTRS)
    keys = write(t, [2, 2, 2])  # the first is evicted by the third
    assert t.update_attributes(keys, {"reward": [10.0, 11.0, 12.0]}) == 2
    found, ok = t.attributes_of(keys)
    assert ok.tolist() == [False, True, True] and found["reward"].tolist() == [0.0, 11.0, 12.0]
    before = fingerprint(t), t.attributes_of(keys)[0]["reward"].tolist()
    with pytest.raises(rp.errors.InvalidArgument, match="would lose their kind"):
        t.update_attributes(keys, {"reward": [1.0, 1.0, 1.0], "group": [0.5, 0.5, 0.5]})
    with pytest.raises(rp.errors.NotFound, match="no attribute 'nope'"):
        t.update_attributes(keys, {"nope": 1})
    with pytest.raises(rp.errors.InvalidArgument, match=r"expected one value for every item, \[3\]"):
        t.update_attributes(keys, {"reward": [1.0]})
    assert (fingerprint(t), t.attributes_of(keys)[0]["reward"].tolist()) == before


# --- versions and staleness -----------------------------------------------------------

def test_set_version_removes_stale_items_at_once_and_late_rollouts_are_dropped():
    store = token_store()
    t = rp.Table("r", store, max_size=1000, attributes=ATTRS, max_staleness=2)
    write(t, [2] * 6, versions=[0, 1, 2, 3, 4, 5])
    assert t.version == 0 and t.max_staleness == 2
    assert t.set_version(4) == 2  # versions 0 and 1 are below 4 - 2
    assert t.info()["stale_removed"] == 2 and len(t) == 4
    with pytest.raises(rp.errors.InvalidArgument, match="below the current version 4"):
        t.set_version(3)
    keys = write(t, [2, 2], versions=[1, 6], start=10)
    assert keys[0] == 0 and keys[1] != 0  # a late rollout is dropped, not an error
    assert t.info()["stale_dropped"] == 1
    s = t.sample(500)
    assert s.attributes["version"].min() >= 2
    st_ = t.stats()["staleness"]
    assert st_["version"] == 4 and st_["draws"] == 500 and st_["ahead"] == (s.attributes["version"] > 4).sum()
    assert sum(st_["behind"]) + st_["ahead"] == 500


def test_updating_a_version_under_max_staleness_is_refused():
    t = rp.Table("r", token_store(), attributes=ATTRS, max_staleness=0)
    keys = write(t, [1])
    with pytest.raises(rp.errors.InvalidArgument, match="version is fixed"):
        t.update_attributes(keys, {"version": 5, "reward": 1.0})
    assert t.attributes_of(keys)[0]["reward"].tolist() == [0.0]


@settings(max_examples=25, deadline=None)
@given(st.lists(st.one_of(st.tuples(st.just("insert"), st.lists(st.integers(-2, 10), min_size=1, max_size=4)),
                          st.tuples(st.just("version"), st.integers(0, 3)),
                          st.tuples(st.just("sample"), st.integers(1, 6))), min_size=1, max_size=25),
       st.integers(0, 2))
def test_staleness_matches_a_plain_model(ops, k):
    store = token_store(capacity=1 << 14, block_steps=64)
    t = rp.Table("r", store, max_size=10_000, attributes=ATTRS, max_staleness=k, seed=1)
    model, current, n = {}, 0, 0
    for op, arg in ops:
        if op == "insert":
            keys = write(t, [1] * len(arg), versions=arg, start=n)
            n += len(arg)
            for key, v in zip(keys, arg):
                assert (key == 0) == (v < current - k)
                if key:
                    model[int(key)] = v
        elif op == "version":
            current += arg
            before = len(model)
            model = {key: v for key, v in model.items() if v >= current - k}
            assert t.set_version(current) == before - len(model)
        elif model:
            s = t.sample(arg)
            assert all(model[int(key)] == v for key, v in zip(s.keys, s.attributes["version"]))
        assert sorted(int(i[0]) for i in t.items()) == sorted(model)


def committed(t) -> int:
    """Items a table took in or dropped as stale: what its writers committed."""
    i = t.info()
    return i["num_inserts"] + i["stale_dropped"]


def test_no_stale_item_is_drawn_while_writers_commit_and_the_version_moves():
    store = token_store(capacity=1 << 18, block_steps=256)
    t = rp.Table("r", store, max_size=100_000, attributes=ATTRS, max_staleness=1)
    stop = threading.Event()
    lock = threading.Lock()
    version = [0]
    bad = []

    def writer(seed):
        rng = np.random.default_rng(seed)
        with store.writer() as w:
            while not stop.is_set():
                v = version[0] - int(rng.integers(0, 3))  # some late, some current
                w.extend({"token": np.zeros(3, np.int32), "logprob": np.zeros(3, np.float32),
                          "mask": np.zeros(3, bool)})
                w.create_item(t, num_steps=3, priority=1.0, attributes={"version": v, "reward": 0.0, "group": 0})
                w.end_episode()

    def sampler():
        while not stop.is_set():
            with lock:
                floor = version[0] - 1  # set_version(version[0]) has returned
            try:
                s = t.sample(16, timeout=0.05)
            except rp.errors.Timeout:
                continue
            if (s.attributes["version"] < floor).any():
                bad.append((floor, s.attributes["version"].min()))

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(2)] + [threading.Thread(target=sampler)]
    for th in threads:
        th.start()
    try:
        import time
        for v in range(1, 40):
            # Each version sees commits (however slow the machine): the writers get to
            # write late items between bumps instead of the loop racing past them.
            seen, until = committed(t), time.monotonic() + 10
            while committed(t) < seen + 4 and time.monotonic() < until:
                time.sleep(0.001)
            with lock:
                t.set_version(v)
                version[0] = v
    finally:
        stop.set()
        for th in threads:
            th.join(timeout=30)
    assert not bad
    info = t.info()
    assert info["stale_removed"] + info["stale_dropped"] > 0
    assert all(v >= 38 for v in t.attributes_of([i[0] for i in t.items()])[0]["version"])


# --- token budgets, packing, splitting ------------------------------------------------

def expected_tokens(key_to_index, keys, lengths):
    return np.concatenate([(key_to_index[int(k)] * 100_000 + np.arange(n)).astype(np.int32)
                           for k, n in zip(keys, lengths)])


def test_a_token_budget_packs_whole_items_with_no_padding_anywhere():
    rng = np.random.default_rng(3)
    lengths = rng.integers(1, 300, size=60)
    store = token_store(capacity=1 << 16)
    t = rp.Table("r", store, max_size=1000, attributes=ATTRS, seed=5)
    keys = write(t, lengths)
    index = {int(k): i for i, k in enumerate(keys)}
    for budget in (300, 1000, 4096):
        s = t.sample(tokens=budget)
        assert 1 <= len(s) and s.num_steps <= budget
        assert s.packed_data["token"].shape == (s.num_steps,)
        p = s.packed()
        assert p.data["token"] is s.packed_data["token"]  # already packed: no copy
        assert p.cu_seqlens.dtype == np.int32 and p.cu_seqlens[0] == 0
        assert np.array_equal(np.diff(p.cu_seqlens), s.lengths) and p.total_steps == s.num_steps
        np.testing.assert_array_equal(p.data["token"], expected_tokens(index, s.keys, s.lengths))
        np.testing.assert_array_equal(p.data["logprob"], -p.data["token"].astype(np.float32))
        np.testing.assert_array_equal(p.position_ids, np.concatenate([np.arange(n) for n in s.lengths]))
        assert p.max_seqlen == s.lengths.max()
        assert s.attributes["reward"].tolist() == [float(index[int(k)]) for k in s.keys]
        # data pads on demand, to the longest.
        assert s.data["token"].shape == (len(s), s.lengths.max())
        for i, n in enumerate(s.lengths):
            assert (s.data["token"][i, n:] == 0).all()


@pytest.mark.parametrize("where", ["gpu-path", "device-store"])
def test_a_device_gathers_a_token_sample_packed_as_the_host_does(where):
    """The GPU path (emulated on the CPU: the same code with "cuda" mapped to the
    CPU) gathers a token sample straight into the packed layout, one row number per
    step: from host memory with device="cuda", from a device store's columns. Same
    seed, same draw: the packed rows, lengths, keys and attributes equal the host's."""
    torch = pytest.importorskip("torch")
    rt = pytest.importorskip("reprise.torch")
    from reprise.torch.collect import wait_released
    rt.emulate_cuda(True)
    try:
        lengths = np.random.default_rng(8).integers(1, 200, size=40)
        host_store = token_store()
        host = rp.Table("h", host_store, max_size=100, seed=9)
        other_store = token_store() if where == "gpu-path" else rp.Store(SIG, capacity=1 << 16, block_steps=256,
                                                                         device="cuda")
        other = rp.Table("o", other_store, max_size=100, seed=9)
        for table in (host, other):
            with table.store.writer() as w:
                for i, n in enumerate(lengths):
                    toks = (i * 100_000 + np.arange(n)).astype(np.int32)
                    w.extend({"token": toks, "logprob": -toks.astype(np.float32), "mask": toks % 2 == 0})
                    w.create_item(table, num_steps=int(n), priority=1.0)
                    w.end_episode()
        for budget in (250, 2000):
            want = host.sample(tokens=budget)
            got = other.sample(tokens=budget, device="cuda" if where == "gpu-path" else None)
            assert got.packed_data is not None
            assert np.array_equal(got.keys & 0xFFFFFFFF, want.keys & 0xFFFFFFFF)  # the same slots
            assert np.array_equal(got.lengths, want.lengths) and got.table_size == want.table_size
            for name in SIG:
                g = got.packed_data[name]
                g = g.cpu().numpy() if torch.is_tensor(g) else g
                assert g.shape == (want.num_steps,)
                np.testing.assert_array_equal(g, want.packed_data[name])
            p = got.packed()
            assert p.total_steps == want.num_steps and np.array_equal(np.asarray(p.cu_seqlens),
                                                                      want.packed().cu_seqlens)
            padded = got.data["token"]
            padded = padded.cpu().numpy() if torch.is_tensor(padded) else padded
            np.testing.assert_array_equal(padded, want.data["token"])  # padded on demand, zeros past the end
        with pytest.raises(rp.errors.InvalidArgument, match="more than the whole token budget of 1"):
            other.sample(tokens=1, device="cuda" if where == "gpu-path" else None)
        assert other.info()["num_samples"] == host.info()["num_samples"]
        wait_released(10)
        host_store.close()
        other_store.close()
    finally:
        rt.emulate_cuda(False)


def test_a_padded_sample_packs_to_the_same_layout():
    store = token_store()
    t = rp.Table("r", store, sampler=rp.selectors.Fifo(), max_size=100, attributes=ATTRS)
    write(t, [5, 2, 7])
    s = t.sample(3)
    p = s.packed(fields=["token"])
    assert list(p.data) == ["token"] and p.cu_seqlens.tolist() == [0, 5, 10, 15]
    with pytest.raises(rp.errors.InvalidArgument, match="unknown field 'nope'"):
        s.packed(fields=["nope"])
    torch = pytest.importorskip("torch")
    q = t.sample(tokens=12).packed(device="cpu")
    assert isinstance(q.data["token"], torch.Tensor) and isinstance(q.cu_seqlens, torch.Tensor)
    assert q.cu_seqlens.dtype == torch.int32


def test_token_budget_bad_inputs_change_nothing():
    store = token_store()
    t = rp.Table("r", store, sampler=rp.selectors.Fifo(), max_size=100, attributes=ATTRS)
    write(t, [50, 10])
    before = fingerprint(t)
    with pytest.raises(rp.errors.InvalidArgument, match="50 steps, more than the whole token budget of 49"):
        t.sample(tokens=49)
    with pytest.raises(rp.errors.InvalidArgument, match="n or tokens, not both"):
        t.sample(4, tokens=100)
    with pytest.raises(rp.errors.InvalidArgument, match="needs n"):
        t.sample()
    with pytest.raises(rp.errors.InvalidArgument, match="tokens must be >= 1"):
        t.sample(tokens=0)
    with pytest.raises(rp.errors.NotFound, match="unknown field 'nope'"):
        t.sample(tokens=100, fields=["nope"])
    assert fingerprint(t) == before
    with pytest.raises(rp.errors.Timeout):
        rp.Table("empty", store, attributes=ATTRS).sample(tokens=10, timeout=0.05)


def test_token_budget_picks_follow_the_sampler_distribution():
    """Equal-length items under Uniform: every pick of a budget draw is uniform, so
    item counts over many draws pass a chi-square test; under Prioritized with
    unequal priorities (the negative control) they fail it."""
    def counts(sampler, priorities):
        store = token_store(capacity=1 << 14, block_steps=64)
        t = rp.Table("r", store, sampler=sampler, max_size=100, attributes=ATTRS, seed=11)
        keys = write(t, [4] * 20)
        t.update_priorities(keys, priorities)
        c = {int(k): 0 for k in keys}
        for _ in range(300):
            for k in t.sample(tokens=40).keys:
                c[int(k)] += 1
        return np.array(list(c.values()))

    uniform = counts(rp.selectors.Uniform(), np.ones(20))
    assert uniform.sum() == 3000
    assert chi_square(uniform, np.full(20, 1 / 20)) < CHI2_999[19]
    skewed = counts(rp.selectors.Prioritized(1.0), np.linspace(0.1, 2.0, 20))
    assert chi_square(skewed, np.full(20, 1 / 20)) > 3 * CHI2_999[19]


def test_split_balances_tokens_and_keeps_every_item_exactly_once():
    rng = np.random.default_rng(9)
    store = token_store(capacity=1 << 17)
    t = rp.Table("r", store, max_size=1000, attributes=ATTRS, seed=2)
    keys = write(t, rng.integers(1, 2000, size=80))
    index = {int(k): i for i, k in enumerate(keys)}
    s = t.sample(tokens=30_000)
    for k in (1, 3, 4, 8):
        parts = s.split(k, balance="tokens")
        assert len(parts) == k
        assert sorted(np.concatenate([p.keys for p in parts]).tolist()) == sorted(s.keys.tolist())
        loads = [p.num_steps for p in parts]
        assert sum(loads) == s.num_steps
        assert max(loads) - min(loads) <= s.lengths.max()  # LPT: within one longest item
        for p in parts:
            q = p.packed()
            np.testing.assert_array_equal(q.data["token"], expected_tokens(index, p.keys, p.lengths))
            assert p.attributes["reward"].tolist() == [float(index[int(x)]) for x in p.keys]
    assert [len(p) for p in s.split(2, balance="items")] in ([len(s) // 2, len(s) - len(s) // 2],
                                                             [len(s) - len(s) // 2, len(s) // 2])
    with pytest.raises(rp.errors.InvalidArgument, match="k must be an int >= 1"):
        s.split(0)
    with pytest.raises(rp.errors.InvalidArgument, match="balance must be"):
        s.split(2, balance="bytes")


def test_million_token_batches_draw_and_pack():
    store = token_store(capacity=1 << 21, block_steps=4096)
    t = rp.Table("r", store, max_size=1000, attributes=ATTRS, seed=4)
    write(t, [16_384] * 100)
    s = t.sample(tokens=1 << 20)
    assert s.num_steps == 64 * 16_384 and s.packed().total_steps == 1 << 20


# --- consume once, partial rollouts, checkpoints --------------------------------------

def test_a_queue_of_versioned_rollouts_hands_each_out_once_by_token_budget():
    store = token_store()
    q = rp.Table.queue("rollouts", store, max_size=100, attributes=ATTRS, max_staleness=0)
    write(q, [10] * 6, versions=[0, 0, 1, 1, 1, 1])
    q.set_version(1)
    assert len(q) == 4
    a = q.sample(tokens=25)
    b = q.sample(tokens=25)
    assert len(a) == 2 and len(b) == 2 and len(q) == 0
    assert set(a.keys.tolist()).isdisjoint(b.keys.tolist())
    with pytest.raises(rp.errors.InvalidArgument, match="unexpected setting 'group_sizes'"):
        rp.Table.queue("x", store, max_size=4, group_sizes=2)


def test_a_partial_rollout_is_resumed_by_another_worker_with_per_token_versions():
    """verl/AReaL partial rollouts with the primitives: a queue of partial sequences
    whose steps carry the version that generated them; the next worker takes one
    (consume once), extends it under the new policy and puts it back or finishes it."""
    sig = {"token": rp.Field((), "int32"), "version": rp.Field((), "int64")}
    store = rp.Store(sig, capacity=1 << 12, block_steps=64)
    partial = rp.Table.queue("partial", store, max_size=16, attributes={"version": "int64"})
    done = rp.Table("done", store, max_size=16, attributes={"version": "int64"})
    with store.writer() as w:  # worker A generates 5 tokens under version 3, then weights change
        w.extend({"token": np.arange(5, dtype=np.int32), "version": np.full(5, 3)})
        w.create_item(partial, num_steps=5, priority=1.0, attributes={"version": 3})
    s = partial.sample(1)  # worker B picks it up under version 4
    n = int(s.lengths[0])
    prefix = {k: v[0, :n] for k, v in s.data.items()}
    with store.writer() as w:
        w.extend(prefix)
        w.extend({"token": np.arange(5, 9, dtype=np.int32), "version": np.full(4, 4)})
        w.create_item(done, num_steps=9, priority=1.0, attributes={"version": 3})  # oldest token's version
    out = done.sample(1)
    assert len(partial) == 0
    assert out.data["version"][0].tolist() == [3] * 5 + [4] * 4
    assert out.data["token"][0].tolist() == list(range(9))
    assert out.attributes["version"].tolist() == [3]


def test_attributes_versions_and_staleness_figures_survive_a_checkpoint(tmp_path):
    store = token_store()
    t = rp.Table("r", store, max_size=1000, attributes=ATTRS, max_staleness=1, seed=3)
    write(t, [3, 4, 5, 6], versions=[0, 1, 2, 2])
    t.set_version(2)
    write(t, [2], versions=[0], start=9)  # dropped
    t.sample(10)
    path = rp.checkpoint.save(tmp_path, [t])
    loaded = rp.checkpoint.load(path)
    try:
        u = loaded["r"]
        assert u.attributes == ATTRS and u.max_staleness == 1 and u.version == 2
        for k in ("size", "stale_removed", "stale_dropped", "version"):
            assert u.info()[k] == t.info()[k]
        keys = [i[0] for i in t.items()]
        a, b = t.attributes_of(keys)[0], u.attributes_of(keys)[0]
        assert all(np.array_equal(a[k], b[k]) for k in ATTRS)
        assert u.stats()["staleness"] == t.stats()["staleness"]
        assert u.set_version(3) == 1  # the version index was rebuilt
        assert u.sample(tokens=20).attributes["version"].min() >= 2
    finally:
        for s in {id(x.store): x.store for x in loaded.values()}.values():
            s.close()


# --- groups ---------------------------------------------------------------------------

def grouped_table(store, G=4, name="g", **kw):
    return rp.Table(name, store, max_size=kw.pop("max_size", 1000), attributes=ATTRS, group_size=G, **kw)


def write_groups(table, groups, G, length=lambda i: 3, version=0, start=0):
    """Writes G sequences for each group id, members interleaved across groups."""
    keys = {}
    with table.store.writer() as w:
        for j in range(G):
            for g in groups:
                i = start + g * G + j
                n = length(i)
                toks = (i * 100_000 + np.arange(n)).astype(np.int32)
                w.extend({"token": toks, "logprob": np.zeros(n, np.float32), "mask": np.ones(n, bool)})
                keys.setdefault(g, []).append(w.create_item(table, num_steps=n, priority=1.0,
                                                            attributes={"version": version, "reward": float(j),
                                                                        "group": g}))
                w.end_episode()
    return keys


def test_groups_become_sampleable_whole_and_come_back_side_by_side():
    store = token_store()
    t = grouped_table(store, G=4, seed=3)
    write_groups(t, [0, 1, 2], 3)  # three members each: none complete
    assert len(t) == 0 and t.info()["groups"]["pending"] == 3 and t.info()["groups"]["pending_items"] == 9
    with pytest.raises(rp.errors.Timeout):
        t.sample(4, timeout=0.05)
    write_groups(t, [0, 1], 1, start=1000)
    assert len(t) == 8 and t.info()["groups"]["live"] == 2
    s = t.sample(8)
    g = s.attributes["group"]
    assert len(s) == 8 and (g[:4] == g[0]).all() and (g[4:] == g[4]).all()
    assert s.table_size == 2  # a draw picks among groups
    with pytest.raises(rp.errors.InvalidArgument, match="multiple of group_size"):
        t.sample(6)
    before = fingerprint(t)
    with pytest.raises(rp.errors.InvalidArgument, match="group 0 cannot take 1 more"):
        write_groups(t, [0], 1, start=2000)
    assert fingerprint(t) == before
    parts = t.sample(tokens=100).split(2, balance="tokens")
    assert sum(len(p) for p in parts) % 4 == 0
    q = t.sample(8, packed=True)  # whole groups, their rows end to end with no padding
    assert q.packed_data["token"].shape == (q.num_steps,) and q.packed().data["token"] is q.packed_data["token"]
    assert (q.attributes["group"][:4] == q.attributes["group"][0]).all()
    keys = [i[0] for i in t.items()]
    rewards = t.attributes_of(keys)[0]["reward"].tolist()
    with pytest.raises(rp.errors.InvalidArgument, match="group is fixed"):
        t.update_attributes(keys, {"reward": 5.0, "group": 9})
    assert t.attributes_of(keys)[0]["reward"].tolist() == rewards


def test_group_selection_probabilities_follow_priority_sums():
    store = token_store(capacity=1 << 14, block_steps=64)
    t = grouped_table(store, G=2, sampler=rp.selectors.Prioritized(1.0), seed=8)
    keys = write_groups(t, [0, 1, 2], 2)
    prio = {0: [1.0, 1.0], 1: [2.0, 2.0], 2: [0.5, 3.5]}  # sums 2, 4, 4
    for g, ks in keys.items():
        t.update_priorities(ks, prio[g])
    counts = np.zeros(3)
    for _ in range(1000):
        s = t.sample(2)
        counts[s.attributes["group"][0]] += 1
        assert s.probabilities[0] == pytest.approx(sum(prio[s.attributes["group"][0]]) / 10)
    assert chi_square(counts, [0.2, 0.4, 0.4]) < CHI2_999[2]
    assert chi_square(counts, [1 / 3, 1 / 3, 1 / 3]) > CHI2_999[2]  # negative control: per-item or uniform is wrong


def test_stragglers_time_out_without_blocking_other_groups():
    store = token_store()
    drop = grouped_table(store, G=3, name="drop", group_timeout=0.15, on_group_timeout="drop")
    part = grouped_table(store, G=3, name="part", group_timeout=0.15, on_group_timeout="partial")
    for t in (drop, part):
        write_groups(t, [5], 2)  # a straggler never arrives
        write_groups(t, [6], 3, start=100)
        assert len(t) == 3  # the complete group is sampleable at once
        assert set(t.sample(3).attributes["group"]) == {6}
    # A sampler waiting on a table with only a straggler group wakes when its
    # timeout admits it as it is.
    wake = grouped_table(store, G=3, name="wake", group_timeout=0.15, on_group_timeout="partial")
    write_groups(wake, [5], 2)
    s = wake.sample(3, timeout=5)
    assert s.attributes["group"].tolist() == [5, 5] and wake.info()["groups"]["partial"] == 1
    import time
    time.sleep(0.2)
    assert len(part) == 5 and part.info()["groups"]["partial"] == 1
    assert len(drop) == 3 and drop.info()["groups"]["dropped"] == 1 and drop.info()["groups"]["pending"] == 0
    with pytest.raises(rp.errors.InvalidArgument, match="on_group_timeout must be 'drop' or 'partial'"):
        grouped_table(store, name="bad", group_timeout=1, on_group_timeout="wait")
    with pytest.raises(rp.errors.InvalidArgument, match="group_timeout must be a finite number"):
        grouped_table(store, name="bad", group_timeout=-1)
    with pytest.raises(rp.errors.InvalidArgument, match="needs an int64 attribute 'group'"):
        rp.Table("bad", store, attributes={"version": "int64"}, group_size=2)
    with pytest.raises(rp.errors.InvalidArgument, match="group_timeout is for tables with group_size"):
        rp.Table("bad", store, attributes=ATTRS, group_timeout=1.0)


def test_groups_versions_and_token_budgets_combine():
    store = token_store()
    t = grouped_table(store, G=2, max_staleness=0)
    write_groups(t, [0, 1], 2, length=lambda i: 10, version=0)
    t.set_version(1)
    assert len(t) == 0 and t.info()["stale_removed"] == 4
    write_groups(t, [2, 3, 4], 2, length=lambda i: 10, version=1, start=100)
    s = t.sample(tokens=45)  # two groups of 20 tokens fit, a third does not
    assert len(s) == 4 and s.num_steps == 40
    with pytest.raises(rp.errors.InvalidArgument, match="drawn group has 20 steps, more than the whole token budget of 19"):
        t.sample(tokens=19)
    q = rp.Table.queue("q", store, max_size=10, attributes=ATTRS, group_size=2)
    write_groups(q, [0, 1], 2)
    a, b = q.sample(2), q.sample(2)
    assert {a.attributes["group"][0], b.attributes["group"][0]} == {0, 1} and len(q) == 0


def test_incomplete_groups_survive_a_checkpoint(tmp_path):
    store = token_store()
    t = grouped_table(store, G=3, seed=2)
    write_groups(t, [0, 1], 3)
    write_groups(t, [2], 2, start=100)
    path = rp.checkpoint.save(tmp_path, [t])
    loaded = rp.checkpoint.load(path)
    try:
        u = loaded["g"]
        assert u.info()["groups"] == t.info()["groups"]
        assert len(u) == 6
        write_groups(u, [2], 1, start=200)  # the pending group completes after the load
        assert len(u) == 9 and u.info()["groups"]["live"] == 3
        s = u.sample(9)
        assert all((s.attributes["group"][k:k + 3] == s.attributes["group"][k]).all() for k in (0, 3, 6))
    finally:
        for s in {id(x.store): x.store for x in loaded.values()}.values():
            s.close()


# --- over clients ---------------------------------------------------------------------

@pytest.fixture(params=["local", "remote"])
def served(request):
    """A grouped, versioned table served in process; yields (table, client)."""
    store = token_store(capacity=1 << 21, block_steps=4096)
    t = rp.Table("g", store, max_size=100_000, attributes=ATTRS, max_staleness=1, seed=6)
    u = rp.Table("u", store, max_size=100_000, attributes=ATTRS, seed=7)
    server = rp.Server([t, u], address="127.0.0.1:0")
    address = server.local_address if request.param == "local" else server.address
    client = rp.Client(address)
    try:
        yield t, u, client, request.param
    finally:
        client.close()
        server.stop()
        store.close()


def test_attributes_versions_and_budgets_over_a_client(served):
    t, u, c, kind = served
    assert c.attributes("u") == ATTRS
    with c.writer("u") as w:
        for i, n in enumerate([3, 5, 7]):
            toks = (i * 100_000 + np.arange(n)).astype(np.int32)
            w.extend({"token": toks, "logprob": np.zeros(n, np.float32), "mask": np.ones(n, bool)})
            w.create_item("u", num_steps=n, priority=1.0, attributes={"version": i, "reward": i / 2, "group": i})
            w.end_episode()
        with pytest.raises(rp.errors.InvalidArgument, match="attribute 'group' is missing"):
            w.create_item("u", num_steps=1, priority=1.0, attributes={"version": 0, "reward": 0.0})
    s = c.sample("u", 8)
    by_key = dict(zip((int(i[0]) for i in u.items()), range(3)))
    assert [by_key[int(k)] for k in s.keys] == s.attributes["group"].tolist()
    assert s.attributes["reward"].dtype == np.float32
    p = c.sample("u", tokens=15).packed()
    assert p.total_steps <= 15 and p.cu_seqlens[-1] == p.total_steps
    groups = c.sample("u", tokens=15).attributes["group"]
    np.testing.assert_array_equal(p.data["token"][:0], np.zeros(0, np.int32))
    assert set(groups.tolist()) <= {0, 1, 2}
    assert c.update_attributes("u", [i[0] for i in u.items()], {"reward": 9.0}) == 3
    assert (u.attributes_of([i[0] for i in u.items()])[0]["reward"] == 9.0).all()
    with pytest.raises(rp.errors.InvalidArgument, match="would lose their kind"):
        c.update_attributes("u", [1], {"group": 0.5})
    assert c.set_version("u", 2) == 0 and u.version == 2 and c.info()["u"]["version"] == 2
    with pytest.raises(rp.errors.InvalidArgument, match="below the current version 2"):
        c.set_version("u", 1)
    with pytest.raises(rp.errors.InvalidArgument, match="n or tokens"):
        c.sample("u", 2, tokens=3)


def test_million_token_batches_over_a_client(served):
    t, u, c, kind = served
    with c.writer("u") as w:
        for i in range(64):
            w.extend({"token": np.full(16_384, i, np.int32), "logprob": np.zeros(16_384, np.float32),
                      "mask": np.ones(16_384, bool)})
            w.create_item("u", num_steps=16_384, priority=1.0, attributes={"version": 0, "reward": 0.0, "group": i})
            w.end_episode()
    s = c.sample("u", tokens=1 << 20)
    p = s.packed()
    assert p.total_steps == 1 << 20 and len(s) == 64
    np.testing.assert_array_equal(p.data["token"][::16_384], u.attributes_of(s.keys)[0]["group"].astype(np.int32))


def test_group_members_from_several_processes_while_the_version_moves(served):
    """Two processes commit interleaved group members through clients while this
    one moves the version and draws: no draw returns a stale or incomplete group,
    and every item written is accounted for (in the table, pending, removed as
    stale or dropped as stale)."""
    import multiprocessing as mp
    import queue
    import time

    from async_rl_workers import write_groups

    _, _, c, kind = served
    store = token_store(capacity=1 << 18, block_steps=256)
    g = rp.Table("grp", store, max_size=100_000, attributes=ATTRS, max_staleness=1, group_size=3)
    server = rp.Server([g], address="127.0.0.1:0")
    address = server.local_address if kind == "local" else server.address
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=write_groups, args=(address, "grp", w, 60, 3, out)) for w in range(2)]
    try:
        for p in procs:
            p.start()
        deadline = time.monotonic() + 60
        version, bad = 0, []
        while any(p.is_alive() for p in procs) and time.monotonic() < deadline:
            version += 1
            g.set_version(version)
            if len(g) >= 3:
                s = g.sample(3, timeout=1)
                ids, versions = s.attributes["group"], s.attributes["version"]
                if len(set(ids.tolist())) != 1 or len(ids) != 3 or versions.min() < version - 1:
                    bad.append((ids.tolist(), versions.tolist(), version))
            time.sleep(0.01)
        results = []
        while len(results) < len(procs) and time.monotonic() < deadline + 30:
            try:
                results.append(out.get(timeout=1))
            except queue.Empty:
                if not any(p.is_alive() for p in procs):
                    break
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
        server.stop()
        store.close()
    assert not bad
    assert len(results) == 2, "a writer process failed (see its traceback above)"
    written = sum(results)
    info = g.info()
    assert written == info["num_inserts"] + info["stale_dropped"]
    assert info["num_inserts"] == info["size"] + info["groups"]["pending_items"] + info["stale_removed"]


def runs(ids) -> list[int]:
    """The lengths of the runs of equal values in ``ids``."""
    ids = list(ids)
    out = []
    for i, g in enumerate(ids):
        if i and ids[i - 1] == g:
            out[-1] += 1
        else:
            out.append(1)
    return out


def test_split_can_keep_groups_whole():
    """split(k, groups=True): each drawn group's members land in one part, side by
    side, and the parts' token sums stay within one group of each other (LPT over
    the drawn groups). The plain split is the negative control: it cuts groups."""
    G = 4
    store = token_store(capacity=1 << 17)
    t = grouped_table(store, G=G, seed=6)
    write_groups(t, range(30), G, length=lambda i: 1 + (i * 37) % 90)
    s = t.sample(tokens=3000)
    assert all(r % G == 0 for r in runs(s.attributes["group"].tolist()))
    group_steps = max(int(s.lengths[i:i + G].sum()) for i in range(0, len(s), G))
    for k in (2, 3, 5):
        parts = s.split(k, groups=True)
        assert sorted(np.concatenate([p.keys for p in parts]).tolist()) == sorted(s.keys.tolist())
        for p in parts:
            assert all(r % G == 0 for r in runs(p.attributes["group"].tolist()))
        loads = [p.num_steps for p in parts]
        assert max(loads) - min(loads) <= 2 * group_steps  # a run may hold one group drawn twice
    assert any(r % G for p in s.split(3) for r in runs(p.attributes["group"].tolist()))  # the control
    with pytest.raises(rp.errors.InvalidArgument, match="needs the attribute 'group'"):
        rp.Sample(keys=s.keys, probabilities=s.probabilities, priorities=s.priorities,
                  times_sampled=s.times_sampled, table_size=s.table_size, lengths=s.lengths).split(2, groups=True)
    store.close()
