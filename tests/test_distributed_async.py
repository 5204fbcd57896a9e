"""Cluster mode with the asynchronous-RL primitives (docs/async-rl.md, "Cluster
mode"): attributes through the exchange, set_version over every shard, and
token-budget steps exact against the single-table reference, on spawned gloo
ranks with a timeout on every collective (tests/cluster_ranks.py)."""

from __future__ import annotations

import numpy as np
import pytest

import reprise as rp
from cluster_ranks import run_ranks

torch = pytest.importorskip("torch")

SIG = {"token": rp.Field((), "int64"), "logprob": rp.Field((2,), "float32")}
ATTRS = {"version": "int64", "reward": "float32"}


def sampler_of(name):
    return rp.selectors.Prioritized(0.8) if name == "Prioritized" else getattr(rp.selectors, name)()


def code(shard, step, i):
    """The number every step of an item carries (and its reward is derived from)."""
    return shard * 1_000_000 + step * 1_000 + i


def sequences(seed, shard, step):
    """Deterministic items of one shard at one step: lengths 1..24, priorities."""
    rng = np.random.default_rng([seed, shard, step])
    n = int(rng.integers(2, 6))
    return [int(x) for x in rng.integers(1, 25, n)], rng.uniform(0.1, 3.0, n)


def write(table, shard, step, lengths, priorities, version=0):
    """One insert per item (they differ in length): token t of item i is code * 100 + t."""
    keys = []
    for i, (n, p) in enumerate(zip(lengths, priorities)):
        c = code(shard, step, i)
        data = {"token": (c * 100 + np.arange(n, dtype=np.int64))[None],
                "logprob": np.full((1, n, 2), c % 7, np.float32)}
        keys.append(table.insert(data, np.array([p]), attributes={"version": version, "reward": c % 1000 / 8})[0])
    return keys


def _tokens_body(rank, world, samplers, max_times, steps, tokens):
    """Each step every shard writes; every rank draws sample(tokens=...); rank 0
    replays it on plain tables and checks the whole global draw against
    ReferenceTable.sample_tokens: keys, probabilities, the consumer of each pick,
    and every token and attribute of every item."""
    out = []
    for name in samplers:
        t = rp.distributed.ShardedTable("rollouts", SIG, capacity_per_shard=1 << 14, sampler=sampler_of(name),
                                        seed=5, shards="rank", timeout=20, max_times_sampled=max_times,
                                        block_steps=8, attributes=ATTRS, assignment="iid")
        ref = None
        if rank == 0:
            ref = rp.distributed.ReferenceTable(
                [rp.Table("rollouts", rp.Store(SIG, capacity=1 << 14, block_steps=8), sampler=sampler_of(name),
                          max_times_sampled=max_times, attributes=ATTRS) for _ in range(world)], seed=5)
        for step in range(steps):
            for shard in range(world):
                lengths, prios = sequences(7, shard, step)
                if shard == rank:
                    write(t, shard, step, lengths, prios)
                if ref is not None:
                    write(ref.tables[shard], shard, step, lengths, prios)
            s = t.sample(tokens=tokens)
            p = s.packed()
            assert s.packed_data is not None and p.total_steps == s.num_steps <= tokens
            assert p.data["token"].shape == (s.num_steps,)  # packed: no padding anywhere
            for i in range(len(s)):
                toks = p.data["token"][p.cu_seqlens[i]:p.cu_seqlens[i + 1]]
                c = int(toks[0]) // 100
                assert (toks == c * 100 + np.arange(len(toks))).all()  # every token of the item, once, in order
                assert (p.data["logprob"][p.cu_seqlens[i]:p.cu_seqlens[i + 1]] == c % 7).all()
                assert s.attributes["reward"][i] == np.float32(c % 1000 / 8) and s.attributes["version"][i] == 0
                assert c // 1_000_000 == int(s.keys[i]) >> 52  # the row is its key's item
            got = t._g.all_gather_object((s.keys.tolist(), s.probabilities.tolist(), s.table_size, s.num_steps),
                                         "test gather")
            if ref is not None:
                want = ref.sample_tokens(tokens, consumers=world)
                keys = [k for c in range(world) for k in got[c][0]]
                order = np.argsort(want["consumer"], kind="stable")  # the reference's positions, by consumer
                assert keys == want["keys"][order].tolist(), (name, step)
                assert [p for c in range(world) for p in got[c][1]] == want["probabilities"][order].tolist()
                assert all(g[2] == want["table_size"] for g in got)
                loads = [g[3] for g in got]
                assert max(loads) - min(loads) <= 24 and max(loads) <= tokens  # balanced within the longest item
                out.append((name, step, len(keys), loads))
        t.close()
    return out


