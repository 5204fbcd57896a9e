"""Cluster mode (rp.distributed.ShardedTable) on spawned gloo ranks: exactness
against the single-table reference, determinism, routing, rows, topology, rate
limiting, failures and checkpoints. Every collective has a timeout and every
run a deadline (tests/cluster_ranks.py): nothing here can hang."""

from __future__ import annotations

import hashlib
import os

import numpy as np
import pytest

import reprise as rp
from cluster_ranks import run_ranks

torch = pytest.importorskip("torch")

SIG = {"x": rp.Field((), "int64"), "v": rp.Field((3,), "float32")}


def sampler_of(name):
    return rp.selectors.Prioritized(0.7) if name == "Prioritized" else getattr(rp.selectors, name)()


def shard_ops(seed, shard, step, world):
    """Deterministic inserts of one shard at one step: (n, T, priorities). Shard 0
    stays empty; the last shard gets zero priorities (zero mass)."""
    rng = np.random.default_rng([seed, shard, step])
    if shard == 0 and world > 2:
        return 0, 1, np.zeros(0)
    n = int(rng.integers(1, 6)) + shard
    pr = rng.uniform(0.1, 5.0, n)
    if shard == world - 1:
        pr[:] = 0.0
    return n, int(rng.integers(1, 4)), pr


def items_of(seed, shard, step, n, T):
    x = (seed * 1_000_000 + shard * 10_000 + step * 100 + np.arange(n))[:, None] + np.zeros((1, T), dtype=np.int64)
    v = np.broadcast_to(x[..., None].astype(np.float32) * 0.5, (n, T, 3)).copy()
    return {"x": x, "v": v}


def make_table(sampler, seed, world, max_times=0, **kw):
    return rp.distributed.ShardedTable(
        "replay", SIG, capacity_per_shard=4096, sampler=sampler_of(sampler), seed=seed, shards="rank",
        timeout=20, max_times_sampled=max_times, block_steps=4, **kw)


