"""reprise.integrations.torchrl: RepriseStorage and ReprisePrioritizedSampler inside TorchRL's
replay buffers, held to what TorchRL expects of its own storages (LazyTensorStorage, written
and read side by side with the same data) and samplers."""

import copy
import io
import multiprocessing.context
import os
import pickle

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchrl")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from tensordict import NonTensorData, TensorDict, tensorclass  # noqa: E402
from torchrl.data import (  # noqa: E402
    LazyTensorStorage,
    PrioritizedSampler,
    RandomSampler,
    ReplayBuffer,
    RoundRobinWriter,
    SamplerWithoutReplacement,
    TensorDictReplayBuffer,
)

import reprise as rp  # noqa: E402
from reprise.integrations.torchrl import (  # noqa: E402
    ReprisePrioritizedSampler,
    RepriseStorage,
    field_name,
    key_of,
)

EPS = 1e-8


@pytest.fixture
def storages():
    """``make(max_size, **kw)`` -> RepriseStorage, closed at teardown (their shm files removed);
    ``make.closed_at_teardown(storage)`` closes one made otherwise (an unpickled copy) too."""
    made = []

    def make(max_size, **kw):
        s = RepriseStorage(max_size, **kw)
        made.append(s)
        return s

    make.closed_at_teardown = lambda s: made.append(s) or s
    yield make
    for s in made:
        s.close()


def transitions(n, start=0):
    """n transitions whose every value derives from its number (start + i)."""
    i = torch.arange(start, start + n)
    return TensorDict({
        "obs": i[:, None].float().expand(n, 4).clone(),
        "action": i % 3,
        ("next", "obs"): (i[:, None] + 1).float().expand(n, 4).clone(),
        ("next", "reward"): i.double()[:, None] / 10,
        ("next", "done"): (i % 5 == 0)[:, None],
    }, batch_size=[n])


def assert_same(a, b):
    """Two TensorDicts (or tensors) hold the same keys, batch size, dtypes and values."""
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert torch.equal(a, b)
        return
    assert a.batch_size == b.batch_size
    ka = set(a.keys(include_nested=True, leaves_only=True))
    assert ka == set(b.keys(include_nested=True, leaves_only=True))
    for k in ka:
        assert a[k].dtype == b[k].dtype, k
        assert torch.equal(a[k], b[k]), k


def positions_of(storage):
    """{position: priority} of the filled positions, read from the table."""
    priority = {k: p for k, p, _, _ in storage.table.items()}
    return {int(p): priority[int(k)] for p, k in enumerate(storage._keys) if k}


# --- what a storage must do: write, read, length -----------------------------------------------


def test_extend_and_every_kind_of_index_read_as_lazy_tensor_storage_does(storages):
    ours = ReplayBuffer(storage=storages(50), batch_size=8)
    ref = ReplayBuffer(storage=LazyTensorStorage(50), batch_size=8)
    for start in range(0, 120, 17):  # wraps around twice
        d = transitions(17, start)
        np.testing.assert_array_equal(ours.extend(d.clone()), ref.extend(d.clone()))
    assert len(ours) == len(ref) == 50
    assert_same(ours[:], ref[:])
    for index in (3, -1, slice(5, 40, 3), [0, 49, 7, 7], np.array([2, 3]), torch.tensor([[1, 2], [3, 4]]),
                  torch.tensor(9), torch.arange(50) % 2 == 0, []):
        assert_same(ours.storage.get(index), ref.storage.get(index))
    one = ours.storage.get(3)
    assert one.batch_size == torch.Size([]) and one["obs"].shape == (4,)


def test_writes_longer_than_a_chunk_read_as_lazy_tensor_storage_and_map_keys_to_positions(storages):
    ours = ReplayBuffer(storage=storages(150))
    ref = ReplayBuffer(storage=LazyTensorStorage(150))
    # 100 (two chunks of items), 140 (wraps: two runs), 200 (longer than the storage: positions repeat)
    for n, start in ((100, 0), (140, 100), (200, 240)):
        ours.extend(transitions(n, start)), ref.extend(transitions(n, start))
        assert_same(ours[:], ref[:])
        storage = ours.storage
        assert storage.table.size == (150 if n > 100 else n)
        keys = np.array([k for k, _, _, _ in storage.table.items()], np.uint64)
        assert sorted(storage._positions_of(keys).tolist()) == list(range(storage.table.size))
    assert storage.table.info()["num_store_evictions"] == 0


