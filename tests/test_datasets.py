"""Datasets: D4RL, Minari and npz files imported into a store, round trips, windows,
``reprise import``, and every bad file named with nothing left behind."""

import json
import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import reprise as rp
from reprise import cli

h5py = pytest.importorskip("h5py")

LENGTHS = [7, 3, 12, 5]   # the last episode is left unmarked: a trailing partial episode
WINDOW = 4


def step_arrays(lengths, ends=True):
    """Per-step arrays of episodes of ``lengths``; ``step`` numbers the steps, so
    every other array is a function of it. Terminals end some episodes, timeouts
    others; the last episode is unmarked unless ``ends``."""
    n = sum(lengths)
    step = np.arange(n, dtype=np.int64)
    last = np.cumsum(lengths) - 1
    terminals, timeouts = np.zeros(n, bool), np.zeros(n, bool)
    terminals[last[0::2]] = True
    timeouts[last[1::2]] = True
    if not ends:
        terminals[last[-1]] = timeouts[last[-1]] = False
    return {
        "observations": np.stack([step, -step, 2 * step], axis=1).astype(np.float32),
        "actions": (step % 3).astype(np.int64),
        "rewards": (step % 5).astype(np.float32),
        "terminals": terminals,
        "timeouts": timeouts,
        "step": step,
        "pixels": (step[:, None, None] % 251 * np.ones((1, 2, 2))).astype(np.uint8),
        "half": step.astype(np.float16),
        "infos/qpos": np.stack([step, step], axis=1).astype(np.float64),
    }


def all_items(table):
    """``[{field: array[length]}]`` of every item, in insertion order: drawn by
    sampling the (uniform, seeded) table until every key has come up."""
    order = [key for key, _, _, _ in table.items()]
    s = table.sample(40 * len(order) + 100)
    seen = {}
    for i, key in enumerate(s.keys.tolist()):
        seen.setdefault(key, {f: v[i, : s.lengths[i]] for f, v in s.data.items()})
    assert set(seen) == set(order), "the draws missed an item"
    return [seen[k] for k in order]


def expected_windows(lengths, window):
    """The reference model: (first step, length) of every windows item, in order."""
    out, start = [], 0
    for n in lengths:
        out += [(start + j, window) for j in range(n - window + 1)] if n >= window else [(start, n)]
        start += n
    return out


def check_contents(ds, arrays, lengths, window):
    starts = np.concatenate([[0], np.cumsum(lengths)])
    episodes = all_items(ds.episodes)
    assert len(episodes) == len(lengths)
    for e, item in enumerate(episodes):
        for name in ds.signature:
            np.testing.assert_array_equal(item[name], arrays[name][starts[e]:starts[e + 1]])
    if window is not None:
        got = [(int(it["step"][0]), len(it["step"])) for it in all_items(ds.windows)]
        assert got == expected_windows(lengths, window)


@pytest.fixture
def shm():
    """Asserts that a test leaves no store file in /dev/shm."""
    before = set(os.listdir("/dev/shm"))
    yield
    assert set(os.listdir("/dev/shm")) == before


def write_minari(root, arrays, lengths, string_infos=False):
    """A Minari dataset directory written with h5py the way Minari's HDF5 storage
    writes one: ``data/metadata.json`` and ``data/main_data.hdf5`` with one
    ``episode_<i>`` group per episode (attrs id, seed, total_steps), dict
    observations as a group with T+1 rows each, ``infos`` with the reset's row."""
    data = Path(root) / "data"
    data.mkdir(parents=True)
    starts = np.concatenate([[0], np.cumsum(lengths)])
    with h5py.File(data / "main_data.hdf5", "a", track_order=True) as f:
        for e, n in enumerate(lengths):
            a, b = starts[e], starts[e + 1]
            g = f.create_group(f"episode_{e}")
            g.attrs.update({"id": e, "seed": 100 + e, "total_steps": n})

            def put(group, key, value):
                group.create_dataset(key, data=value, chunks=True, maxshape=(None, *value.shape[1:]))

            obs = g.create_group("observations")
            plus_one = lambda x: np.concatenate([x[a:b], x[b - 1:b] + 1000])  # noqa: E731
            put(obs, "achieved_goal", plus_one(arrays["observations"][:, :2]))
            put(obs, "observation", plus_one(arrays["step"]))
            put(g, "actions", arrays["actions"][a:b])
            put(g, "rewards", arrays["rewards"][a:b].astype(np.float64))
            put(g, "terminations", arrays["terminals"][a:b])
            put(g, "truncations", arrays["timeouts"][a:b])
            if string_infos:
                g.create_dataset("infos", data=[json.dumps({"x": 1})] * (n + 1), dtype=h5py.string_dtype())
            else:
                put(g.create_group("infos"), "success", np.arange(n + 1) % 2 == 1)
    meta = {"total_episodes": len(lengths), "total_steps": int(sum(lengths)), "data_format": "hdf5",
            "dataset_id": "test/tiny-v0", "observation_space": "{}", "action_space": "{}"}
    (data / "metadata.json").write_text(json.dumps(meta))
    return Path(root)