def _exact_body(rank, world, samplers, seeds, steps, max_times, batch, vary=False):
    """Every rank runs the sharded table; rank 0 also replays every shard's
    operations on plain tables and compares each step's global draw. ``vary``: the
    batch changes from step to step and the exchange's reused buffers are poisoned
    (0xA5) after each, so a stale byte shows."""
    results = []
    for sampler in samplers:
        for seed in seeds:
            t = make_table(sampler, seed, world, max_times, assignment="iid")
            t._poison = vary
            ref = None
            if rank == 0:
                stores = [rp.Store(SIG, capacity=4096, block_steps=4) for _ in range(world)]
                ref = rp.distributed.ReferenceTable(
                    [rp.Table("replay", s, sampler=sampler_of(sampler), max_times_sampled=max_times) for s in stores],
                    seed=seed)
            for step in range(steps):
                for shard in range(world):
                    n, T, pr = shard_ops(seed, shard, step, world)
                    if n == 0:
                        continue
                    data = items_of(seed, shard, step, n, T)
                    if shard == rank:
                        t.insert(data, pr)
                    if ref is not None:
                        ref.tables[shard].insert(data, pr)
                if step == 2:  # routed updates and deletes: each rank sends the next shard's keys
                    shard_keys = route_keys(t, rank, world)
                    upd = t.update_priorities(shard_keys[::2], np.linspace(0.5, 2.0, len(shard_keys[::2])))
                    dele = t.delete(shard_keys[1::3])
                    if ref is not None:
                        apply_reference_routing(ref, world)
                    results.append((sampler, seed, step, "routed", upd, dele))
                b = batch * (1 + step % 3) if vary else batch
                s = t.sample(b // len(t.consumers))  # b: the global draw
                past = np.arange(s.data["x"].shape[1])[None, :] >= s.lengths[:, None]
                assert (s.data["x"][past] == 0).all() and (s.data["v"][past] == 0).all()  # zeros past each item
                got = t._g.all_gather_object((s.keys.tolist(), s.probabilities.tolist(), s.table_size,
                                              s.data["x"][:, 0].tolist(), s.lengths.tolist()), "test gather")
                if ref is not None:
                    want = ref.sample(b)
                    keys = sum((g[0] for g in got), [])
                    probs = sum((g[1] for g in got), [])
                    assert keys == want["keys"].tolist(), (sampler, seed, step, keys, want["keys"].tolist())
                    assert probs == want["probabilities"].tolist(), (sampler, seed, step)
                    assert all(g[2] == want["table_size"] for g in got)
                    for g in got:  # each row's data is its item's (x encodes seed/shard/step)
                        for key, x in zip(g[0], g[3]):
                            assert x // 10_000 % 100 == key >> 52, (key, x)
                results.append((sampler, seed, step, hashlib.sha256(repr(got).encode()).hexdigest()))
            t.close()
    return results


def route_keys(t, rank, world):
    """The global keys this rank routes at step 2: half of the next shard's items,
    learned from that shard's owner through a gather (each rank sends its own)."""
    own = t.local_table.items()
    mine = rp._native.cluster.global_keys(rank, np.array([k for k, *_ in own], dtype=np.uint64))
    every = t._g.all_gather_object(mine.tolist(), "test routing")
    return np.array(every[(rank + 1) % world], dtype=np.uint64)


def apply_reference_routing(ref, world):
    """What the routed calls did, replayed on the reference tables."""
    for r in range(world):
        target = (r + 1) % world
        local = np.array([k for k, *_ in ref.tables[target].items()], dtype=np.uint64)
        ref.tables[target].update_priorities(local[::2], np.linspace(0.5, 2.0, len(local[::2])))
        ref.tables[target].delete(local[1::3])


@pytest.mark.parametrize("world", [2, 3, 4])
def test_random_selectors_draw_exactly_the_reference(world):
    seeds = range(10) if world == 3 else range(0, 10, 3)
    out = run_ranks(world, _exact_body, ("Uniform", "Prioritized"), seeds, 4, 0, 12 * world)
    assert out[0] == out[1]


def test_reused_buffers_carry_nothing_between_steps_of_changing_batches():
    out = run_ranks(3, _exact_body, ("Uniform", "Prioritized", "Fifo"), (1, 4), 5, 0, 9, True)
    assert out[0] == out[1] == out[2]


def test_ordered_selectors_draw_exactly_the_reference():
    samplers = ("Fifo", "Lifo", "MaxHeap", "MinHeap", "TopK")
    run_ranks(3, _exact_body, samplers, (0, 1), 4, 0, 9)
    run_ranks(3, _exact_body, samplers, (2,), 4, 1, 3)


def test_same_seed_gives_identical_batches_across_runs():
    a = run_ranks(2, _exact_body, ("Prioritized",), (5,), 3, 0, 8)
    b = run_ranks(2, _exact_body, ("Prioritized",), (5,), 3, 0, 8)
    assert a == b


def test_plan_distribution_matches_priorities_and_the_negative_control_fails():
    """Chi-square over items of three shards (one process: the same plan
    arithmetic the ranks run, checked against them above)."""
    stores = [rp.Store(SIG, capacity=4096, block_steps=4) for _ in range(3)]
    tables = [rp.Table("replay", s, sampler=rp.selectors.Prioritized(1.0)) for s in stores]
    prios = [np.array([1.0, 2.0]), np.array([3.0, 4.0, 5.0]), np.array([10.0])]
    for t, p in zip(tables, prios):
        t.insert({"x": np.zeros((len(p), 1), np.int64), "v": np.zeros((len(p), 1, 3), np.float32)}, p)
    ref = rp.distributed.ReferenceTable(tables, seed=1)
    counts = {}
    for _ in range(200):
        for k in ref.sample(100)["keys"].tolist():
            counts[k] = counts.get(k, 0) + 1
    keys = [int(rp._native.cluster.global_keys(s, np.array([k], np.uint64))[0])
            for s, t in enumerate(tables) for k, *_ in t.items()]
    observed = np.array([counts.get(k, 0) for k in keys], dtype=float)
    p = np.concatenate(prios)
    expected = observed.sum() * p / p.sum()
    chi = ((observed - expected) ** 2 / expected).sum()
    assert chi < 24.3  # 5 degrees of freedom, 0.9999 quantile 25.7
    equal_per_shard = observed.sum() * np.concatenate([np.full(len(q), 1 / 3 / len(q)) for q in prios])
    assert ((observed - equal_per_shard) ** 2 / equal_per_shard).sum() > 100
    for s in stores:
        s.close()


def _topology_body(rank, world):
    t = rp.distributed.ShardedTable("replay", SIG, capacity_per_shard=1024, shards="rank", seed=0, timeout=20,
                                    topology=(2, 2), block_steps=4)
    n = 3 if rank % 2 else 5  # windows of 3 steps over blocks of 4: crossing block boundaries
    t.insert(items_of(0, rank, 0, n, 3), np.ones(n))
    out = []
    for _ in range(3):
        s = t.sample(4)
        if s is None:
            out.append(None)
            continue
        for key, x, v, length in zip(s.keys, s.data["x"], s.data["v"], s.lengths):
            assert length == 3 and (x == x[0]).all() and np.allclose(v, x[:, None] * 0.5)
            assert x[0] // 10_000 % 100 == int(key) >> 52
        out.append(len(s))
    return out


def test_pipeline_grid_only_first_stage_receives_and_rows_hold_their_items():
    out = run_ranks(4, _topology_body)
    assert out[0] == out[1] == [4, 4, 4]
    assert out[2] == out[3] == [None, None, None]


def _limiter_body(rank, world):
    t = rp.distributed.ShardedTable("q", SIG, capacity_per_shard=1024, shards="rank", seed=0, timeout=20,
                                    rate_limiter=rp.rate_limiters.SampleToInsertRatio(1.0, 1, 4.0))
    if rank == 0:
        t.insert(items_of(0, 0, 0, 4, 1), np.ones(4))
    got = [len(t.sample(2)) if rank in t.consumers else None]
    try:
        t.sample(2, timeout=0.5)  # 4 inserts, 4 samples: the ratio forbids more, on every rank
        got.append("sampled")
    except rp.errors.Timeout as e:
        got.append("timeout" if "rate limiter" in str(e) else str(e))
    if rank == 0:
        t.insert(items_of(0, 0, 1, 4, 1), np.ones(4))  # within the ratio: this insert does not block
    got.append(len(t.sample(2, timeout=10)))
    return got


def test_rate_limiter_on_global_counters_blocks_and_times_out_together():
    assert run_ranks(2, _limiter_body) == [[2, "timeout", 2], [2, "timeout", 2]]


def _mismatch_body(rank, world, kind):
    t = rp.distributed.ShardedTable("m", SIG, capacity_per_shard=256, shards="rank", seed=0, timeout=10)
    t.insert(items_of(0, rank, 0, 2, 1), np.ones(2))
    try:
        if kind == "batch":
            t.sample(4 if rank == 0 else 6)
        elif kind == "op":
            t.sample(4) if rank == 0 else t.delete([])
        elif kind == "bad-key":
            t.update_priorities([(4000 << 52)] if rank == 1 else [], [1.0] if rank == 1 else [])
        return "no error"
    except rp.errors.RepriseError as e:
        return type(e).__name__, str(e)


def test_ranks_making_different_calls_all_get_collective_mismatch():
    for kind in ("batch", "op"):
        out = run_ranks(2, _mismatch_body, kind)
        assert [o[0] for o in out] == ["CollectiveMismatch", "CollectiveMismatch"], out
        assert "rank 0" in out[0][1] and "rank 1" in out[0][1]


def test_bad_input_on_one_rank_fails_every_rank():
    out = run_ranks(2, _mismatch_body, "bad-key")
    assert out[1][0] == "InvalidArgument" and "names shard 4000, but there are 2" in out[1][1]
    assert out[0][0] == "CollectiveError" and "rank(s) [1]" in out[0][1]


def _killed_body(rank, world):
    import time
    t = rp.distributed.ShardedTable("k", SIG, capacity_per_shard=256, shards="rank", seed=0, timeout=5)
    t.insert(items_of(0, rank, 0, 2, 1), np.ones(2))
    t.sample(1)
    if rank == 1:
        os.kill(os.getpid(), 9)
    start = time.monotonic()
    try:
        t.sample(1)
        return "no error"
    except rp.errors.CollectiveError as e:
        late = None
        try:
            t.sample(1)
        except rp.errors.CollectiveError as again:
            late = str(again)
        return "CollectiveError", time.monotonic() - start, late


def test_a_killed_rank_ends_the_others_calls_within_the_timeout():
    out = run_ranks(2, _killed_body, allow_missing=(1,))
    kind, took, late = out[0]
    assert kind == "CollectiveError" and took < 15
    assert "failed earlier" in late


def _checkpoint_body(rank, world, path, phase):
    if phase == "save":
        t = make_table("Prioritized", 3, world)
        for step in range(3):
            t.insert(items_of(3, rank, step, 4 + rank, 2), np.arange(1, 5 + rank, dtype=float))
            t.sample(3)
        t.save(path)
        return [t.sample(3).keys.tolist() for _ in range(3)]
    try:
        t = rp.distributed.ShardedTable.restore(path, timeout=20)
    except rp.errors.InvalidArgument as e:
        return str(e)
    return [t.sample(3).keys.tolist() for _ in range(3)]


def test_restore_continues_with_the_same_batches_and_refuses_another_shard_count(tmp_path):
    path = str(tmp_path / "ckpt")
    before = run_ranks(2, _checkpoint_body, path, "save")
    after = run_ranks(2, _checkpoint_body, path, "restore")
    assert after == before
    manifest = next(tmp_path.glob("ckpt/cluster-*/manifest.json"))
    assert oct(manifest.stat().st_mode & 0o777) == "0o600"
    other = run_ranks(3, _checkpoint_body, path, "restore")
    assert all("holds 2 shards but this job makes 3" in o for o in other)


def _host_body(rank, world):
    t = rp.distributed.ShardedTable("h", SIG, capacity_per_shard=256, shards="host", seed=0, timeout=20)
    assert t.num_shards == 1 and (t.shard == 0) == (rank == 0)
    w = t.writer()
    for i in range(3):
        w.append({"x": np.int64(rank * 100 + i), "v": np.full(3, rank, np.float32)})
        w.create_item(t.name, 1, 1.0)
    w.flush() if hasattr(w, "flush") else None
    w.close()
    t._g.barrier("test: written")
    s = t.sample(6)
    return sorted(set(int(x) for x in s.data["x"][:, 0]))


def test_host_shards_take_writes_of_every_local_rank():
    out = run_ranks(2, _host_body)
    assert set(out[0]) | set(out[1]) <= {0, 1, 2, 100, 101, 102}
    assert len(set(out[0]) | set(out[1])) >= 4


def _bytes_body(rank, world):
    t = rp.distributed.ShardedTable("b", SIG, capacity_per_shard=8192, shards="rank", seed=0, timeout=20)
    sent = []
    gather = t._g.all_gather

    def counting(words, doing):
        sent.append(words.nbytes)
        return gather(words, doing)

    t._g.all_gather = counting
    per_call = []
    for n, batch in ((10, 2), (2000, 64)):
        t.insert(items_of(0, rank, n, n, 1), np.ones(n))
        sent.clear()
        t.sample(batch // len(t.consumers))
        per_call.append(sum(sent))
    return per_call


def test_control_bytes_per_call_do_not_grow_with_batch_or_table():
    out = run_ranks(2, _bytes_body)
    assert out[0][0] == out[0][1] == 16 * 8


def test_without_a_process_group_the_constructor_says_what_to_do():
    with pytest.raises(rp.errors.InvalidArgument, match="init_process_group"):
        rp.distributed.ShardedTable("t", SIG, capacity_per_shard=16)
    with pytest.raises(rp.errors.InvalidArgument, match="shards must be 'host' or 'rank'"):
        rp.distributed.ShardedTable("t", SIG, capacity_per_shard=16, shards="gpu")
    with pytest.raises(rp.errors.InvalidArgument, match="assignment must be 'local' or 'iid'"):
        rp.distributed.ShardedTable("t", SIG, capacity_per_shard=16, assignment="random")


def test_topologies_pick_the_first_stage():
    from reprise.distributed import consumers
    assert consumers(None, 4) == [0, 1, 2, 3]
    assert consumers((2, 2), 4) == [0, 1]
    with pytest.raises(rp.errors.InvalidArgument, match="covers 6 ranks, but the group has 4"):
        consumers((2, 3), 4)
    with pytest.raises(rp.errors.InvalidArgument, match="topology must be None"):
        consumers("pp2", 4)


def _two_hosts_body(rank, world):
    t = rp.distributed.ShardedTable("hh", SIG, capacity_per_shard=256, shards="host", seed=0, timeout=20)
    assert t.num_shards == 2
    with t.writer() as w:  # the non-owner's writes go to its host's shard; then straight into sample
        for i in range(5):
            w.append({"x": np.int64(rank * 100 + i), "v": np.zeros(3, np.float32)})
            w.create_item(t.name, 1, 1.0)
    s = t.sample(2)
    report = t.placement_report()  # for the last step's batch: 2 per consumer, 8 in all
    assert report["global_batch_size"] == 8 and [h["consumer_share"] for h in report["hosts"]] == [0.5, 0.5]
    assert abs(sum(h["mass_share"] for h in report["hosts"]) - 1.0) < 1e-12
    return len(s), t.info()["size"]


def test_two_emulated_hosts_with_writes_right_before_sample():
    out = run_ranks(4, _two_hosts_body, env=lambda r: {"REPRISE_HOST_ID": f"h{r // 2}"})
    assert out == [(2, 20)] * 4


def _torch_device() -> str:
    """Where the same-host test gathers torch samples: the GPU where there is one
    (rows read in place from the owner's registered shared memory), else the CPU."""
    try:
        import torch
        return "cuda" if torch.cuda.is_available() else "cpu"
    except ImportError:
        return "cpu"


_TORCH_DEVICE = _torch_device()


def _host(v):
    return v.cpu().numpy() if hasattr(v, "cpu") else np.asarray(v)


def _same_host_body(rank, world, assignment):
    """The same table twice, fed alike by the hosts' owners: first reading same-host
    rows from the owner's shared memory (the default with shards="host"), then with
    every row through the exchange. Each step's samples must be identical, and the
    exchange must carry exactly the rows that cross hosts (plus locators for the
    same-host ones, the owner's own rows included)."""
    from reprise.distributed import _rows
    runs = []
    for zero_copy in (True, False):
        t = rp.distributed.ShardedTable("z", SIG, capacity_per_shard=512, shards="host", seed=3, timeout=20,
                                        assignment=assignment, attributes={"version": "int64", "reward": "float32"})
        if not zero_copy:
            t._use_locators(np.zeros_like(t._locators))
        t._poison = True
        received = []
        exchange = t._g.all_to_all

        def counting(send, recv, send_splits, recv_splits, doing, group=None, received=received, exchange=exchange):
            received.append(int(np.sum(recv_splits)))
            return exchange(send, recv, send_splits, recv_splits, doing, group=group)

        t._g.all_to_all = counting
        out = []
        for step in range(4):
            if t.shard is not None:
                with t.writer() as w:  # items of 1 to 3 steps; the first of each step has 3
                    for i in range(3 + step):
                        T = 3 if i == 0 else 1 + (rank + i + step) % 3
                        for k in range(T):
                            w.append({"x": np.int64(rank * 10_000 + step * 100 + i * 10 + k),
                                      "v": np.full(3, rank + k / 4, np.float32)})
                        w.create_item(t.name, T, 1.0 + i, attributes={"version": step, "reward": rank + i / 8})
            t._g.barrier("test: written")
            for call in ("n", "tokens", "n-torch", "tokens-torch"):  # torch: straight into tensors where it can
                device = _TORCH_DEVICE if call.endswith("torch") else None
                a = t.sample(3, device=device) if call.startswith("n") else t.sample(tokens=7, device=device)
                data = a.packed_data if call.startswith("tokens") and device else a.data
                out.append((call, a.keys.tolist(), a.probabilities.tolist(), a.lengths.tolist(), a.times_sampled.tolist(),
                            {k: _host(data[k]).tolist() for k in SIG},
                            {k: _host(a.attributes[k]).tolist() for k in ("version", "reward")}, received[-1]))
                if call == "n":  # x encodes the writer's rank: its host is the shard the key names
                    assert ((np.asarray(a.data["x"])[:, 0] // 10_000) // 2 == (a.keys >> 52).astype(np.int64)).all()
        t.close()
        runs.append(out)
    host = rank // 2
    for (call, keys, *rest, got), (_, keys2, *rest2, got_without) in zip(*runs):
        assert (keys, rest) == (keys2, rest2)
        if call.startswith("tokens"):  # rows as long as the longest item of the whole draw: not known here
            continue
        steps = 3  # every shard holds a 3-step item
        local = (np.array(keys, dtype=np.uint64) >> 52).astype(np.int64) == host  # the owner's too
        n = len(keys)
        _, stride = _rows.layout(SIG, steps, 16)
        _, loc = _rows.layout(_rows.LOCATOR, steps, 16)
        assert got_without == _rows.STATUS * world + n * stride, (got_without, n)
        assert got == _rows.STATUS * world + int((~local).sum()) * stride + int(local.sum()) * loc, (got, local)
    return [(run[-1], run2[-1]) for run, run2 in zip(*runs)]


def _full_store_body(rank, world, shards):
    """A full store whose items are all drawn by one step must still take inserts right
    after it (a reader's rows are let go within the step, not at the next call)."""
    t = rp.distributed.ShardedTable("f", SIG, capacity_per_shard=64, shards=shards, seed=1, timeout=20, block_steps=4)
    sizes = []
    for round in range(3):
        if t.shard is not None:
            t.insert(items_of(round, rank, 0, 64, 1), np.ones(64), timeout=2)  # fills the store (ring eviction)
        t._g.barrier("test: written")
        s = t.sample(48)
        assert ((np.asarray(s.data["x"])[:, 0] // 10_000) % 100 == (s.keys >> 52).astype(np.int64)).all() or \
            shards == "host"
        sizes.append(len(s))
    t.close()
    return sizes


@pytest.mark.parametrize("shards", ["rank", "host"])
def test_a_step_keeps_no_blocks_out_of_reuse_after_it_returns(shards):
    assert run_ranks(2, _full_store_body, shards) == [[48, 48, 48]] * 2


@pytest.mark.parametrize("assignment", ["local", "iid"])
def test_same_host_rows_are_read_from_shared_memory_and_never_cross_the_exchange(assignment):
    out = run_ranks(4, _same_host_body, assignment, env=lambda r: {"REPRISE_HOST_ID": f"h{r // 2}"})
    # the readers (ranks 1 and 3) never received more, and over the run less, than their rows in full
    # (each step's exact count is checked in the ranks)
    for rank in (1, 3):
        assert all(got <= without for got, without in out[rank])
        assert sum(got for got, _ in out[rank]) < sum(without for _, without in out[rank]), out[rank]


def _old_group_names():
    """torch up to 2.11 named a group made by its members alone after its ranks and
    how many groups the rank held, so closing a table (destroying its groups) and
    making the next one gave that one the first one's group names again: here on
    any torch version."""
    import hashlib as _hashlib

    from torch.distributed import distributed_c10d as c10d

    def old_hash(ranks):
        joined = "_".join(map(str, ranks)) + "_" + str(len(c10d._world.pg_names))
        return _hashlib.sha1(joined.encode()).hexdigest()
    c10d._hash_ranks_to_str = old_hash


def _tables_one_after_another_body(rank, world):
    """Three tables made and closed in turn over the same ranks, with host groups, and
    three over a subgroup of the job (ranks 0 and 1): each must work."""
    import torch.distributed as dist
    _old_group_names()
    sizes = []
    for _ in range(3):
        t = rp.distributed.ShardedTable("s", SIG, capacity_per_shard=64, shards="host", seed=1, timeout=8)
        if t.shard is not None:
            t.insert(items_of(0, rank, 0, 4, 1), np.ones(4))
        t._g.barrier("test: written")
        sizes.append(len(t.sample(5)))
        t.close()
    pair = dist.new_group([0, 1], backend="gloo")
    for _ in range(3):
        if rank < 2:
            t = rp.distributed.ShardedTable("p", SIG, capacity_per_shard=64, shards="rank", seed=1, timeout=8,
                                            group=pair)
            t.insert(items_of(0, rank, 0, 4, 1), np.ones(4))
            t._g.barrier("test: written")
            sizes.append(len(t.sample(3)))
            t.close()
    return sizes


def test_tables_made_one_after_another_over_the_same_ranks_never_reuse_a_group_name():
    """Made, closed and made again over the same ranks (the whole job with host groups,
    and a subgroup): with torch's old group names the second table waited for ever at
    its first collective (seen on torch 2.11); every table now gets fresh names."""
    out = run_ranks(4, _tables_one_after_another_body, env=lambda r: {"REPRISE_HOST_ID": f"h{r // 2}"})
    assert out == [[5, 5, 5, 3, 3, 3]] * 2 + [[5, 5, 5]] * 2


@pytest.mark.parametrize("where,what", [(None, "data"), (0, "key"), (8, "probability"), (28, "length"),
                                        (44, "flag")])
def test_a_row_damaged_in_transit_fails_its_crc_check(make_store, where, what):
    """The CRC covers the header as well as the data: a flipped key, probability,
    length or flag word fails verify_rows=True, with the torch unpack (rows that
    arrived on a GPU) and the native one (rows on the host) alike."""
    import torch

    from reprise.distributed import _rows
    store = make_store(SIG, capacity=64, block_steps=4)
    table = rp.Table("t", store)
    table.insert(items_of(0, 1, 0, 3, 2), np.ones(3))
    rows = table._native.sample_rows(3, None)
    offsets, stride = _rows.layout(SIG, 2)
    out = np.zeros(3 * stride, dtype=np.uint8)
    rows.pack(out, stride, offsets, 1, np.arange(3, dtype=np.int64), np.ones(3, dtype=bool))
    header, _, data = _rows.unpack(torch.from_numpy(out.reshape(3, stride)), SIG, 2, True, "t")
    assert (data["x"][:, 0] // 10_000 == 1).all() and (header["shard"] == 1).all()
    damaged = out.reshape(3, stride).copy()
    damaged[1, offsets[1] if where is None else where] ^= 0x01 if what == "flag" else 0xFF
    before = damaged.copy()
    with pytest.raises(rp.errors.Corrupt, match=r"from shard \d+ \(slot \d+\) failed its CRC-32 check"):
        _rows.unpack(torch.from_numpy(damaged), SIG, 2, True, "t")
    # The native pass over a received buffer: one source, 16 status bytes, then the rows.
    recv = np.concatenate([np.zeros(_rows.STATUS, np.uint8), damaged.reshape(-1)])
    args = (recv, np.array([0]), np.array([3]), np.zeros(3, np.int64), _rows.Layout(SIG, 2))
    if what != "flag":  # a flag flipped to 0 drops the row from the CRC check: the count check catches it
        with pytest.raises(rp.errors.Corrupt, match=r"failed its CRC-32 check"):
            _rows.unpack_received(*args, True, "t", np.array([3]))
    else:
        with pytest.raises(rp.errors.Corrupt, match=r"rank 0 sent 3 filled rows but 2 arrived marked filled"):
            _rows.unpack_received(*args, True, "t", np.array([3]))
        with pytest.raises(rp.errors.Corrupt, match=r"rank 0 sent 3 filled rows but 2 arrived marked filled"):
            _rows.unpack_received(*args, False, "t", np.array([3]))  # verify_rows=False: still caught
    assert (damaged == before).all()
    if what in ("data", "probability"):
        _rows.unpack(torch.from_numpy(damaged), SIG, 2, False, "t")  # verify_rows=False reads it as it is
        _rows.unpack_received(*args, False, "t", np.array([3]))


def arrival_sources(order, counts):
    """Each position's source, for parts where arrival j (sources in rank order,
    ``counts[s]`` rows from source s) lands at position ``order[j]``."""
    sources = np.empty(len(order), np.int64)
    sources[order] = np.repeat(np.arange(len(counts)), counts)
    return sources


def test_native_unpack_equals_the_torch_unpack_for_interleaved_sources(make_store):
    """Rows of two sources, arriving in rank order (each source's rows in the order of
    its positions, as an owner packs them) and put back in position order, the
    sources' positions interleaved, some unfilled and of several lengths: the native
    pass and the torch path agree, padding past each item is zero whatever the
    receive buffer held before."""
    import torch

    from reprise.distributed import _rows
    store = make_store(SIG, capacity=256, block_steps=4)
    table = rp.Table("t", store)
    table.insert(items_of(0, 0, 0, 5, 1), np.ones(5))
    table.insert(items_of(0, 0, 1, 5, 3), np.ones(5))
    offsets, stride = _rows.layout(SIG, 3)
    parts, filled_counts = [], []
    for s, fill in ((0, np.array([True, False, True, True])), (1, np.array([True, True, False]))):
        rows = table._native.sample_rows(int(fill.sum()), None)
        out = np.full(fill.size * stride, 0xCD, np.uint8)  # stale bytes
        rows.pack(out, stride, offsets, s, np.arange(fill.size, dtype=np.int64), fill)
        rows.release()
        parts.append(np.concatenate([np.zeros(_rows.STATUS, np.uint8), out]))
        filled_counts.append(int(fill.sum()))
    recv = np.concatenate(parts)
    counts = np.array([4, 3])
    starts = np.array([0, parts[0].size])
    order = np.array([0, 2, 5, 6, 1, 3, 4])  # arrival j lands at position order[j]
    for verify in (True, False):
        h1, _, d1 = _rows.unpack_received(recv, starts, counts, arrival_sources(order, counts), _rows.Layout(SIG, 3),
                                          verify, "t", np.array(filled_counts))
        arrived = torch.from_numpy(np.concatenate([p[_rows.STATUS:] for p in parts]).reshape(-1, stride))
        inverse = np.empty_like(order)
        inverse[order] = np.arange(order.size)
        h2, _, d2 = _rows.unpack(arrived[torch.from_numpy(inverse)], SIG, 3, verify, "t")
        assert np.array_equal(h1, h2) and len(h1) == 5
        for k in SIG:
            assert np.array_equal(d1[k], d2[k]), k
        # padded to the longest item drawn (1 when, 1 time in 32, only one-step items are)
        assert d1["x"].shape == (5, int(h1["length"].max())) and (d1["x"][h1["length"] == 1][:, 1:] == 0).all()


def test_locators_read_back_the_rows_they_name_and_a_damaged_one_is_corrupt(make_store):
    """Rows packed as locators (store row numbers) and unpacked against the store's own
    columns equal the same rows packed in full; mixed in one pass with full rows, in
    any arrival order. A row number outside the store is Corrupt, with or without the
    CRC check, and nothing is written past the outputs."""
    from reprise.distributed import _rows
    store = make_store(SIG, capacity=256, block_steps=4)
    table = rp.Table("t", store)
    table.insert(items_of(0, 0, 0, 5, 1), np.ones(5))
    table.insert(items_of(0, 0, 1, 5, 3), np.ones(5))
    offsets, stride = _rows.layout(SIG, 3)
    loc_offsets, loc_stride = _rows.layout(_rows.LOCATOR, 3)
    assert loc_stride == _rows.HEADER + 3 * 8 < stride
    fill = np.array([True, False, True, True, True])
    rows = table._native.sample_rows(int(fill.sum()), None)
    full = np.full(fill.size * stride, 0xCD, np.uint8)
    located = np.full(fill.size * loc_stride, 0xCD, np.uint8)
    rows.pack(full, stride, offsets, 0, np.arange(fill.size, dtype=np.int64), fill)
    rows.pack(located, loc_stride, loc_offsets, 0, np.arange(fill.size, dtype=np.int64), fill, 0, True)
    columns = [store._columns_for(torch.device("cpu")).views[k].numpy().view(np.uint8).reshape(-1) for k in SIG]
    # source 0 sends full rows, source 1 the same rows as locators; positions interleave
    recv = np.concatenate([np.zeros(_rows.STATUS, np.uint8), full, np.zeros(_rows.STATUS, np.uint8), located])
    starts = np.array([0, _rows.STATUS + full.size])
    counts = np.array([fill.size, fill.size])
    order = np.array([0, 2, 4, 6, 8, 1, 3, 5, 7, 9])  # arrival j lands at position order[j]
    for verify in (True, False):
        header, _, data = _rows.unpack_received(recv, starts, counts, arrival_sources(order, counts),
                                                _rows.Layout(SIG, 3), verify, "t", np.array([4, 4]), None, False,
                                                np.array([False, True]), columns)
        same = [f for f in header.dtype.names if f != "crc"]  # (each row's CRC covers its own bytes)
        assert len(header) == 8 and np.array_equal(header[same][0::2], header[same][1::2])
        for k in SIG:
            assert np.array_equal(data[k][0::2], data[k][1::2]), k
    rows.release()
    bad = located.copy()
    first_row = np.nonzero(fill)[0][0] * loc_stride + loc_offsets[0]
    bad[first_row:first_row + 8] = np.frombuffer(np.int64(1 << 40).tobytes(), np.uint8)
    recv = np.concatenate([np.zeros(_rows.STATUS, np.uint8), bad])
    args = (recv, np.array([0]), np.array([fill.size]), np.zeros(fill.size, np.int64), _rows.Layout(SIG, 3))
    with pytest.raises(rp.errors.Corrupt, match="failed its CRC-32 check"):
        _rows.unpack_received(*args, True, "t", np.array([4]), None, False, np.array([True]), columns)
    with pytest.raises(rp.errors.Corrupt, match="names a row outside its owner's store"):
        _rows.unpack_received(*args, False, "t", np.array([4]), None, False, np.array([True]), columns)


def test_pack_writes_every_byte_so_a_reused_buffer_needs_no_zero_fill(make_store):
    """The send buffer is reused across steps: packing into stale bytes gives exactly
    the rows packed into zeros (padding past short items, and unfilled targets' rows)."""
    from reprise.distributed import _rows
    store = make_store(SIG, capacity=64, block_steps=4)
    table = rp.Table("t", store)
    table.insert(items_of(0, 1, 0, 2, 1), np.ones(2))  # one-step items in rows of up to 3 steps
    offsets, stride = _rows.layout(SIG, 3)
    filled = np.array([True, False, True])
    packed = []
    for fill in (0x00, 0xAB):
        rows = table._native.sample_rows(2, None)
        out = np.full(3 * stride, fill, dtype=np.uint8)
        rows.pack(out, stride, offsets, 0, np.arange(3, dtype=np.int64), filled)
        rows.release()
        packed.append(out.reshape(3, stride))
    zeros, stale = packed
    # The unfilled target's row: zeros but its CRC word (of the rest of the row), the same both times.
    assert np.array_equal(zeros[1], stale[1]) and (np.delete(stale[1], range(40, 44)) == 0).all()
    assert rp._native.cluster.check_rows(np.ascontiguousarray(stale).reshape(-1), stride) == -1
    for r in (0, 2):  # the filled rows: zeros past each field's one step, up to the next field
        for col, at in enumerate(offsets):
            end = offsets[col + 1] if col + 1 < len(offsets) else stride
            item = int(np.prod(list(SIG.values())[col].shape)) * np.dtype(list(SIG.values())[col].dtype).itemsize
            assert (stale[r, at + item:end] == 0).all(), (r, col)
    with pytest.raises(rp.errors.InvalidArgument, match="ascending"):
        table._native.sample_rows(1, None).pack(np.zeros(stride, np.uint8), stride, offsets[::-1], 0,
                                                np.arange(1, dtype=np.int64), np.ones(1, dtype=bool))


def test_pack_parts_writes_each_destinations_part_as_pack_does_after_its_status(make_store):
    """One native pass packs every drawn target into its destination's part: the
    part's status (0, filled count), then its rows in target order, data rows or
    locators as the destination reads them, byte for byte what ``pack`` writes per
    destination; and it refuses a destination outside the job or a short buffer,
    writing nothing."""
    from reprise.distributed import _rows
    store = make_store(SIG, capacity=256, block_steps=4)
    table = rp.Table("t", store)
    table.insert(items_of(0, 0, 1, 6, 2), np.ones(6))
    offsets, stride = _rows.layout(SIG, 2)
    loc_offsets, loc_stride = _rows.layout(_rows.LOCATOR, 2)
    filled = np.array([True, True, False, True, True, True, False, True])
    dests = np.array([2, 0, 2, 1, 0, 2, 0, 2], np.int64)
    locate = [False, True, False]
    strides = [stride, loc_stride, stride]
    rows = table._native.sample_rows(int(filled.sum()), None)
    out = np.full(3 * _rows.STATUS + filled.size * stride, 0xEE, np.uint8)
    sizes, located = rows.pack_parts(out, dests, strides, offsets, loc_offsets, locate, 1, filled)
    assert located and sizes == [_rows.STATUS + int((dests == d).sum()) * strides[d] for d in range(3)]
    at = 0
    for d in range(3):
        targets = np.nonzero(dests == d)[0]
        want = np.full(targets.size * strides[d], 0x11, np.uint8)
        rows.pack(want, strides[d], loc_offsets if locate[d] else offsets, 1, targets, filled, 0, locate[d])
        part = out[at:at + sizes[d]]
        assert list(part[:_rows.STATUS].view(np.int64)) == [0, int(filled[targets].sum())], d
        assert np.array_equal(part[_rows.STATUS:], want), d
        at += sizes[d]
    assert (out[at:] == 0xEE).all()  # nothing past the parts
    before = out.copy()
    with pytest.raises(rp.errors.InvalidArgument, match="destination 3 is not a rank of 3"):
        rows.pack_parts(out, np.where(dests == 2, 3, dests), strides, offsets, loc_offsets, locate, 1, filled)
    with pytest.raises(rp.errors.InvalidArgument, match=r"bytes for parts of"):
        rows.pack_parts(out[:100], dests, strides, offsets, loc_offsets, locate, 1, filled)
    assert np.array_equal(out, before)
    rows.release()


def test_route_and_arrivals_match_the_plan_computed_in_numpy():
    """``route`` gives each rank the consumers of its rows, the rows each rank sends
    it and its positions' sources, as numpy computes them from a plan; ``arrivals``
    finds each filled row of parts laid out that way, in position order; and both
    refuse a plan or parts that do not fit, naming what was wrong."""
    from reprise.distributed import _rows
    C = rp._native.cluster
    rng = np.random.default_rng(5)
    world, shards = 4, 3
    owner = np.array([0, 2, 3], np.int64)  # rank 1 owns no shard
    shard = rng.integers(0, shards, 64).astype(np.uint32)
    dest = rng.integers(0, world, 64).astype(np.int64)
    for rank in range(world):
        my_shard = int(np.nonzero(owner == rank)[0][0]) if rank in owner else -1
        mine, recv_rows, sources = C.route(shard, dest, owner, my_shard, rank, world)
        source = owner[shard]
        assert np.array_equal(mine, dest[shard == my_shard])
        assert recv_rows == np.bincount(source[dest == rank], minlength=world).tolist()
        assert np.array_equal(sources, source[dest == rank])
    with pytest.raises(rp.errors.InvalidArgument, match="shard 3 has no owner"):
        C.route(np.array([3], np.uint32), np.array([0], np.int64), owner, 0, 0, world)
    # Parts of 2 sources of 48-byte header rows; flags 1 = filled, length words 1..3.
    stride, counts, sources = 56, np.array([2, 3]), np.array([1, 0, 1, 0, 1], np.int64)
    recv = np.zeros(2 * _rows.STATUS + 5 * stride, np.uint8)
    starts = np.array([0, _rows.STATUS + 2 * stride], np.int64)
    words = recv.view(np.uint32)
    lengths = {}
    for s in (0, 1):
        for k in range(counts[s]):
            at = starts[s] + _rows.STATUS + k * stride
            words[(at + 28) // 4], words[(at + 44) // 4] = 1 + (s + k) % 3, int((s, k) != (1, 1))
            lengths[(s, k)] = 1 + (s + k) % 3
    at, located, by_source, longest, total = C.arrivals(recv, starts, counts, np.full(2, stride, np.int64),
                                                        np.array([False, True]), sources, 3, True)
    # positions in order: (1,0) (0,0) (1,1 unfilled) (0,1) (1,2)
    want = [starts[1] + 16, starts[0] + 16, starts[0] + 16 + stride, starts[1] + 16 + 2 * stride]
    assert at.tolist() == want and located.tolist() == [True, False, False, True]
    assert by_source.tolist() == [2, 2] and longest == 2 and total == sum(lengths.values()) - lengths[(1, 1)]
    with pytest.raises(rp.errors.InvalidArgument, match="more often than its rows"):
        C.arrivals(recv, starts, counts, np.full(2, stride, np.int64), np.zeros(2, bool),
                   np.array([1, 1, 1, 1, 0], np.int64), 3, False)
    with pytest.raises(rp.errors.InvalidArgument, match="do not fit the"):
        C.arrivals(recv[:-1], starts, counts, np.full(2, stride, np.int64), np.zeros(2, bool), sources, 3, False)
    got_starts, status, declared = C.statuses(recv, [_rows.STATUS + 2 * stride, _rows.STATUS + 3 * stride])
    assert got_starts.tolist() == starts.tolist() and status == [0, 0] and declared.tolist() == [0, 0]
    with pytest.raises(rp.errors.InvalidArgument, match="do not fit"):
        C.statuses(recv, [recv.size, _rows.STATUS])


def test_rows_carry_attribute_records_and_unpack_packed(make_store):
    """A table with attributes: each row carries its item's record after the header
    (every byte written, so stale bytes never show); the native pass returns the
    records and, packed, each field's steps end to end, equal to the torch unpack's
    padded rows with the padding taken out."""
    import torch

    from reprise._attributes import arrays, check_schema, record_size
    from reprise.distributed import _rows
    schema = check_schema("t", {"version": "int64", "reward": "float32"})
    record = record_size(schema)
    store = make_store(SIG, capacity=256, block_steps=4)
    table = rp.Table("t", store, attributes=dict(schema))
    for n, T in ((3, 1), (3, 3)):
        table.insert(items_of(0, 0, T, n, T), np.ones(n), attributes={"version": np.arange(n) + 10 * T,
                                                                      "reward": np.arange(n) / 4})
    offsets, stride = _rows.layout(SIG, 3, record)
    assert offsets[0] == _rows.HEADER + 16 and record == 12
    rows = table._native.sample_rows(5, None)
    want = arrays(schema, rows.records(), 5)
    fill = np.array([True, True, False, True, True, True])
    out = np.full(fill.size * stride, 0xCD, np.uint8)
    rows.pack(out, stride, offsets, 0, np.arange(fill.size, dtype=np.int64), fill, record)
    rows.release()
    assert rp._native.cluster.check_rows(out, stride) == -1
    assert (out.reshape(-1, stride)[fill][:, _rows.HEADER + record:offsets[0]] == 0).all()
    recv = np.concatenate([np.zeros(_rows.STATUS, np.uint8), out])
    args = (recv, np.array([0]), np.array([6]), np.zeros(6, np.int64), _rows.Layout(SIG, 3, record), True, "t",
            np.array([5]))
    h1, r1, padded = _rows.unpack_received(*args)
    h2, r2, packed = _rows.unpack_received(*args, packed=True)
    h3, r3, torch_padded = _rows.unpack(torch.from_numpy(out.reshape(-1, stride)), SIG, 3, True, "t", record=record)
    assert np.array_equal(h1, h2) and np.array_equal(h1, h3)
    for r in (r1, r2, r3):
        got = arrays(schema, r.tobytes(), 5)
        assert all(np.array_equal(got[k], want[k]) for k in want)
    lengths = h1["length"].astype(np.int64)
    for k in SIG:
        # Padded to the longest item drawn (1 when the draw held only one-step items).
        keep = np.arange(padded[k].shape[1])[None, :] < lengths[:, None]
        assert np.array_equal(padded[k], torch_padded[k])
        assert packed[k].shape[0] == lengths.sum() and np.array_equal(packed[k], padded[k][keep])
    with pytest.raises(rp.errors.InvalidArgument, match="past the header and the record"):
        table._native.sample_rows(1, None).pack(np.zeros(stride, np.uint8), stride, _rows.layout(SIG, 3)[0], 0,
                                                np.arange(1, dtype=np.int64), np.ones(1, dtype=bool), record)


ASSEMBLED = {"frame": rp.Field((6,), "uint8", stack=3, compress="zstd"),
             "img": rp.Field((16, 16), "uint8", compress="zstd"), "step": rp.Field((), "int64")}


def _assembled_rows_body(rank, world, shards):
    """Shards of stacked and compressed fields: every rank's sample holds the stacks and
    frames its items were written with, whoever owns them (rows the owner assembles)."""
    t = rp.distributed.ShardedTable("c", ASSEMBLED, capacity_per_shard=512, shards=shards, seed=3, timeout=20,
                                    block_steps=16)
    if t.shard is not None:
        n, T = 40, 3
        steps = (t.shard * 1000 + np.arange(n * T)).reshape(n, T)
        t.insert({"frame": np.repeat((steps % 251).astype(np.uint8)[..., None], 6, axis=-1),
                  "img": np.broadcast_to((steps % 241).astype(np.uint8)[..., None, None], (n, T, 16, 16)).copy(),
                  "step": steps}, np.ones(n))
    t._g.barrier("test: written")
    wrong = 0
    for _ in range(3):
        s = t.sample(24)
        steps = np.asarray(s.data["step"])
        first = steps[:, :1]
        want = np.maximum(steps[:, :, None] + np.arange(-2, 1), first[:, :, None]) % 251   # each item an episode
        wrong += int((np.asarray(s.data["frame"])[..., 0] != want).sum())
        wrong += int((np.asarray(s.data["img"])[:, :, 7, 9] != steps % 241).sum())
    t.close()
    return wrong


@pytest.mark.parametrize("shards", ["rank", "host"])
def test_stacked_and_compressed_fields_cross_the_exchange_assembled_by_their_owner(shards):
    """Such rows are never located in shared memory: a reader on the owner's host used to
    copy compressed blocks' raw bytes (and the owner's own rows failed)."""
    assert run_ranks(2, _assembled_rows_body, shards, env=lambda r: {"REPRISE_HOST_ID": "h0"}) == [0, 0]