def test_add_writes_one_element_at_the_cursor(storages):
    ours = ReplayBuffer(storage=storages(4))
    ref = ReplayBuffer(storage=LazyTensorStorage(4))
    d = transitions(6)
    for i in range(6):
        assert ours.add(d[i].clone()) == ref.add(d[i].clone())
    assert len(ours) == 4
    assert_same(ours[:], ref[:])
    assert ours[:]["action"].tolist() == [4 % 3, 5 % 3, 2 % 3, 3 % 3]


def test_round_robin_writer_overwrites_the_oldest_elements_in_order(storages):
    storage = storages(10)
    rb = ReplayBuffer(storage=storage, writer=RoundRobinWriter())
    for start in range(0, 25, 7):
        rb.extend(transitions(min(7, 25 - start), start))
    # positions 0..4 hold 20..24 (the last wrap), 5..9 hold 15..19
    assert rb[:]["obs"][:, 0].tolist() == [20, 21, 22, 23, 24, 15, 16, 17, 18, 19]
    assert rb.write_count == 25
    assert storage.table.size == 10  # one item per position, old ones deleted
    assert storage.table.info()["num_store_evictions"] == 0


def test_a_position_written_twice_in_one_call_keeps_the_last_element(storages):
    storage = storages(5)
    storage.set([0, 2, 0], transitions(3, 10))  # len counts 3 writes, as TorchRL's storages do
    assert storage.get(0)["action"].item() == 12 % 3 and storage.get(0)["obs"][0] == 12
    assert storage.get(2)["obs"][0] == 11
    assert storage.table.size == 2
    with pytest.raises(IndexError, match="position 1 holds no element"):
        storage.get(1)


