"""The offline demo: ``reprise demo offline --smoke`` generates a dataset, imports it,
trains a Decision Transformer on sampled windows and must beat a random policy by far;
with ``--nproc 2`` (or under torchrun) it does so on two gloo ranks, DDP over a sharded
table."""

import json
import os
import signal
import subprocess
import sys

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


LAUNCHER_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def run_demo(cmd, deadline):
    """``(returncode, output)`` of ``cmd`` in its own session, killed whole (ranks
    included) and failed past ``deadline`` seconds."""
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_ENV}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=deadline)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        pytest.fail(f"{' '.join(cmd[1:])} ran past {deadline} s:\n{output[-4000:]}")
    return proc.returncode, output


def test_smoke_run_on_two_ranks_learns_from_a_sharded_table(tmp_path):
    """``--nproc 2``: two spawned gloo ranks, one shard each, a global draw of 2 x 32
    windows per step, DDP; rank 0 evaluates. Well under a minute on 2 cores."""
    out = tmp_path / "run"
    code, output = run_demo([sys.executable, "-m", "reprise.examples.offline", "--smoke", "--nproc", "2",
                             "--seed", "0", "--device", "cpu", "--out", str(out)], deadline=55)
    assert code == 0, output[-4000:]
    summary = json.loads((out / "summary.json").read_text())
    assert (out / "offline.png").stat().st_size > 10_000
    assert summary["config"]["nproc"] == 2 and summary["train"]["nproc"] == 2
    cluster = summary["cluster"]
    assert cluster["launcher"] == "spawn" and cluster["ranks"] == 2 and cluster["table"]["num_shards"] == 2
    # Every K-window of the dataset is in the sharded table, spread over both shards.
    assert cluster["windows"] + cluster["episodes_shorter_than_context"] == summary["dataset"]["windows"] > 1_000
    assert sum(cluster["shard_sizes"]) == cluster["windows"]
    assert min(cluster["shard_sizes"]) > 0.3 * cluster["windows"]
    # Both ranks trained on their 32 of each global draw of 64, for every step.
    ranks = summary["train"]["per_rank"]
    assert [r["rank"] for r in ranks] == [0, 1] and [r["shard"] for r in ranks] == [0, 1]
    assert all(r["samples"] == 300 * 32 and r["samples_per_s"] > 0 for r in ranks)
    assert summary["train"]["global_batch_size"] == 64 and summary["train"]["samples"] == 300 * 64
    assert cluster["table"]["num_samples"] >= 300 * 64
    # Learning, as in the single-process smoke test.
    assert summary["train"]["final_loss"] < summary["train"]["first_loss"] - 0.1
    assert summary["eval"]["mean_return"] >= 150 > 5 * RANDOM_CARTPOLE_RETURN
    assert "cluster: 2 ranks (spawn, gloo)" in output
    assert "Decision Transformer, target return 500" in output and "on 2 ranks" in output


def test_under_torchrun_the_ranks_come_from_the_environment(tmp_path):
    """Started by torchrun, the demo joins its process group instead of spawning
    (training kept tiny)."""
    out = tmp_path / "run"
    code, output = run_demo([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                             "-m", "reprise.examples.offline", "--smoke", "--steps", "5", "--eval-episodes", "1",
                             "--device", "cpu", "--out", str(out)], deadline=55)
    assert code == 0, output[-4000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["cluster"]["launcher"] == "torchrun" and summary["train"]["nproc"] == 2
    assert [r["samples"] for r in summary["train"]["per_rank"]] == [5 * 32, 5 * 32]
    assert "spawning" not in output


def test_cluster_mode_refuses_a_checkpoint_as_the_dataset(tmp_path, capsys):
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "MANIFEST.json").write_text("{}")
    assert cli.main(["demo", "offline", "--nproc", "2", "--dataset", str(tmp_path / "ckpt"),
                     "--out", str(tmp_path / "run")]) == 2
    assert "cluster mode reads the episodes from a dataset file" in capsys.readouterr().err