@pytest.mark.parametrize("world,tokens", [(2, 40), (3, 40), (2, 400)])
def test_token_steps_draw_exactly_the_reference(world, tokens):
    """40: a cut inside the first round of candidates; 400: past it (more rounds)."""
    out = run_ranks(world, _tokens_body, ("Uniform", "Prioritized", "Fifo"), 0, 3, tokens)
    assert len(out[0]) == 9  # rank 0 checked every step of every sampler
    assert any(n > world for _, _, n, _ in out[0])  # steps of several items per consumer


def test_token_steps_hand_out_each_item_once_with_a_consuming_fifo():
    out = run_ranks(2, _tokens_body, ("Fifo", "Lifo"), 1, 3, 30)
    assert len(out[0]) == 6


def _versions_body(rank, world, path):
    t = rp.distributed.ShardedTable("v", SIG, capacity_per_shard=1 << 12, seed=1, shards="rank", timeout=20,
                                    attributes=ATTRS, max_staleness=1, block_steps=8)
    assert t.version == 0 and t.info()["attributes"] == ATTRS
    report = {}
    for v in range(4):  # items of versions 0..3 on every shard
        write(t, rank, v, [3, 5], [1.0, 1.0], version=v)
    removed = t.set_version(3)  # versions 0 and 1 leave every shard
    report["removed"] = removed
    report["stale_insert"] = int(write(t, rank, 9, [2], [1.0], version=1)[0])  # dropped at commit: key 0
    info = t.info()
    report["info"] = (info["size"], info["stale_removed"], info["stale_dropped"], info["version"])
    seen = set()
    for _ in range(5):
        s = t.sample(4, device="cpu")
        assert isinstance(s.attributes["version"], torch.Tensor)
        seen |= set(s.attributes["version"].tolist())
        s = t.sample(tokens=16)
        seen |= set(s.attributes["version"].tolist())
    report["seen"] = sorted(seen)
    # update_attributes by global key: each rank sends the keys it drew (routed to their owners).
    drawn = t.sample(3)
    report["updated"] = t.update_attributes(drawn.keys, {"reward": np.full(len(drawn), 9.5)})
    mine = t.local_table.items()
    found, _ = t.local_table.attributes_of(np.array([k for k, *_ in mine], dtype=np.uint64))
    report["rewards"] = sorted(set(found["reward"].tolist()))
    before = t.info()["num_samples"]
    with pytest.raises(rp.errors.NotFound, match="has no attribute 'score'"):
        t.update_attributes(drawn.keys, {"score": 1.0})
    with pytest.raises(rp.errors.InvalidArgument, match="version is fixed"):
        t.update_attributes(drawn.keys, {"version": 3})
    assert t.update_attributes(np.zeros(0, np.uint64), {"reward": []}) == 0
    assert t.info()["num_samples"] == before
    # Refused on every rank, nothing changed: a lower version, a bad budget, both or neither.
    for call, match in ((lambda: t.set_version(2), "version 2 is below the current 3"),
                        (lambda: t.sample(tokens=4), "a drawn item has 5 steps, more than the whole token budget of 4"),
                        (lambda: t.sample(2, tokens=10), "batch_size or tokens"),
                        (lambda: t.sample(), "batch_size or tokens"),
                        (lambda: t.sample(tokens=0), "tokens")):
        before = (t.info()["num_samples"], t.step, t.version)
        with pytest.raises(rp.errors.InvalidArgument, match=match):
            call()
        assert (t.info()["num_samples"], t.step, t.version) == before
    t.save(path)
    keys = [t.sample(tokens=12).keys.tolist() for _ in range(2)]
    t.close()
    r = rp.distributed.ShardedTable.restore(path, timeout=20)
    assert r.version == 3 and r.attributes == ATTRS and r.max_staleness == 1
    report["restored_same"] = [r.sample(tokens=12).keys.tolist() for _ in range(2)] == keys
    report["restored_stale_insert"] = int(write(r, rank, 10, [2], [1.0], version=1)[0])
    r.close()
    return report