@pytest.mark.parametrize("dtype", [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
                                   torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_dtypes_and_shapes_are_preserved(storages, dtype):
    g = torch.Generator().manual_seed(0)
    raw = torch.randn(6, 2, 3, generator=g) * 50
    value = raw > 0 if dtype == torch.bool else raw.to(dtype)
    d = TensorDict({"x": value, "s": value[:, 0, 0]}, batch_size=[6])
    ours, ref = storages(8), LazyTensorStorage(8)
    ours.set(torch.arange(6), d)
    ref.set(torch.arange(6), d)
    assert_same(ours.get(slice(None)), ref.get(slice(None)))
    assert ours.get(0)["s"].shape == ()


def test_nested_keys_become_field_names_and_come_back(storages):
    keys = [("obs",), ("next", "obs"), ("a", "b", "c"), ("with/slash", "per%cent"), ("%2F",)]
    d = TensorDict({k: torch.full((3, 2), float(i)) for i, k in enumerate(keys)}, batch_size=[3])
    storage = storages(3)
    storage.set(torch.arange(3), d)
    names = storage.field_names
    assert names[("next", "obs")] == "next/obs" and names[("with/slash", "per%cent")] == "with%2Fslash/per%25cent"
    assert set(storage.store.signature) == set(names.values())
    for k in keys:
        assert key_of(field_name(k)) == k
    assert_same(storage.get(slice(None)), d)


def test_elements_with_their_own_batch_dims_are_kept_whole(storages):
    # trajectories of 5 steps stored as one element each (ndim=1)
    d = TensorDict({"obs": torch.arange(40.0).view(4, 5, 2), "step": torch.arange(20).view(4, 5)}, batch_size=[4, 5])
    ours, ref = storages(6), LazyTensorStorage(6)
    ReplayBuffer(storage=ours).extend(d)
    ReplayBuffer(storage=ref).extend(d)
    assert_same(ours.get([3, 0]), ref.get([3, 0]))
    assert ours.get([3, 0]).batch_size == torch.Size([2, 5])


def test_plain_tensors_and_tensorclasses_round_trip(storages):
    rb = ReplayBuffer(storage=storages(5))
    rb.extend(torch.arange(12).view(6, 2))
    assert torch.equal(rb[:], torch.tensor([[10, 11], [2, 3], [4, 5], [6, 7], [8, 9]]))

    @tensorclass
    class Step:
        obs: torch.Tensor
        reward: torch.Tensor

    storage = storages(4)
    storage.set(torch.arange(3), Step(obs=torch.ones(3, 2), reward=torch.arange(3.0), batch_size=[3]))
    got = storage.get([2, 0])
    assert type(got) is Step and got.reward.tolist() == [2.0, 0.0]


def test_len_empty_and_sampling_an_empty_storage(storages):
    storage = storages(10)
    rb = ReplayBuffer(storage=storage, batch_size=4)
    assert len(rb) == 0 and len(storage) == 0
    with pytest.raises(RuntimeError, match="empty"):
        rb.sample()
    with pytest.raises(RuntimeError, match="non-initialized"):
        storage.get(0)
    with pytest.raises(rp.errors.InvalidArgument, match="no table yet"):
        storage.table
    rb.extend(transitions(6))
    assert len(rb) == 6 and 5 in storage and 6 not in storage
    rb.empty()
    assert len(rb) == 0 and storage.table.size == 0
    with pytest.raises(RuntimeError, match="empty"):
        rb.sample()
    rb.extend(transitions(3, 100))
    assert rb[:]["obs"][:, 0].tolist() == [100, 101, 102]


# --- samplers -------------------------------------------------------------------------------------


def test_random_sampler_batches_have_the_right_shape_and_rows(storages):
    rb = TensorDictReplayBuffer(storage=storages(64), sampler=RandomSampler(), batch_size=16)
    rb.extend(transitions(40))
    for _ in range(5):
        s = rb.sample()
        assert s.batch_size == torch.Size([16]) and s["obs"].shape == (16, 4) and s["next", "done"].dtype == torch.bool
        np.testing.assert_array_equal(s["obs"][:, 0].long(), s["index"])  # the row at each drawn position


def test_sampler_without_replacement_visits_every_element_once_per_epoch(storages):
    rb = TensorDictReplayBuffer(storage=storages(50), sampler=SamplerWithoutReplacement(), batch_size=10)
    rb.extend(transitions(50))
    seen = []
    for _ in range(5):
        s = rb.sample()
        np.testing.assert_array_equal(s["obs"][:, 0].long(), s["index"])
        seen += s["index"].tolist()
    assert sorted(seen) == list(range(50))


# --- the prioritized sampler ----------------------------------------------------------------------


def prioritized(storage, alpha=1.0, beta=0.5, **kw):
    return TensorDictReplayBuffer(storage=storage, sampler=ReprisePrioritizedSampler(alpha=alpha, beta=beta),
                                  priority_key="td_error", **kw)


def test_priorities_go_to_the_table_and_new_elements_get_the_largest_so_far(storages):
    storage = storages(20)
    rb = prioritized(storage, alpha=0.6, batch_size=4)
    d = transitions(5)
    d["td_error"] = torch.tensor([0.5, 1.0, 2.0, 0.0, 3.0])
    rb.extend(d)
    assert storage.table.info()["sampler"] == "Prioritized(priority_exponent=0.6)"
    np.testing.assert_allclose(list(positions_of(storage).values()), d["td_error"].double().numpy() + EPS)
    s = rb.sample()
    s["td_error"] = torch.full((4,), 7.0)
    rb.update_tensordict_priority(s)
    for p in s["index"].tolist():
        assert positions_of(storage)[p] == pytest.approx(7.0 + EPS)
    d = transitions(2, 5)
    d["td_error"] = torch.zeros(2)
    rb.extend(d, update_priority=False)  # inserted at the largest priority given so far
    assert positions_of(storage)[5] == positions_of(storage)[6] == pytest.approx(7.0 + EPS)


def test_draws_follow_priority_to_the_alpha_and_weights_correct_for_them(storages):
    storage = storages(8, seed=3)
    rb = prioritized(storage, alpha=0.5, beta=0.7, batch_size=4000)
    d = transitions(4)
    d["td_error"] = torch.tensor([1.0, 4.0, 9.0, 0.0])
    rb.extend(d)
    s, info = rb.sample(return_info=True)
    counts = np.bincount(s["index"].numpy(), minlength=4)
    weight = np.sqrt([1.0, 4.0, 9.0, 0.0]) + np.array([1, 0.5, 1 / 3, 0]) * EPS / 2  # (p + eps)^0.5, first order
    expected = weight / weight.sum()
    assert counts[3] == 0  # priority 0 (+ eps): as good as never
    chi2 = ((counts[:3] - 4000 * expected[:3]) ** 2 / (4000 * expected[:3])).sum()
    assert chi2 < 13.8  # chi-square, 2 degrees of freedom, p = 0.001
    w = (4 * expected[s["index"].numpy()]) ** -0.7
    np.testing.assert_allclose(info["priority_weight"].numpy(), w / w.max(), rtol=1e-5)
    assert info["priority_weight"].dtype == torch.float32


def test_sampling_distribution_matches_torchrls_prioritized_sampler(storages):
    """The same priorities drawn by TorchRL's own sampler (segment trees) and by the table."""
    p = torch.tensor([0.2, 1.0, 0.5, 3.0, 0.1, 2.0])
    freq = {}
    for name, storage, sampler in (
        ("torchrl", LazyTensorStorage(6), PrioritizedSampler(max_capacity=6, alpha=0.8, beta=0.4)),
        ("reprise", storages(6, seed=1), ReprisePrioritizedSampler(alpha=0.8, beta=0.4)),
    ):
        rb = TensorDictReplayBuffer(storage=storage, sampler=sampler, priority_key="td_error", batch_size=6000,
                                    generator=torch.Generator().manual_seed(0))
        d = transitions(6)
        d["td_error"] = p
        rb.extend(d)
        freq[name] = np.bincount(rb.sample()["index"].numpy(), minlength=6) / 6000
    expected = (p.double() ** 0.8 / (p.double() ** 0.8).sum()).numpy()
    for name in freq:
        np.testing.assert_allclose(freq[name], expected, atol=0.02, err_msg=name)


def test_bad_priorities_are_refused_and_change_nothing(storages):
    storage = storages(10)
    rb = prioritized(storage)
    rb.extend(transitions(4))
    before = storage.table.items()
    for index, priority, message in (
        (torch.tensor([0, 1]), torch.tensor([1.0, float("nan")]), "index 1: priority must be finite and >= 0, got nan"),
        (torch.tensor([2, 3]), torch.tensor([-1.0, 2.0]), "index 2: priority must be finite and >= 0, got -1.0"),
        (torch.tensor([0, 7]), torch.tensor([1.0, 1.0]), "index 7 holds no element"),
        (torch.tensor([0, 1, 2]), torch.tensor([1.0, 2.0]), "2 priorities for 3 indices"),
    ):
        with pytest.raises(rp.errors.InvalidArgument, match=message):
            rb.update_priority(index, priority)
        assert storage.table.items() == before
    rb.update_priority(torch.tensor([-1, 2]), torch.tensor([5.0, 6.0]))  # -1: skipped, as TorchRL's writers mark it
    assert positions_of(storage)[2] == pytest.approx(6.0 + EPS)


def test_the_prioritized_sampler_needs_its_table_made_for_it(storages):
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(4), sampler=ReprisePrioritizedSampler(alpha=1, beta=1))
    with pytest.raises(rp.errors.InvalidArgument, match="needs a RepriseStorage"):
        rb.extend(transitions(2))
    storage = storages(4)
    storage.set(torch.arange(2), transitions(2))  # table made before any prioritized sampler: Uniform
    with pytest.raises(rp.errors.InvalidArgument, match="make the replay buffer with this sampler before writing"):
        TensorDictReplayBuffer(storage=storage, sampler=ReprisePrioritizedSampler(alpha=1, beta=1))
    storage = storages(4)
    sampler = ReprisePrioritizedSampler(alpha=0.5, beta=1)
    prioritized_rb = TensorDictReplayBuffer(storage=storage, sampler=sampler)
    prioritized_rb.extend(transitions(2))
    with pytest.raises(rp.errors.InvalidArgument, match="fixed when it was made"):
        sampler.alpha = 0.7
    prioritized_rb.empty()
    with pytest.raises(RuntimeError, match="empty"):  # at once: an empty table is never waited on
        prioritized_rb.sample(1)


# --- bad writes -----------------------------------------------------------------------------------


def bad_writes():
    good = transitions(3)
    wrong_dtype = good.clone()
    wrong_dtype["obs"] = wrong_dtype["obs"].double()
    wrong_shape = good.clone()
    wrong_shape["next", "obs"] = torch.zeros(3, 5)
    missing = good.clone().exclude(("next", "done"))
    extra = good.clone()
    extra["td_error"] = torch.zeros(3)
    non_tensor = good.clone()
    non_tensor["info"] = NonTensorData("text", batch_size=[3])
    return [
        (wrong_dtype, r"key 'obs' expects float32\[4\] per element, got float64\[4\]"),
        (wrong_shape, r"key \('next', 'obs'\) expects float32\[4\] per element, got float32\[5\]"),
        (missing, r"key \('next', 'done'\) \(bool\[1\]\) is missing"),
        (extra, r"unexpected key 'td_error' \(float32\[\] per element\)"),
        (non_tensor, "key 'info' holds non-tensor data"),
        (good.reshape(3, 1), r"expected a TensorDict of batch size \[3\] for 3 element\(s\)"),
        (torch.zeros(3, 4), "holds tensordict elements .* got a tensor"),
    ]


@pytest.mark.parametrize("case", range(len(bad_writes())))
def test_a_write_unlike_the_first_is_refused_naming_the_key_and_changes_nothing(storages, case):
    data, message = bad_writes()[case]
    storage = storages(6)
    rb = ReplayBuffer(storage=storage)
    rb.extend(transitions(4))
    before, items = rb[:], storage.table.items()
    with pytest.raises(rp.errors.InvalidArgument, match=message):
        rb.extend(data)
    # The storage is as it was (TorchRL's RoundRobinWriter has moved its cursor before writing).
    assert len(rb) == 4 and storage.table.items() == items
    assert_same(rb[:], before)
    storage.set(torch.arange(4, 6), transitions(2, 50))  # still writable
    assert rb[:]["obs"][:, 0].tolist() == [0, 1, 2, 3, 50, 51]


@pytest.mark.parametrize("data, message", [
    (TensorDict({"z": torch.zeros(2, 3, dtype=torch.complex64)}, [2]), "key 'z' is complex64, which Reprise cannot store"),
    (TensorDict({"e": torch.zeros(2, 0)}, [2]), "key 'e' has an empty dimension"),
    (TensorDict({}, [2]), "holds no tensor"),
    ({"obs": torch.zeros(2)}, "stores TensorDicts, tensorclasses and tensors, got dict"),
])
def test_a_first_write_that_cannot_be_stored_leaves_the_storage_uninitialized(storages, data, message):
    storage = storages(4)
    with pytest.raises(rp.errors.InvalidArgument, match=message):
        storage.set(torch.arange(2), data)
    assert len(storage) == 0 and storage.field_names == {}
    storage.set(torch.arange(2), transitions(2))
    assert len(storage) == 2


def test_bad_indices_raise_index_error(storages):
    storage = storages(4)
    storage.set(torch.arange(3), transitions(3))
    for index, message in ((3, "index 3 is out of range for 3"), ([0, -4], "index -4 is out of range"),
                           (torch.tensor([True]), r"boolean index needs shape \[3\]"), ((0, 1), "one-dimensional")):
        with pytest.raises(IndexError, match=message):
            storage.get(index)
    with pytest.raises(IndexError, match="cursor 4 is out of range for 4"):
        storage.set(4, transitions(1)[0])
    storage.set(3, transitions(1)[0], set_cursor=False)  # written, but past len: not readable
    with pytest.raises(IndexError, match="out of range for 3"):
        storage.get(3)


# --- state: state_dict, dumps/loads ---------------------------------------------------------------


def filled_prioritized(storage, seed=0):
    rb = prioritized(storage, alpha=0.7, batch_size=5, generator=torch.Generator().manual_seed(seed))
    for start in range(0, 30, 9):
        d = transitions(9, start)
        d["td_error"] = torch.rand(9, generator=torch.Generator().manual_seed(start))
        rb.extend(d)
    s = rb.sample()
    s["td_error"] = torch.full((5,), 4.0)
    rb.update_tensordict_priority(s)
    return rb


def test_state_dict_round_trips_data_priorities_length_and_cursor(storages):
    rb = filled_prioritized(storages(16))
    buf = io.BytesIO()
    torch.save(rb.state_dict(), buf)
    buf.seek(0)
    other = storages(16)
    rb2 = prioritized(other, alpha=0.7, batch_size=5)
    rb2.load_state_dict(torch.load(buf, weights_only=False))
    assert len(rb2) == len(rb) == 16
    assert_same(rb2[:], rb[:])
    assert positions_of(other) == pytest.approx(positions_of(rb.storage))
    assert rb2.sampler.default_priority == rb.sampler.default_priority == 4.0
    d = transitions(3, 100)
    d["td_error"] = torch.ones(3)
    for b in (rb, rb2):
        b.extend(d.clone())
    assert_same(rb2[:], rb[:])


def test_state_dict_of_an_empty_storage_round_trips_and_a_mismatch_changes_nothing(storages):
    empty = storages(8)
    sd = empty.state_dict()
    target = storages(8)
    target.set(torch.arange(2), transitions(2))
    target.load_state_dict(sd)
    assert len(target) == 0 and target.table.size == 0
    full = storages(8)
    full.set(torch.arange(3), transitions(3))
    wrong = storages(8)
    wrong.set(torch.arange(1), TensorDict({"x": torch.zeros(1)}, [1]))
    with pytest.raises(rp.errors.InvalidArgument, match="holds elements"):
        wrong.load_state_dict(full.state_dict())
    assert len(wrong) == 1 and wrong.table.size == 1
    with pytest.raises(rp.errors.InvalidArgument, match="max_size=8, this storage has max_size=9"):
        storages(9).load_state_dict(sd)


def test_dumps_and_loads_restore_keys_priorities_and_the_draws_to_come(storages, tmp_path):
    rb = filled_prioritized(storages(16, seed=11))
    rb.dumps(tmp_path)
    rb.dumps(tmp_path)  # again into the same place: the older checkpoint is replaced
    assert len([p for p in os.listdir(tmp_path / "storage") if p.startswith("ckpt-")]) == 1
    assert rp.checkpoint.latest(tmp_path / "storage") is not None  # a Reprise checkpoint, for rp.Server too
    other = storages(16)
    rb2 = prioritized(other, alpha=0.7, batch_size=5)
    rb2.loads(tmp_path)
    assert_same(rb2[:], rb[:])
    assert other.table.items() == rb.storage.table.items()  # keys, priorities, times sampled
    for _ in range(3):  # the tables' generators continue alike
        assert_same(rb2.sample(), rb.sample())
    assert rb2.writer._cursor == rb.writer._cursor


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.one_of(
    st.tuples(st.just("write"), st.lists(st.integers(0, 11), min_size=1, max_size=12, unique=True)),
    st.tuples(st.just("extend"), st.integers(1, 30)),
    st.tuples(st.just("empty"), st.just(0)),
), max_size=12))
def test_any_sequence_of_writes_reads_as_lazy_tensor_storage_and_never_fills_the_store(storages, ops):
    ours = ReplayBuffer(storage=storages(12))
    ref = ReplayBuffer(storage=LazyTensorStorage(12))
    written, counter = set(), 0
    for kind, arg in ops:
        if kind == "empty":
            ours.empty(), ref.empty()
            written.clear()
            continue
        n = len(arg) if kind == "write" else arg
        d = transitions(n, counter)
        counter += n
        if kind == "write":
            ours.storage.set(torch.tensor(arg), d.clone())
            ref.storage.set(torch.tensor(arg), d.clone())
            written |= set(arg)
        else:
            cursor = ours.writer._cursor
            ours.extend(d.clone()), ref.extend(d.clone())
            written |= {(cursor + i) % 12 for i in range(n)}
        assert len(ours) == len(ref)
        readable = sorted(p for p in written if p < len(ref))
        assert_same(ours.storage.get(readable), ref.storage.get(readable))
        assert ours.storage.table.size == len(written)
        assert ours.storage.table.info()["num_store_evictions"] == 0