# -- round trips ----------------------------------------------------------------------

def test_d4rl_round_trip_keeps_episodes_windows_and_dtypes(tmp_path, shm):
    arrays = step_arrays(LENGTHS, ends=False)
    path = rp.datasets.write_d4rl(tmp_path / "d.hdf5", arrays, metadata={"algorithm": "scripted", "iteration": 3})
    with rp.datasets.load(path, window=WINDOW, seed=0) as ds:
        assert ds.format == "d4rl" and ds.source == str(tmp_path / "d.hdf5")
        assert list(ds.signature) == ["observations", "actions", "rewards", "terminals", "timeouts",
                                      "half", "infos/qpos", "pixels", "step"]
        assert ds.signature["observations"] == rp.Field((3,), "float32")
        assert ds.signature["pixels"] == rp.Field((2, 2), "uint8")
        assert ds.signature["half"] == rp.Field((), "float16")
        assert ds.signature["terminals"] == rp.Field((), "bool")
        assert ds.signature["infos/qpos"] == rp.Field((2,), "float64")
        assert ds.num_steps == sum(LENGTHS) and ds.num_episodes == len(LENGTHS)
        assert ds.episode_lengths.tolist() == LENGTHS
        assert ds.tables == [ds.episodes, ds.windows]
        assert ds.windows.size == len(expected_windows(LENGTHS, WINDOW))
        assert ds.episodes.info()["max_size"] == len(LENGTHS)
        np.testing.assert_allclose(ds.episode_returns, [arrays["rewards"][a:a + n].sum() for a, n in
                                                        zip(np.cumsum([0] + LENGTHS[:-1]), LENGTHS)])
        check_contents(ds, arrays, LENGTHS, WINDOW)
        text = ds.describe()
        assert "d4rl dataset" in text and "episodes   4 (length min 3, mean 6.8, max 12)" in text
        assert "  pixels        uint8    [2, 2]" in text


def test_minari_round_trip_splits_observations(tmp_path, shm, monkeypatch):
    arrays = step_arrays(LENGTHS)
    root = write_minari(tmp_path / "minari" / "test" / "tiny-v0", arrays, LENGTHS)
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    for source in (root, root / "data" / "main_data.hdf5", "test/tiny-v0"):
        assert rp.datasets.detect_format(source) == "minari"
        with rp.datasets.load(source, window=WINDOW, seed=1) as ds:
            assert ds.source == str(root / "data" / "main_data.hdf5")
            assert list(ds.signature) == [
                "observations/achieved_goal", "observations/observation", "actions", "rewards",
                "next_observations/achieved_goal", "next_observations/observation",
                "terminations", "truncations", "infos/success"]
            assert ds.signature["rewards"] == rp.Field((), "float64")
            assert ds.num_steps == sum(LENGTHS) and ds.episode_lengths.tolist() == LENGTHS
            items = all_items(ds.episodes)
            for e, it in enumerate(items):
                steps = it["observations/observation"]
                a = sum(LENGTHS[:e])
                np.testing.assert_array_equal(steps, np.arange(a, a + LENGTHS[e]))
                # next_observations[t] is observations[t + 1]; the last is the final observation
                np.testing.assert_array_equal(it["next_observations/observation"][:-1], steps[1:])
                assert it["next_observations/observation"][-1] == steps[-1] + 1000
                np.testing.assert_array_equal(it["actions"], arrays["actions"][a:a + LENGTHS[e]])
                np.testing.assert_array_equal(it["infos/success"], np.arange(1, LENGTHS[e] + 1) % 2 == 1)
            got = [(int(it["observations/observation"][0]), len(it["actions"])) for it in all_items(ds.windows)]
            assert got == expected_windows(LENGTHS, WINDOW)


