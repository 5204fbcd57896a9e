"""Store: signature validation, capacity in whole blocks, the shared-memory file."""

import gc
import os
import stat

import numpy as np
import pytest

import reprise as rp

ALL_DTYPES = [
    "bool", "int8", "int16", "int32", "int64",
    "uint8", "uint16", "uint32", "uint64",
    "float16", "float32", "float64",
]


def _value(dtype, shape, seed):
    rng = np.random.default_rng(seed)
    if dtype == "bool":
        return rng.integers(0, 2, size=shape).astype(bool)
    if np.dtype(dtype).kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)
    return rng.standard_normal(shape).astype(dtype)


# --- Field -----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_field_accepts_every_documented_dtype(dtype):
    f = rp.Field((2, 3), dtype)
    assert f.dtype == dtype
    assert f.shape == (2, 3)
    assert f.nbytes == 6 * np.dtype(dtype).itemsize


def test_field_accepts_numpy_dtype_objects_and_an_int_shape():
    f = rp.Field(5, np.float32)
    assert f.shape == (5,) and f.dtype == "float32"
    assert rp.Field((), np.dtype("uint8")).dtype == "uint8"


@pytest.mark.parametrize("dtype", ["complex64", "float128", "str", "object", "not-a-dtype"])
def test_field_rejects_unknown_dtype_naming_it(dtype):
    with pytest.raises(rp.errors.InvalidArgument, match=f"'{dtype}'") as e:
        rp.Field((3,), dtype)
    assert "float32" in str(e.value)  # lists what is accepted
    assert isinstance(e.value, ValueError)


@pytest.mark.parametrize("shape", [(2, 0), (0,), (3, -1), (-4,), (2.5,), ("a",), (True,)])
def test_field_rejects_bad_dimensions_naming_the_shape(shape):
    with pytest.raises(rp.errors.InvalidArgument, match=r">= 1") as e:
        rp.Field(shape, "float32")
    assert str(shape[0]) in str(e.value) or repr(shape[0]) in str(e.value)


def test_field_rejects_a_shape_that_is_not_a_sequence():
    with pytest.raises(rp.errors.InvalidArgument, match="shape"):
        rp.Field(object(), "float32")


def test_field_repr_shows_shape_and_dtype():
    assert repr(rp.Field((4, 84, 84), "uint8")) == "Field((4, 84, 84), 'uint8')"


# --- Store construction ------------------------------------------------------------------


def test_store_holds_every_dtype_and_round_trips_values(make_store):
    sig = {f"f_{d}": rp.Field((2,), d) for d in ALL_DTYPES}
    store = make_store(sig, capacity=64, block_steps=8)
    table = rp.Table("t", store, sampler=rp.selectors.Fifo(), max_size=8)
    step = {f"f_{d}": _value(d, (2,), i) for i, d in enumerate(ALL_DTYPES)}
    with store.writer() as w:
        w.append(step)
        w.create_item(table, num_steps=1, priority=1.0)
    s = table.sample(1)
    for name, value in step.items():
        assert s.data[name].dtype == value.dtype
        np.testing.assert_array_equal(s.data[name][0, 0], value)


def test_store_exposes_signature_capacity_and_block_steps(make_store):
    sig = {"obs": rp.Field((4, 84, 84), "uint8"), "action": rp.Field((), "int64")}
    store = make_store(sig, capacity=128, block_steps=32)
    assert store.signature == sig
    assert store.capacity == 128
    assert store.block_steps == 32
    assert store.num_blocks == 4
    assert store.free_blocks == 4


def test_store_signature_is_a_copy(make_store):
    store = make_store({"x": rp.Field((), "int64")})
    store.signature["y"] = rp.Field((), "int8")
    assert list(store.signature) == ["x"]


@pytest.mark.parametrize(
    "capacity, block_steps, rounded, blocks",
    [(100, 16, 112, 7), (1, 64, 64, 1), (64, 64, 64, 1), (65, 64, 128, 2), (10, 1, 10, 10), (7, 3, 9, 3)],
)
def test_capacity_rounds_up_to_whole_blocks(make_store, capacity, block_steps, rounded, blocks):
    store = make_store(capacity=capacity, block_steps=block_steps)
    assert store.capacity == rounded
    assert store.num_blocks == blocks
    assert store.free_blocks == blocks


