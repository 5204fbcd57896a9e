"""A store, two tables and a writer against a pure-Python reference model.

Table "a": Fifo sampler, Uniform remover (max_size 6): sampling is deterministic; which
item a full table evicts is random, so the model accepts any one and learns which.
Table "b": Prioritized(0.5) sampler, Fifo remover (max_size 5), max_times_sampled=2:
evictions are deterministic; each draw is checked against the model (a live item
with positive weight, its probability p^a / sum p^a, its data, its times_sampled).

The store is large enough never to fill (store-full eviction is out of scope here)."""

import math
from dataclasses import dataclass, field

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import reprise as rp

EXPONENT = 0.5
PRIORITIES = st.one_of(st.sampled_from([0.0, 1.0, 2.0]), st.floats(0.0, 100.0, allow_nan=False))
BAD_PRIORITIES = st.sampled_from([float("nan"), float("inf"), -1.0, -1e-9])


@dataclass
class ModelItem:
    priority: float
    values: list
    times_sampled: int = 0


@dataclass
class ModelTable:
    max_size: int
    max_times_sampled: int
    evict_fifo: bool
    items: dict = field(default_factory=dict)  # key -> ModelItem, insertion order

    def weight(self, key):
        return self.items[key].priority ** EXPONENT


def step_data(values):
    """Field data for steps with ids ``values``: x = id, y = [id, -id / 2]."""
    x = np.asarray(values, dtype=np.int64)
    y = np.stack([x, -x / 2], axis=-1).astype(np.float32)
    return x, y


class ReplayMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        sig = {"x": rp.Field((), "int64"), "y": rp.Field((2,), "float32")}
        self.store = rp.Store(sig, capacity=1 << 16, block_steps=4)
        self.tables = {
            "a": rp.Table("a", self.store, sampler=rp.selectors.Fifo(), remover=rp.selectors.Uniform(),
                          max_size=6, seed=1),
            "b": rp.Table("b", self.store, sampler=rp.selectors.Prioritized(EXPONENT),
                          remover=rp.selectors.Fifo(), max_size=5, max_times_sampled=2, seed=2),
        }
        self.model = {
            "a": ModelTable(max_size=6, max_times_sampled=0, evict_fifo=False),
            "b": ModelTable(max_size=5, max_times_sampled=2, evict_fifo=True),
        }
        self.writer = self.store.writer()
        self.episode = []
        self.next_id = 1
        self.seen_keys = {"a": [], "b": []}  # every key each table ever returned
        self.used_bulk = False

    def teardown(self):
        self.writer.close()
        for t in self.tables.values():
            t.reset()
        # Nothing leaks: only the bulk cursor may still hold its current block.
        assert self.store.free_blocks == self.store.num_blocks - (1 if self.used_bulk else 0)
        self.store.close()

    # --- helpers --------------------------------------------------------------------------------

    def new_ids(self, n):
        ids = list(range(self.next_id, self.next_id + n))
        self.next_id += n
        return ids

    def record_inserts(self, name, new_keys, new_items):
        """Applies inserts (with evictions) to the model; learns Uniform evictions from the table."""
        m = self.model[name]
        assert len(set(new_keys)) == len(new_keys)
        for k in new_keys:
            assert k not in self.seen_keys[name], "a key was handed out twice"
        self.seen_keys[name].extend(new_keys)
        if m.evict_fifo:
            for k, item in zip(new_keys, new_items):
                if len(m.items) >= m.max_size:
                    del m.items[next(iter(m.items))]
                m.items[k] = item
            return
        candidates = dict(m.items)
        candidates.update(zip(new_keys, new_items))
        live = [k for k, *_ in self.tables[name].items()]
        assert len(live) == min(m.max_size, len(candidates))
        assert set(live) <= set(candidates), "a table holds an item the model never saw"
        m.items = {k: candidates[k] for k in candidates if k in set(live)}

    def check_draws(self, name, sample):
        """Replays the draws of ``sample`` on the model, checking each."""
        m = self.model[name]
        xs, ys = sample.data["x"], sample.data["y"]
        for i, key in enumerate(sample.keys.tolist()):
            assert key in m.items, f"drew key {key} that is not in table {name!r}"
            item = m.items[key]
            if name == "a":
                assert key == next(iter(m.items)), "Fifo sampler must draw the oldest item"
                expected_p = 1.0
            else:
                total = sum(m.weight(k) for k in m.items)
                expected_p = m.weight(key) / total if total > 0 else 1.0 / len(m.items)
                assert expected_p > 0, "drew an item of weight zero"
            assert math.isclose(sample.probabilities[i], expected_p, rel_tol=1e-9)
            assert sample.priorities[i] == item.priority
            item.times_sampled += 1
            assert sample.times_sampled[i] == item.times_sampled
            n = len(item.values)
            assert sample.lengths[i] == n
            x, y = step_data(item.values)
            assert xs[i, :n].tolist() == x.tolist()
            np.testing.assert_array_equal(ys[i, :n], y)
            assert not xs[i, n:].any() and not ys[i, n:].any(), "padding must be zeros"
            if m.max_times_sampled and item.times_sampled >= m.max_times_sampled:
                del m.items[key]

    # --- writer rules ---------------------------------------------------------------------------

    @rule()
    def append(self):
        (i,) = self.new_ids(1)
        x, y = step_data([i])
        self.writer.append({"x": int(x[0]), "y": y[0]})
        self.episode.append(i)

    @rule(n=st.integers(1, 9))
    def extend(self, n):
        ids = self.new_ids(n)
        x, y = step_data(ids)
        self.writer.extend({"x": x, "y": y})
        self.episode.extend(ids)

    @rule()
    def end_episode(self):
        self.writer.end_episode()
        self.episode = []

    @rule(name=st.sampled_from(["a", "b"]), num_steps=st.integers(1, 12), priority=PRIORITIES,
          by_name=st.booleans())
    def create_item(self, name, num_steps, priority, by_name):
        target = name if by_name else self.tables[name]
        if num_steps > len(self.episode):
            free = self.store.free_blocks
            with pytest.raises(rp.errors.InvalidArgument, match="longer than the episode"):
                self.writer.create_item(target, num_steps=num_steps, priority=priority)
            assert self.store.free_blocks == free
            return
        key = self.writer.create_item(target, num_steps=num_steps, priority=priority)
        self.record_inserts(name, [key], [ModelItem(priority, self.episode[-num_steps:])])

    @rule(name=st.sampled_from(["a", "b"]), priority=BAD_PRIORITIES)
    def create_item_with_bad_priority(self, name, priority):
        if not self.episode:
            return
        with pytest.raises(rp.errors.InvalidArgument, match="priority"):
            self.writer.create_item(name, num_steps=1, priority=priority)

    # --- table rules ----------------------------------------------------------------------------

    @rule(name=st.sampled_from(["a", "b"]), n=st.integers(1, 4), steps=st.integers(1, 3), data=st.data())
    def batch_insert(self, name, n, steps, data):
        priorities = data.draw(st.lists(PRIORITIES, min_size=n, max_size=n))
        ids = self.new_ids(n * steps)
        x, y = step_data(ids)
        keys = self.tables[name].insert({"x": x.reshape(n, steps), "y": y.reshape(n, steps, 2)}, priorities)
        self.used_bulk = True
        assert keys.dtype == np.uint64 and len(keys) == n
        items = [ModelItem(p, ids[i * steps:(i + 1) * steps]) for i, p in enumerate(priorities)]
        self.record_inserts(name, keys.tolist(), items)

    @rule(name=st.sampled_from(["a", "b"]), n=st.integers(1, 6))
    def sample(self, name, n):
        m = self.model[name]
        table = self.tables[name]
        if not m.items:
            with pytest.raises(rp.errors.Timeout):
                table.sample(n, timeout=0)
            return
        size = len(m.items)
        try:
            s = table.sample(n, timeout=0)
            assert len(s) == n
        except rp.errors.Timeout as e:
            # Only table "b" can run dry mid-draw (items leave after 2 draws).
            assert name == "b"
            s = e.partial
            assert 0 < len(s) < n
        assert s.table_size == size
        self.check_draws(name, s)
        if len(s) < n:
            assert not m.items, "a sample stopped early while items were left"

    @rule(name=st.sampled_from(["a", "b"]), data=st.data())
    def update_priorities(self, name, data):
        m = self.model[name]
        pool = list(m.items) + self.seen_keys[name][-10:]
        if not pool:
            return
        keys = data.draw(st.lists(st.sampled_from(pool), max_size=6))
        priorities = data.draw(st.lists(PRIORITIES, min_size=len(keys), max_size=len(keys)))
        applied = self.tables[name].update_priorities(np.array(keys, dtype=np.uint64), priorities)
        assert applied == sum(k in m.items for k in keys)
        for k, p in zip(keys, priorities):
            if k in m.items:
                m.items[k].priority = p

    @rule(name=st.sampled_from(["a", "b"]), bad=BAD_PRIORITIES, data=st.data())
    def update_priorities_with_a_bad_value(self, name, bad, data):
        m = self.model[name]
        if not m.items:
            return
        keys = data.draw(st.lists(st.sampled_from(list(m.items)), min_size=1, max_size=4))
        priorities = [1.0] * (len(keys) - 1) + [bad]
        with pytest.raises(rp.errors.InvalidArgument, match=f"key {keys[-1]}"):
            self.tables[name].update_priorities(keys, priorities)

    @rule(name=st.sampled_from(["a", "b"]), data=st.data())
    def delete(self, name, data):
        m = self.model[name]
        pool = list(m.items) + self.seen_keys[name][-10:]
        if not pool:
            return
        keys = data.draw(st.lists(st.sampled_from(pool), max_size=6))
        removed = self.tables[name].delete(keys)
        assert removed == len({k for k in keys if k in m.items})
        for k in keys:
            m.items.pop(k, None)

    @rule(name=st.sampled_from(["a", "b"]))
    def reset(self, name):
        self.tables[name].reset()
        self.model[name].items.clear()

    # --- invariants -----------------------------------------------------------------------------

    @invariant()
    def tables_match_the_model(self):
        for name, table in self.tables.items():
            m = self.model[name]
            assert table.size == len(m.items) == len(table)
            expected = [(k, it.priority, it.times_sampled, len(it.values)) for k, it in m.items.items()]
            assert table.items() == expected

    @invariant()
    def writer_episode_matches(self):
        assert self.writer.episode_steps == len(self.episode)


ReplayMachine.TestCase.settings = settings(
    max_examples=150,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_replay_matches_the_reference_model = ReplayMachine.TestCase
