"""``device="cpu"``: every sampling path returns ``data`` as torch CPU tensors, with the
same values, dtypes and shapes as the numpy path (``device=None``) for the same seed,
and the rest of the Sample exactly as the CUDA path returns it; so code written with
``device = "cuda" if torch.cuda.is_available() else "cpu"`` runs unchanged without a GPU."""

from __future__ import annotations

import sys

import numpy as np
import pytest

import reprise as rp
from cluster_ranks import run_ranks

torch = pytest.importorskip("torch")
rt = pytest.importorskip("reprise.torch")
from reprise.torch.collect import wait_released  # noqa: E402

SIG = {
    "obs": rp.Field((3, 2), "float32"),
    "act": rp.Field((), "int64"),
    "flag": rp.Field((), "bool"),
    "half": rp.Field((5,), "float16"),
    "u16": rp.Field((3,), "uint16"),
    "u64": rp.Field((), "uint64"),
}
CPU_DEVICES = ["cpu", torch.device("cpu")]
META = ("keys", "probabilities", "priorities", "times_sampled", "lengths")


@pytest.fixture(autouse=True)
def no_emulation():
    """Every test starts and ends with "cuda" meaning CUDA (some turn emulation on)."""
    rt.emulate_cuda(False)
    yield
    wait_released(10)
    rt.emulate_cuda(False)


def step(i):
    return {
        "obs": np.full((3, 2), i, np.float32) + np.arange(6, dtype=np.float32).reshape(3, 2) / 10,
        "act": np.int64(i),
        "flag": np.bool_(i % 2),
        "half": np.full(5, i % 100, np.float16),
        "u16": np.array([i, i + 1, i + 2], np.uint16),
        "u64": np.uint64(2**63 + i),
    }


def fill(store, tables, episodes=4, length=6):
    """Items of 1 and 3 steps over every table (ragged samples, zeros past an item's end)."""
    i = 0
    with store.writer() as w:
        for _ in range(episodes):
            for t in range(length):
                w.append(step(i))
                i += 1
                for n in (1, 3):
                    if t + 1 >= n:
                        for table in tables:
                            w.create_item(table, n, float(1 + i % 5))
            w.end_episode()


def twins(store, names, **kw):
    """Tables that draw the same items in the same order: same sampler, same seed."""
    tables = [rp.Table(name, store, sampler=rp.selectors.Prioritized(0.8), max_size=200, seed=7, **kw)
              for name in names]
    fill(store, tables)
    return tables


def assert_tensors_equal_numpy(s, ref):
    """``s`` holds torch CPU tensors equal in dtype, shape and value to ``ref``'s numpy
    arrays; the other attributes are numpy and equal."""
    assert set(s.data) == set(ref.data)
    for name, tensor in s.data.items():
        array = ref.data[name]
        assert isinstance(tensor, torch.Tensor) and tensor.device.type == "cpu", name
        assert tensor.dtype == torch.from_numpy(array).dtype and tuple(tensor.shape) == array.shape, name
        np.testing.assert_array_equal(tensor.numpy(), array, err_msg=name)
    for attr in META:
        got, want = getattr(s, attr), getattr(ref, attr)
        assert isinstance(got, np.ndarray) and got.dtype == want.dtype, attr
        np.testing.assert_array_equal(got, want, err_msg=attr)
    assert s.table_size == ref.table_size
    np.testing.assert_allclose(s.importance_weights(0.4), ref.importance_weights(0.4))


# --- Table.sample ------------------------------------------------------------------------------

@pytest.mark.parametrize("device", CPU_DEVICES, ids=["str", "torch.device"])
def test_table_sample_to_cpu_gives_tensors_equal_to_the_numpy_sample(make_store, device):
    store = make_store(SIG, capacity=512, block_steps=4)
    numpy_table, torch_table = twins(store, ["numpy", "torch"])
    for n in (1, 9, 40):
        ref = numpy_table.sample(n)
        s = torch_table.sample(n, device=device)
        assert ref.lengths.min() < ref.lengths.max() or n == 1   # ragged batches are covered
        assert_tensors_equal_numpy(s, ref)
    s = torch_table.sample(5, device=device, fields=["act", "u64"])
    assert set(s.data) == {"act", "u64"} and s.data["u64"].dtype == torch.uint64