# --- pickling: a copy through Reprise's checkpoint format ------------------------------------------


def test_a_pickled_prioritized_buffer_is_a_copy_with_the_same_elements_positions_and_priorities(storages):
    rb = filled_prioritized(storages(16, seed=11))
    rb2 = pickle.loads(pickle.dumps(rb))
    copied = storages.closed_at_teardown(rb2.storage)
    assert copied is not rb.storage and copied.store.path != rb.storage.store.path
    assert len(rb2) == len(rb) == 16
    assert_same(rb2[:], rb[:])
    np.testing.assert_array_equal(copied._keys, rb.storage._keys)  # the position map
    np.testing.assert_array_equal(copied._rows, rb.storage._rows)
    assert positions_of(copied) == positions_of(rb.storage)
    assert copied.table.items() == rb.storage.table.items()  # keys, priorities, times sampled
    assert rb2.sampler.default_priority == rb.sampler.default_priority == 4.0
    assert rb2.sampler._storage() is copied  # rebound to its own storage
    for _ in range(3):  # the tables' generators continue alike, and drawn keys map back to positions
        assert_same(rb2.sample(), rb.sample())
    before, cursor = rb[:], rb2.writer._cursor
    d = transitions(3, 100)
    d["td_error"] = torch.ones(3)
    rb2.extend(d)  # the copy writes on its own (a new writer): the original is unchanged
    written = [(cursor + i) % 16 for i in range(3)]
    assert rb2.storage.get(written)["obs"][:, 0].tolist() == [100, 101, 102]
    assert_same(rb[:], before)
    assert copied.table.size == rb.storage.table.size == 16