@pytest.mark.parametrize("capacity", [0, -1, -1000])
def test_store_rejects_non_positive_capacity_naming_it(capacity):
    with pytest.raises(rp.errors.InvalidArgument, match=f"capacity.*{capacity}"):
        rp.Store({"x": rp.Field((), "int64")}, capacity=capacity)


@pytest.mark.parametrize("block_steps", [0, -1, -64])
def test_store_rejects_non_positive_block_steps_naming_it(block_steps):
    with pytest.raises(rp.errors.InvalidArgument, match=f"block_steps.*{block_steps}"):
        rp.Store({"x": rp.Field((), "int64")}, capacity=64, block_steps=block_steps)


@pytest.mark.parametrize("capacity", [10.0, "10", None, True])
def test_store_rejects_non_integer_capacity(capacity):
    with pytest.raises(rp.errors.InvalidArgument, match="capacity"):
        rp.Store({"x": rp.Field((), "int64")}, capacity=capacity)


@pytest.mark.parametrize("signature", [{}, None, [("x", rp.Field((), "int64"))]])
def test_store_rejects_an_empty_or_non_dict_signature(signature):
    with pytest.raises(rp.errors.InvalidArgument, match="signature"):
        rp.Store(signature, capacity=64)


def test_store_rejects_a_signature_value_that_is_not_a_field():
    with pytest.raises(rp.errors.InvalidArgument, match="'obs'"):
        rp.Store({"obs": ((4,), "uint8")}, capacity=64)


@pytest.mark.parametrize("name", ["", 3])
def test_store_rejects_bad_field_names(name):
    with pytest.raises(rp.errors.InvalidArgument, match="field names"):
        rp.Store({name: rp.Field((), "int64")}, capacity=64)


def test_store_rejects_an_unavailable_device():
    with pytest.raises(rp.errors.InvalidArgument, match="'tpu'"):
        rp.Store({"x": rp.Field((), "int64")}, capacity=64, device="tpu")


def test_store_rejects_more_blocks_than_it_can_index():
    with pytest.raises(rp.errors.InvalidArgument, match=r"capacity 1099511627776 with block_steps 1.*raise block_steps"):
        rp.Store({"x": rp.Field((), "int64")}, capacity=1 << 40, block_steps=1)


def test_store_rejects_columns_that_cannot_fit_in_memory():
    with pytest.raises(rp.errors.InvalidArgument, match=r"field 'x' \(int64\[1099511627776\]\).*does not fit"):
        rp.Store({"x": rp.Field((1 << 40,), "int64")}, capacity=1 << 24, block_steps=1 << 20)


# --- shared memory -------------------------------------------------------------------------


def test_store_file_lives_in_dev_shm_with_mode_0600(make_store):
    store = make_store(capacity=256, block_steps=16)
    assert os.path.dirname(store.path) == "/dev/shm"
    st = os.stat(store.path)
    assert stat.S_IMODE(st.st_mode) == 0o600
    assert st.st_uid == os.getuid()


def test_store_file_can_go_to_a_chosen_directory(tmp_path):
    store = rp.Store({"x": rp.Field((), "int64")}, capacity=64, directory=tmp_path)
    assert os.path.dirname(store.path) == str(tmp_path)
    assert stat.S_IMODE(os.stat(store.path).st_mode) == 0o600
    store.close()
    assert os.listdir(tmp_path) == []


def test_store_in_a_missing_directory_names_it():
    with pytest.raises(rp.errors.RepriseError, match="/nonexistent-reprise-dir"):
        rp.Store({"x": rp.Field((), "int64")}, capacity=64, directory="/nonexistent-reprise-dir")


def test_store_file_is_large_enough_for_every_column(make_store):
    sig = {"obs": rp.Field((4, 8), "float32"), "a": rp.Field((), "int8")}
    store = make_store(sig, capacity=1000, block_steps=100)
    assert os.stat(store.path).st_size >= 1000 * (4 * 8 * 4 + 1)


def test_each_store_gets_its_own_file(make_store):
    a, b = make_store(), make_store()
    assert a.path != b.path
    assert os.path.exists(a.path) and os.path.exists(b.path)


def test_close_removes_the_shm_file_and_is_idempotent():
    store = rp.Store({"x": rp.Field((), "int64")}, capacity=64)
    path = store.path
    assert os.path.exists(path)
    assert not store.closed
    store.close()
    assert store.closed
    assert not os.path.exists(path)
    store.close()
    assert not os.path.exists(path)