def test_minari_string_infos_are_left_out(tmp_path, shm):
    root = write_minari(tmp_path / "m", step_arrays(LENGTHS), LENGTHS, string_infos=True)
    sig = rp.datasets.infer_signature(root)
    assert not [n for n in sig if n.startswith("infos")] and "next_observations/observation" in sig


@pytest.mark.parametrize("layout", ["terminals_timeouts", "dones", "terminations_truncations",
                                    "episode_lengths", "episode_starts"])
def test_npz_round_trip_for_each_episode_layout(tmp_path, shm, layout):
    arrays = step_arrays(LENGTHS)
    markers = {"terminals": arrays.pop("terminals"), "timeouts": arrays.pop("timeouts")}
    if layout == "terminals_timeouts":
        arrays.update(markers)
    elif layout == "dones":
        arrays["dones"] = (markers["terminals"] | markers["timeouts"]).astype(np.float32)
    elif layout == "terminations_truncations":
        arrays.update(terminations=markers["terminals"], truncations=markers["timeouts"])
    elif layout == "episode_lengths":
        arrays["episode_lengths"] = np.array(LENGTHS)
    else:
        arrays["episode_starts"] = np.cumsum([0] + LENGTHS[:-1])
    path = rp.datasets.write_npz(tmp_path / "d", arrays)
    assert path.endswith("d.npz") and rp.datasets.detect_format(path) == "npz"
    with rp.datasets.load(path, window=WINDOW, seed=2) as ds:
        assert "episode_lengths" not in ds.signature and "episode_starts" not in ds.signature
        assert ds.episode_lengths.tolist() == LENGTHS
        check_contents(ds, arrays, LENGTHS, WINDOW)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lengths=st.lists(st.integers(1, 12), min_size=1, max_size=6), window=st.integers(1, 8))
def test_windows_match_the_reference_model(tmp_path_factory, lengths, window):
    ends = np.zeros(sum(lengths), np.int8)
    ends[np.cumsum(lengths) - 1] = 1
    path = rp.datasets.write_npz(tmp_path_factory.mktemp("w") / "w.npz",
                                 {"step": np.arange(sum(lengths)), "dones": ends})
    with rp.datasets.load(path, window=window, seed=3) as ds:
        got = [(int(it["step"][0]), len(it["step"])) for it in all_items(ds.windows)]
        assert got == expected_windows(lengths, window)
        assert all(np.array_equal(it["step"], np.arange(it["step"][0], it["step"][0] + len(it["step"])))
                   for it in all_items(ds.windows))


def test_fields_selects_arrays_and_unknown_names_are_refused(tmp_path, shm):
    arrays = step_arrays(LENGTHS)
    arrays["names"] = np.array(["x"] * sum(LENGTHS))          # a string array: not storable
    path = rp.datasets.write_npz(tmp_path / "d.npz", arrays)
    with pytest.raises(rp.errors.InvalidArgument, match=r"d.npz: array 'names' has dtype <U1; .*fields="):
        rp.datasets.load(path)
    with rp.datasets.load(path, fields=["step", "actions"]) as ds:   # leaving it out works
        assert list(ds.signature) == ["step", "actions"] and ds.windows is None   # in the order asked
        assert ds.episode_lengths.tolist() == LENGTHS                   # markers read though not kept
        assert ds.episode_returns is None
    with pytest.raises(rp.errors.NotFound, match=r"no per-step array 'nope'; it has \['observations'"):
        rp.datasets.load(path, fields=["step", "nope"])
    with pytest.raises(rp.errors.InvalidArgument, match="fields must be a non-empty list"):
        rp.datasets.load(path, fields=[])


def test_infer_signature_matches_load_without_reading_data(tmp_path, shm):
    arrays = step_arrays(LENGTHS)
    path = rp.datasets.write_d4rl(tmp_path / "d.h5", arrays)
    sig = rp.datasets.infer_signature(path)
    with rp.datasets.load(path) as ds:
        assert sig == ds.signature
    assert rp.datasets.infer_signature(path, fields=["rewards"]) == {"rewards": rp.Field((), "float32")}


def test_detect_format_reads_the_content(tmp_path):
    arrays = step_arrays(LENGTHS)
    assert rp.datasets.detect_format(rp.datasets.write_d4rl(tmp_path / "d.hdf5", arrays)) == "d4rl"
    odd = tmp_path / "dataset.bin"                     # the content decides, not the suffix
    odd.write_bytes(Path(rp.datasets.write_npz(tmp_path / "d.npz", arrays)).read_bytes())
    assert rp.datasets.detect_format(odd) == "npz"
    root = write_minari(tmp_path / "m", arrays, LENGTHS)
    assert rp.datasets.detect_format(root) == "minari"
    assert rp.datasets.detect_format(root / "data" / "main_data.hdf5") == "minari"