@tensorclass
class Pair:  # at module level, so that pickle finds it
    a: torch.Tensor
    b: torch.Tensor


def test_a_pickled_storage_of_tensorclasses_and_an_empty_one_come_back_alike(storages):
    storage = storages(8)
    rb = ReplayBuffer(storage=storage, batch_size=4)
    rb.extend(Pair(a=torch.arange(6.0)[:, None].expand(6, 3).clone(), b=torch.arange(6), batch_size=[6]))
    twin = storages.closed_at_teardown(copy.deepcopy(storage))
    assert len(twin) == 6 and type(twin.get(0)) is Pair
    for index in (slice(None), [5, 0, 3]):
        assert torch.equal(twin.get(index).a, storage.get(index).a)
        assert torch.equal(twin.get(index).b, storage.get(index).b)
    empty = storages.closed_at_teardown(pickle.loads(pickle.dumps(storages(4))))
    assert len(empty) == 0 and not empty.initialized
    empty.set(torch.arange(2), transitions(2))  # the first write still makes the table
    assert_same(empty.get(slice(None)), transitions(2))


def test_a_storage_refuses_a_shallow_copy_and_a_spawned_process(storages):
    storage = storages(4)
    storage.set(torch.arange(2), transitions(2))
    with pytest.raises(TypeError, match="copy.deepcopy or pickle"):
        copy.copy(storage)
    multiprocessing.context.set_spawning_popen(object())  # what Process.start does under "spawn"
    try:
        with pytest.raises(RuntimeError, match="process being spawned.*rp.Server"):
            pickle.dumps(storage)
    finally:
        multiprocessing.context.set_spawning_popen(None)
    assert_same(storage.get(slice(None)), transitions(2))