def test_table_sample_to_cpu_returns_what_the_cuda_path_returns(make_store):
    """The emulated CUDA path (the GPU code, "cuda" mapped to the CPU) and ``"cpu"``
    give Samples of the same kinds: numpy metadata, tensor data of the same dtypes."""
    store = make_store(SIG, capacity=512, block_steps=4)
    cuda_table, cpu_table = twins(store, ["cuda", "cpu"])
    rt.emulate_cuda(True)
    c = cuda_table.sample(16, device="cuda")
    s = cpu_table.sample(16, device="cpu")
    for attr in META:
        assert type(getattr(s, attr)) is type(getattr(c, attr)), attr
        assert getattr(s, attr).dtype == getattr(c, attr).dtype, attr
        np.testing.assert_array_equal(getattr(s, attr), getattr(c, attr), err_msg=attr)
    assert type(s.table_size) is type(c.table_size) and s.table_size == c.table_size
    for name in SIG:
        assert type(s.data[name]) is type(c.data[name]) and s.data[name].dtype == c.data[name].dtype, name
        assert torch.equal(s.data[name], c.data[name]), name


def test_the_cuda_or_cpu_idiom_runs_as_written(make_store):
    store = make_store(SIG, capacity=512, block_steps=4)
    (table,) = twins(store, ["replay"])
    device = "cuda" if torch.cuda.is_available() else "cpu"
    s = table.sample(32, device=device)
    reward = s.data["obs"][:, 0, 0, 0]                          # tensor arithmetic, as on the GPU
    weights = torch.as_tensor(s.importance_weights(0.4), device=device)
    loss = (weights * reward.float()).mean()
    assert loss.device.type == device
    assert table.update_priorities(s.keys, (reward.abs() + 1.0).double().cpu().numpy()) == 32
    for batch in table.iterate(8, device=device, num_batches=2):
        assert batch.data["act"].device.type == device


def test_cpu_samples_of_a_device_store_and_of_gpu_selection_are_tensors(make_store):
    """Tables that gather on their device (emulated here) still give CPU tensors equal
    to their numpy samples."""
    rt.emulate_cuda(True)
    device_store = rp.Store(SIG, capacity=512, block_steps=4, device="cuda")
    try:
        for store, kw in ((device_store, {}), (make_store(SIG, capacity=512, block_steps=4),
                                               {"selection_device": "cuda"})):
            numpy_table, torch_table = twins(store, ["numpy", "torch"], **kw)
            assert_tensors_equal_numpy(torch_table.sample(12, device="cpu"), numpy_table.sample(12))
    finally:
        device_store.close()


def test_a_timed_out_cpu_sample_has_a_partial_of_tensors(make_store):
    store = make_store(SIG, capacity=256, block_steps=4)
    q = rp.Table.queue("q", store, max_size=10)
    with store.writer() as w:
        for i in range(3):
            w.append(step(i))
            w.create_item(q, 1, 1.0)
    with pytest.raises(rp.errors.Timeout) as e:
        q.sample(5, device="cpu", timeout=0.05, fields=["act"])
    partial = e.value.partial
    assert isinstance(partial.data["act"], torch.Tensor)
    np.testing.assert_array_equal(partial.data["act"][:, 0].numpy(), [0, 1, 2])


# --- Table.iterate -----------------------------------------------------------------------------

def test_iterate_to_cpu_yields_tensors_equal_to_the_numpy_batches(make_store):
    store = make_store(SIG, capacity=512, block_steps=4)
    numpy_table, torch_table = twins(store, ["numpy", "torch"])
    ref = list(numpy_table.iterate(6, num_batches=4))
    got = list(torch_table.iterate(6, device="cpu", prefetch=3, num_batches=4))
    assert len(got) == len(ref) == 4
    for s, r in zip(got, ref):
        assert_tensors_equal_numpy(s, r)


def test_iterate_to_cpu_draws_each_batch_when_asked_so_updates_apply_to_the_next(make_store):
    """With prefetch on the host, drawing ahead would hand out batches drawn before the
    caller's priority updates; the host draws on demand, so each update counts at once."""
    store = make_store({"x": rp.Field((), "int64")}, capacity=256, block_steps=8)
    table = rp.Table("top", store, sampler=rp.selectors.MaxHeap(), max_size=100)
    table.insert({"x": np.arange(10, dtype=np.int64).reshape(-1, 1)}, priorities=np.arange(10.0) + 1)
    seen = []
    for s in table.iterate(1, device="cpu", prefetch=4, num_batches=5):
        seen.append(int(s.data["x"][0, 0]))
        table.update_priorities(s.keys, [0.0])                  # never the top one again
    assert seen == [9, 8, 7, 6, 5]