# -- reprise import ----------------------------------------------------------------------

def test_import_command_saves_a_checkpoint_that_loads_the_same_data(tmp_path, shm, capsys):
    arrays = step_arrays(LENGTHS)
    path = rp.datasets.write_d4rl(tmp_path / "d.hdf5", arrays)
    out = tmp_path / "ckpt"
    assert cli.main(["import", str(path), "--out", str(out), "--window", str(WINDOW),
                     "--fields", "observations,actions,step", "--seed", "5"]) == 0
    printed = capsys.readouterr().out
    assert "steps      27" in printed and "observations  float32  [3]" in printed
    saved = rp.checkpoint.latest(out)
    assert saved is not None and f"rp.checkpoint.load({saved!r})" in printed
    tables = rp.checkpoint.load(saved)
    try:
        assert set(tables) == {"episodes", "windows"}
        assert tables["episodes"].store is tables["windows"].store
        assert list(tables["episodes"].store.signature) == ["observations", "actions", "step"]
        with rp.datasets.load(path, window=WINDOW, fields=["observations", "actions", "step"], seed=5) as ds:
            for name in ("episodes", "windows"):
                assert tables[name].items() == getattr(ds, name).items()
                a, b = all_items(tables[name]), all_items(getattr(ds, name))
                assert all(np.array_equal(x[f], y[f]) for x, y in zip(a, b) for f in x)
    finally:
        tables["episodes"].store.close()


