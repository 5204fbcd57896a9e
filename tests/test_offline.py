"""The offline demo: ``reprise demo offline --smoke`` generates a dataset, imports it,
trains a Decision Transformer on sampled windows and must beat a random policy by far."""

import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("gymnasium")
pytest.importorskip("h5py")
pytest.importorskip("matplotlib")

from reprise import cli  # noqa: E402

RANDOM_CARTPOLE_RETURN = 22.0


def test_smoke_run_learns_from_the_imported_dataset(tmp_path, capsys):
    out = tmp_path / "run"
    assert cli.main(["demo", "offline", "--smoke", "--seed", "0", "--device", "cpu", "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert (out / "offline.png").stat().st_size > 10_000
    assert (out / "cartpole-scripted.hdf5").exists()
    assert summary["dataset"]["format"] == "d4rl" and summary["dataset"]["episodes"] == 40
    assert summary["dataset"]["windows"] > 1_000
    assert summary["train"]["final_loss"] < summary["train"]["first_loss"] - 0.1
    assert summary["random_policy"]["mean_return"] < 40
    # Learning: far above a random policy (~22); the smoke run reaches 500 on every seed tried.
    assert summary["eval"]["mean_return"] >= 150 > 5 * RANDOM_CARTPOLE_RETURN
    assert "Decision Transformer, target return 500" in capsys.readouterr().out


def test_a_checkpoint_of_reprise_import_can_be_the_dataset(tmp_path, capsys):
    """``reprise import --window K`` output feeds the demo (training kept tiny)."""
    first = tmp_path / "first"
    args = ["--smoke", "--steps", "2", "--eval-episodes", "1", "--device", "cpu"]
    assert cli.main(["demo", "offline", *args, "--out", str(first)]) == 0
    assert cli.main(["import", str(first / "cartpole-scripted.hdf5"), "--out", str(tmp_path / "ckpt"),
                     "--window", "10"]) == 0
    second = tmp_path / "second"
    assert cli.main(["demo", "offline", *args, "--dataset", str(tmp_path / "ckpt"), "--out", str(second)]) == 0
    summary = json.loads((second / "summary.json").read_text())
    assert summary["dataset"]["format"] == "reprise checkpoint" and summary["dataset"]["episodes"] == 40
    assert summary["dataset"]["return_mean"] > 0