# --- clients -----------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["local", "remote"])
def test_client_sample_and_iterate_to_cpu_give_tensors_equal_to_numpy(make_store, kind):
    store = make_store(SIG, capacity=512, block_steps=4)
    tables = twins(store, ["numpy", "torch", "numpy-it", "torch-it"])
    queue = rp.Table.queue("q", store, max_size=10)
    with store.writer() as w:
        for i in range(2):
            w.append(step(i))
            w.create_item(queue, 1, 1.0)
    with rp.Server([*tables, queue], address="127.0.0.1:0" if kind == "remote" else None) as server:
        client = rp.Client(server.address if kind == "remote" else server.local_address)
        try:
            for device in CPU_DEVICES:
                assert_tensors_equal_numpy(client.sample("torch", 10, device=device), client.sample("numpy", 10))
            ref = list(client.iterate("numpy-it", 5, num_batches=3))
            got = list(client.iterate("torch-it", 5, num_batches=3, device="cpu"))
            assert len(got) == 3
            for s, r in zip(got, ref):
                assert_tensors_equal_numpy(s, r)
            with pytest.raises(rp.errors.Timeout) as e:
                client.sample("q", 3, timeout=0.2, device="cpu")
            assert isinstance(e.value.partial.data["act"], torch.Tensor)
            np.testing.assert_array_equal(e.value.partial.data["act"][:, 0].numpy(), [0, 1])
        finally:
            client.close()


# --- bad devices -------------------------------------------------------------------------------

BAD = [("gpu please", "device 'gpu please' is not a device: expected 'cuda', 'cuda:N', 'cpu' or None"),
       ("meta", "device 'meta': expected a CUDA device ('cuda' or 'cuda:N'), 'cpu' or None")]


@pytest.mark.parametrize("device,message", BAD, ids=[b[0] for b in BAD])
def test_a_bad_device_is_refused_by_name_and_changes_nothing(make_store, device, message):
    store = make_store(SIG, capacity=256, block_steps=4)
    (table,) = twins(store, ["replay"])
    with rp.Server([table]) as server, rp.Client(server.local_address) as client:
        calls = [lambda: table.sample(2, device=device),
                 lambda: table.iterate(2, device=device),
                 lambda: client.sample("replay", 2, device=device),
                 lambda: next(client.iterate("replay", 2, device=device))]
        for call in calls:
            with pytest.raises(rp.errors.InvalidArgument) as e:
                call()
            assert message in str(e.value)
        assert table.info()["num_samples"] == 0


def test_cpu_tensors_without_torch_say_so_and_change_nothing(make_store, monkeypatch):
    store = make_store(SIG, capacity=256, block_steps=4)
    (table,) = twins(store, ["replay"])
    monkeypatch.setitem(sys.modules, "torch", None)               # `import torch` fails
    for call in (lambda: table.sample(2, device="cpu"), lambda: table.iterate(2, device="cpu")):
        with pytest.raises(rp.errors.InvalidArgument, match="need PyTorch: pip install 'reprise\\[gpu\\]'"):
            call()
    assert table.info()["num_samples"] == 0
    assert isinstance(table.sample(2).data["obs"], np.ndarray)     # numpy needs no torch


# --- cluster mode ------------------------------------------------------------------------------

def _sharded_body(rank, world):
    """A sharded table sampled to numpy and to "cpu": the same dtypes and shapes, and
    each drawn row is its item's (``x`` names the item; ``v`` is derived from it)."""
    table = rp.distributed.ShardedTable("replay", {"x": rp.Field((), "int64"), "v": rp.Field((3,), "float32")},
                                        capacity_per_shard=256, seed=3, shards="rank", timeout=20, block_steps=4)
    x = np.arange(24, dtype=np.int64).reshape(12, 2)
    table.insert({"x": x, "v": np.repeat(x[..., None], 3, axis=2).astype(np.float32) / 2},
                 np.linspace(1.0, 2.0, 12))
    ref, s = table.sample(6), table.sample(6, device="cpu")
    out = {"types": sorted({type(v).__name__ for v in s.data.values()}),
           "devices": sorted({v.device.type for v in s.data.values()}),
           "same kinds": all(torch.from_numpy(ref.data[k]).dtype == v.dtype and ref.data[k].shape == tuple(v.shape)
                             for k, v in s.data.items()),
           "rows are their items'": all(np.array_equal(v.data["v"][:, :, 0], v.data["x"] / 2)
                                        and np.array_equal(v.data["x"][:, 1], v.data["x"][:, 0] + 1)
                                        for v in (ref, s)),
           "metadata": all(isinstance(getattr(s, a), np.ndarray) and getattr(s, a).dtype == getattr(ref, a).dtype
                           for a in META)}
    try:
        table.sample(2, device="gpu please")
    except rp.errors.InvalidArgument as e:
        out["bad"] = str(e)
    table.close()
    return out


def test_sharded_table_sample_to_cpu_gives_tensors_like_the_numpy_sample():
    (out,) = run_ranks(1, _sharded_body)
    assert out.pop("types") == ["Tensor"] and out.pop("devices") == ["cpu"]
    assert "device 'gpu please' is not a device: expected 'cuda', 'cuda:N', 'cpu' or None" in out.pop("bad")
    assert all(out.values()), out