def test_set_version_reaches_every_shard_and_checkpoints_keep_it(tmp_path):
    out = run_ranks(2, _versions_body, str(tmp_path / "ckpt"))
    for r in out:
        assert r["removed"] == 8  # 2 items x versions 0, 1 x 2 shards
        assert r["stale_insert"] == 0 and r["restored_stale_insert"] == 0
        assert r["info"] == (8, 8, 2, 3)
        assert r["seen"] == [2, 3]
        assert 1 <= r["updated"] <= 6 and 9.5 in out[0]["rewards"] + out[1]["rewards"]
        assert r["restored_same"]


def _max_times_body(rank, world):
    t = rp.distributed.ShardedTable("m", SIG, capacity_per_shard=256, seed=0, shards="rank", timeout=20,
                                    max_times_sampled=1)
    t.insert({"token": np.zeros((1, 2), np.int64), "logprob": np.zeros((1, 2, 2), np.float32)}, [1.0])
    with pytest.raises(rp.errors.InvalidArgument, match="needs max_times_sampled=0"):
        t.sample(tokens=8)
    return t.info()["num_samples"]


def test_random_sampler_budgets_refuse_max_times_sampled_on_every_rank():
    assert run_ranks(2, _max_times_body) == [0, 0]


def _host_body(rank, world):
    """shards='host': rank 1 owns no shard; it writes through the host's server
    with attributes and takes its share of a token step, attributes included."""
    t = rp.distributed.ShardedTable("h", SIG, capacity_per_shard=1024, shards="host", seed=0, timeout=20,
                                    attributes=ATTRS, block_steps=8)
    with t.writer() as w:
        for i in range(4):
            n = 2 + i
            c = code(rank, 0, i)
            for k in range(n):
                w.append({"token": np.int64(c * 100 + k), "logprob": np.zeros(2, np.float32)})
            w.create_item(t.name, n, 1.0, attributes={"version": rank, "reward": c % 1000 / 8})
            w.end_episode()
    t._g.barrier("test: written")
    s = t.sample(tokens=9)
    for i in range(len(s)):
        c = int(s.packed_data["token"][s.packed().cu_seqlens[i]]) // 100
        assert s.attributes["version"][i] == c // 1_000_000 and s.attributes["reward"][i] == np.float32(c % 1000 / 8)
    return s.num_steps


def test_host_shards_carry_attributes_to_ranks_without_a_shard():
    out = run_ranks(2, _host_body)
    assert all(0 < n <= 9 for n in out)


GATTRS = {"group": "int64", "reward": "float32"}
G = 3


def write_groups(table, shard, step, count=2, members=G, seed=11):
    """``count`` groups of ``members`` items each (lengths 1..8): group id
    shard * 1000 + step * 10 + j; token t of member m is (gid * 10 + m) * 100 + t."""
    rng = np.random.default_rng([seed, shard, step])
    for j in range(count):
        gid = shard * 1000 + step * 10 + j
        for m in range(members):
            n = int(rng.integers(1, 9))
            c = gid * 10 + m
            table.insert({"token": (c * 100 + np.arange(n, dtype=np.int64))[None],
                          "logprob": np.full((1, n, 2), m, np.float32)}, np.array([rng.uniform(0.1, 2.0)]),
                         attributes={"group": gid, "reward": m / 2})


def check_whole_groups(s, sizes=(G,)):
    """Every group of ``s`` sits side by side, each member once, in member order."""
    p = s.packed()
    groups = s.attributes["group"].tolist()
    i = 0
    while i < len(groups):
        gid = groups[i]
        run = 1
        while i + run < len(groups) and groups[i + run] == gid and run < G:
            run += 1
        assert run in sizes, (groups, i)
        for m in range(run):
            toks = p.data["token"][p.cu_seqlens[i + m]:p.cu_seqlens[i + m + 1]]
            assert int(toks[0]) // 100 == gid * 10 + m and s.attributes["reward"][i + m] == m / 2
        i += run
    return len(groups) // G