def test_store_context_manager_closes_it():
    with rp.Store({"x": rp.Field((), "int64")}, capacity=64) as store:
        path = store.path
        assert os.path.exists(path)
    assert store.closed
    assert not os.path.exists(path)


def test_dropping_the_last_reference_removes_the_shm_file():
    store = rp.Store({"x": rp.Field((), "int64")}, capacity=64)
    path = store.path
    del store
    gc.collect()
    assert not os.path.exists(path)


def test_closed_store_refuses_new_writers_and_tables():
    store = rp.Store({"x": rp.Field((), "int64")}, capacity=64)
    store.close()
    with pytest.raises(rp.errors.InvalidArgument, match="closed"):
        store.writer()
    with pytest.raises(rp.errors.InvalidArgument, match="closed"):
        rp.Table("t", store)


def test_tables_and_writers_keep_working_after_close():
    store = rp.Store({"x": rp.Field((), "int64")}, capacity=64, block_steps=8)
    table = rp.Table("t", store, sampler=rp.selectors.Fifo(), max_size=8)
    w = store.writer()
    store.close()
    w.append({"x": 42})
    w.create_item(table, num_steps=1, priority=1.0)
    assert table.sample(1).data["x"][0, 0] == 42
    w.close()


def test_table_names_must_be_unique_per_store(make_store):
    store = make_store()
    first = rp.Table("t", store)
    with pytest.raises(rp.errors.InvalidArgument, match="'t'"):
        rp.Table("t", store)
    del first
    rp.Table("t", store)  # the name is free again once the first table is gone


def test_writer_rejects_non_positive_max_sequence_length(make_store):
    store = make_store()
    for bad in (0, -3):
        with pytest.raises(rp.errors.InvalidArgument, match=f"max_sequence_length.*{bad}"):
            store.writer(max_sequence_length=bad)


# --- repr --------------------------------------------------------------------------------------


def test_store_repr_names_fields_capacity_and_block_steps(make_store):
    store = make_store({"obs": rp.Field((4, 84, 84), "uint8"), "r": rp.Field((), "float32")},
                       capacity=100, block_steps=16)
    r = repr(store)
    assert r.startswith("Store(")
    assert "obs: uint8" in r and "r: float32" in r
    assert "84" in r
    assert "capacity=112" in r
    assert "block_steps=16" in r


def test_store_files_of_a_killed_owner_are_listed_then_removed_and_a_live_owners_are_not():
    """SIGKILL leaves a store's file behind; `reprise doctor` lists it and the next
    process that creates a store there removes it. A live owner's file is untouched."""
    import json
    import signal
    import subprocess
    import sys

    make = ("import reprise as rp, sys, time; s = rp.Store({'x': rp.Field((), 'int64')}, capacity=64, block_steps=8); "
            "print(s._native.path, flush=True); time.sleep(120)")
    killed = subprocess.Popen([sys.executable, "-c", make], stdout=subprocess.PIPE, text=True)
    live = subprocess.Popen([sys.executable, "-c", make], stdout=subprocess.PIPE, text=True)
    try:
        dead_path, live_path = killed.stdout.readline().strip(), live.stdout.readline().strip()
        killed.send_signal(signal.SIGKILL)
        killed.wait(timeout=30)
        assert os.path.exists(dead_path), "SIGKILL should have left the store file"
        doctor = subprocess.run([sys.executable, "-m", "reprise.cli", "doctor", "--json"], capture_output=True, text=True, timeout=120)
        listed = [f["path"] for f in json.loads(doctor.stdout)["shared_memory"]["stale_stores"]]
        assert dead_path in listed and live_path not in listed, listed
        text = subprocess.run([sys.executable, "-m", "reprise.cli", "doctor"], capture_output=True, text=True, timeout=120).stdout
        assert "stale stores" in text and os.path.basename(dead_path) in text
        subprocess.run([sys.executable, "-c", "import reprise as rp; rp.Store({'x': rp.Field((), 'int64')}, capacity=64, block_steps=8)"],
                       check=True, timeout=120)
        assert not os.path.exists(dead_path), "the next store created there did not remove the stale file"
        assert os.path.exists(live_path), "a live owner's store file was removed"
    finally:
        for p in (killed, live):
            if p.poll() is None:
                p.kill()
                p.wait()
        # The live owner was killed just now: its file is this test's to remove (the
        # session's leftover check fails otherwise when this test runs last).
        for path in (dead_path, live_path) if "live_path" in locals() else ():
            if path and os.path.exists(path):
                os.remove(path)