# --- Reprise's side: serving, closing, devices ----------------------------------------------------


def test_a_served_storage_is_sampled_and_reprioritized_by_clients(storages):
    storage = storages(20, name="torchrl")
    rb = prioritized(storage, batch_size=64)
    rb.extend(transitions(10))
    with rp.Server([storage.table]) as server, rp.Client(server.local_address) as client:
        s = client.sample("torchrl", 8)
        assert set(s.data) == {"obs", "action", "next/obs", "next/reward", "next/done", "index"}
        np.testing.assert_array_equal(s.data["next/obs"][:, 0, 0], s.data["obs"][:, 0, 0] + 1)
        keep = storage._keys[7]
        others = [int(k) for k in storage._keys if k and k != keep]
        client.update_priorities("torchrl", others, [0.0] * len(others))
    assert set(rb.sample()["index"].tolist()) == {7}  # the only item left with a positive priority


def test_close_removes_the_store_file_and_refuses_further_use(storages):
    storage = storages(4)
    storage.set(torch.arange(2), transitions(2))
    path = storage.store.path
    assert os.path.exists(path)
    storage.close()
    assert not os.path.exists(path)
    with pytest.raises(rp.errors.InvalidArgument, match="is closed"):
        storage.get(0)
    with pytest.raises(rp.errors.InvalidArgument, match="is closed"):
        pickle.dumps(storage)


def test_a_cuda_device_without_cuda_is_refused_at_construction():
    if torch.cuda.is_available():
        pytest.skip("CUDA is available")
    with pytest.raises(rp.errors.InvalidArgument, match="CUDA is not available"):
        RepriseStorage(4, device="cuda")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_cuda_storage_gathers_on_the_gpu_what_the_cpu_twin_reads(storages):
    gpu, cpu = storages(40, device="cuda"), storages(40)
    for s in (gpu, cpu):
        rb = ReplayBuffer(storage=s)
        for start in range(0, 70, 13):
            rb.extend(transitions(13, start).to(s.device))
    index = torch.randint(0, 40, (32,))
    got = gpu.get(index.cuda())
    assert got.device.type == "cuda" and got["obs"].device.type == "cuda"
    assert_same(got.cpu(), cpu.get(index))
    for s in (gpu, cpu):  # waits for the gather above before its rows are reused
        s.set(torch.arange(5), transitions(5, 500))
    assert_same(gpu.get(slice(None)).cpu(), cpu.get(slice(None)))