def _groups_body(rank, world, samplers, tokens):
    """Groups across shards: each shard admits the groups written to it; sample(n)
    and sample(tokens=...) hand out whole groups, exactly as the reference draws."""
    out = []
    for name in samplers:
        kw = dict(sampler=sampler_of(name), seed=2, attributes=GATTRS, group_size=G)
        t = rp.distributed.ShardedTable("g", SIG, capacity_per_shard=1 << 13, shards="rank", timeout=20,
                                        assignment="iid", block_steps=8, **kw)
        ref = None
        if rank == 0:
            ref = rp.distributed.ReferenceTable(
                [rp.Table("g", rp.Store(SIG, capacity=1 << 13, block_steps=8), **kw) for _ in range(world)], seed=2)
        for step in range(3):
            for shard in range(world):
                if shard == rank:
                    write_groups(t, shard, step)
                if ref is not None:
                    write_groups(ref.tables[shard], shard, step)
            a = t.sample(2 * G)
            assert check_whole_groups(a) == 2
            b = t.sample(tokens=tokens)
            check_whole_groups(b)
            assert b.num_steps <= tokens
            got = t._g.all_gather_object((a.keys.tolist(), a.probabilities.tolist(), b.keys.tolist()), "test gather")
            if ref is not None:
                want = ref.sample(2 * world)  # units: 2 groups per consumer
                assert [k for g in got for k in g[0]] == want["keys"].tolist(), (name, step)
                assert [p for g in got for p in g[1]] == want["probabilities"].tolist()
                want = ref.sample_tokens(tokens, consumers=world)
                rows = np.repeat(want["consumer"], G)  # every group here is complete
                order = np.argsort(rows, kind="stable")
                assert [k for g in got for k in g[2]] == want["keys"][order].tolist(), (name, step)
                out.append((name, step, len(want["keys"])))
        info = t.info()["groups"]
        assert info["group_size"] == G and info["live"] == 6 * world and info["pending"] == 0
        with pytest.raises(rp.errors.InvalidArgument, match="batch_size 4 is not a multiple of group_size 3"):
            t.sample(4)
        t.close()
    return out


def test_groups_are_drawn_whole_across_shards_exactly_as_the_reference():
    out = run_ranks(2, _groups_body, ("Uniform", "Prioritized", "Fifo"), 40)
    assert len(out[0]) == 9 and all(n > 0 for *_, n in out[0])


def _partial_body(rank, world, path):
    """A straggler: shard 1's second group never completes; after group_timeout it
    is admitted as it is and drawn with 2 members; checkpoints keep the settings."""
    t = rp.distributed.ShardedTable("p", SIG, capacity_per_shard=1 << 12, shards="rank", timeout=20, seed=0,
                                    sampler=rp.selectors.Fifo(), max_times_sampled=1, attributes=GATTRS,
                                    group_size=G, group_timeout=0.3, on_group_timeout="partial", block_steps=8)
    write_groups(t, rank, 0, count=1)
    if rank == 1:
        write_groups(t, rank, 1, count=1, members=2)
    before = t.info()["groups"]
    import time
    time.sleep(0.4)
    s = t.sample(tokens=100, timeout=5)  # consume-once: the 3 groups, shared by the 2 consumers
    check_whole_groups(s, sizes=(2, G))
    drawn = s.attributes["group"].tolist()
    with pytest.raises(rp.errors.Timeout, match="did not allow the first item of a token step"):
        t.sample(tokens=100, timeout=0.2)  # every group was handed out once
    after = t.info()["groups"]
    t.save(path)
    t.close()
    r = rp.distributed.ShardedTable.restore(path, timeout=20)
    restored = r.info()["groups"]
    r.close()
    return before["pending"], before["live"], sorted(drawn), after["partial"], restored["group_size"], \
        restored["on_timeout"]


def test_a_straggler_group_is_admitted_partial_and_drawn_with_its_members(tmp_path):
    out = run_ranks(2, _partial_body, str(tmp_path / "ckpt"))
    drawn = sorted(out[0][2] + out[1][2])
    assert drawn == [0] * G + [1000] * G + [1010] * 2
    for pending, live, _, partial, size, on_timeout in out:
        assert (pending, live, partial, size, on_timeout) == (1, 2, 1, G, "partial")