def test_import_command_reports_a_bad_file_and_exits_2(tmp_path, shm, capsys):
    bad = tmp_path / "notes.txt"
    bad.write_text("hello")
    assert cli.main(["import", str(bad), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"reprise import: {bad}: neither an HDF5 nor an npz file")
    assert not (tmp_path / "out").exists()


def test_import_command_names_its_fields_option(tmp_path, shm, capsys):
    arrays = step_arrays(LENGTHS)
    arrays["names"] = np.array(["x"] * sum(LENGTHS))          # a string array: not storable
    path = rp.datasets.write_npz(tmp_path / "d.npz", arrays)
    with pytest.raises(rp.errors.InvalidArgument, match=r"leave the array out with fields=\)$"):
        rp.datasets.load(path)                                 # the API names its keyword
    assert cli.main(["import", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"reprise import: {path}: array 'names' has dtype <U1")
    assert err.rstrip().endswith("(leave the array out with --fields)") and "fields=" not in err
    assert cli.main(["import", str(path), "--out", str(tmp_path / "out"), "--fields", "step,actions"]) == 0
    capsys.readouterr()


# -- bad files ---------------------------------------------------------------------------

def _bad(tmp_path, case):
    """Writes the bad dataset ``case``; returns its path."""
    arrays = step_arrays(LENGTHS)
    if case == "text":
        (tmp_path / "x.hdf5").write_text("not a dataset")
        return tmp_path / "x.hdf5"
    if case == "empty_dir":
        (tmp_path / "dir").mkdir()
        return tmp_path / "dir"
    if case == "metadata_only":
        with h5py.File(tmp_path / "x.hdf5", "w") as f:
            f["metadata/algorithm"] = "sac"
        return tmp_path / "x.hdf5"
    if case == "lengths_differ":
        arrays["actions"] = arrays["actions"][:-1]
        return rp.datasets.write_d4rl(tmp_path / "x.hdf5", arrays)
    if case == "no_boundaries":
        return rp.datasets.write_d4rl(tmp_path / "x.hdf5", {"observations": arrays["observations"]})
    if case == "zero_steps":
        return rp.datasets.write_npz(tmp_path / "x.npz", {"observations": np.zeros((0, 3), np.float32),
                                                          "dones": np.zeros(0, bool)})
    if case == "strings":
        arrays["language"] = np.array([b"left"] * sum(LENGTHS), dtype=object)
        with h5py.File(tmp_path / "x.hdf5", "w") as f:
            for k, v in arrays.items():
                f.create_dataset(k, data=v, dtype=h5py.string_dtype() if v.dtype == object else None)
        return tmp_path / "x.hdf5"
    if case == "objects":
        arrays["objects"] = np.array([{"a": 1}] * sum(LENGTHS), dtype=object)
        return rp.datasets.write_npz(tmp_path / "x.npz", arrays)
    if case == "npy":
        np.save(tmp_path / "x.npy", arrays["observations"])
        return tmp_path / "x.npy"
    if case == "minari_arrow":
        (tmp_path / "m" / "data").mkdir(parents=True)
        (tmp_path / "m" / "data" / "metadata.json").write_text(json.dumps({"data_format": "arrow"}))
        return tmp_path / "m"
    if case == "minari_ragged":
        root = write_minari(tmp_path / "m", arrays, LENGTHS)
        with h5py.File(root / "data" / "main_data.hdf5", "a") as f:
            del f["episode_2/actions"]
            f["episode_2/actions"] = np.zeros(LENGTHS[2] - 1, np.int64)
        return root
    if case == "bad_episode_lengths":
        arrays.pop("terminals"), arrays.pop("timeouts")
        arrays["episode_lengths"] = np.array([10, 0, 17])
        return rp.datasets.write_npz(tmp_path / "x.npz", arrays)
    raise AssertionError(case)


BAD = {
    "text": (rp.errors.InvalidArgument, r"x.hdf5: neither an HDF5 nor an npz file \(it begins b'not a da'\); expected"),
    "empty_dir": (rp.errors.InvalidArgument, r"dir: a directory without data/main_data.hdf5; expected"),
    "metadata_only": (rp.errors.InvalidArgument, r"x.hdf5: no per-step arrays: expected datasets of one row per step"),
    "lengths_differ": (rp.errors.InvalidArgument,
                       r"x.hdf5: arrays of different lengths: 'actions' has 26 rows, the episodes cover 27 steps"),
    "no_boundaries": (rp.errors.InvalidArgument, r"x.hdf5: no way to find episode boundaries: expected per-step"),
    "zero_steps": (rp.errors.InvalidArgument, r"x.npz: zero steps"),
    "strings": (rp.errors.InvalidArgument, r"x.hdf5: array 'language' has dtype object; Reprise stores bool"),
    "objects": (rp.errors.InvalidArgument, r"x.npz: array 'objects' has dtype object"),
    "npy": (rp.errors.InvalidArgument, r"x.npy: neither an HDF5 nor an npz file"),
    "minari_arrow": (rp.errors.InvalidArgument, r"m: a Minari dataset stored as 'arrow'; only Minari's 'hdf5'"),
    "minari_ragged": (rp.errors.InvalidArgument,
                      r"main_data.hdf5: /episode_2/actions: expected int64\[12\] like /episode_0, got int64\[11\]"),
    "bad_episode_lengths": (rp.errors.InvalidArgument, r"x.npz: 'episode_lengths' must be a 1-D integer array of "
                                                       r"lengths >= 1"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_files_are_named_and_leave_no_store(tmp_path, shm, case, capsys):
    path = _bad(tmp_path, case)
    error, message = BAD[case]
    with pytest.raises(error, match=message):
        rp.datasets.load(path, window=WINDOW)
    assert cli.main(["import", str(path), "--out", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err.startswith("reprise import: ")


def test_missing_path_and_format_mismatch(tmp_path, shm, monkeypatch):
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path))
    with pytest.raises(rp.errors.NotFound, match=r"nope/tiny-v0: no such file or directory, and no Minari dataset"):
        rp.datasets.load("nope/tiny-v0")
    path = rp.datasets.write_npz(tmp_path / "d.npz", step_arrays(LENGTHS))
    with pytest.raises(rp.errors.InvalidArgument, match=r"d.npz: asked to read it as d4rl, but its content is npz"):
        rp.datasets.load(path, format="d4rl")
    with pytest.raises(rp.errors.InvalidArgument, match="format must be one of d4rl, minari, npz"):
        rp.datasets.load(path, format="hdf5")
    with pytest.raises(rp.errors.InvalidArgument, match="window"):
        rp.datasets.load(path, window=0)


def test_import_reprise_does_not_need_h5py():
    import subprocess
    import sys
    code = ("import sys; sys.modules['h5py'] = None; import reprise as rp; "
            "assert rp.datasets.load and 'h5py' not in [m for m, v in sys.modules.items() if v is not None]")
    env = dict(os.environ, PYTHONPATH=str(Path(rp.__file__).parent.parent))
    assert subprocess.run([sys.executable, "-c", code], env=env).returncode == 0
