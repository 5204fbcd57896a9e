"""The offline demo: ``reprise demo offline --smoke`` generates a dataset, imports it,
trains a Decision Transformer on sampled windows and must beat a random policy by far;
with ``--nproc 2`` (or under torchrun) it does so on two gloo ranks, DDP over a sharded
table; and a new user's misuses: a refused --device, --help, Ctrl-C and SIGTERM while the
dataset is made, while training, and on two ranks."""

import json
import os
import signal
import subprocess
import sys
import time

from pathlib import Path

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


# ----------------------------------------------------------------- a new user's misuses
#
# The demo in a subprocess of its own session; the child restores Python's SIGINT handler
# first (pytest run as a background job has SIGINT ignored, which its children inherit and
# the demo keeps).

DEMO = ("import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
        "from reprise import cli; sys.exit(cli.main(sys.argv[1:]))")


def children_of(pid: int) -> set:
    """The processes whose parent is ``pid`` (Linux /proc; empty elsewhere)."""
    found = set()
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.add(int(entry))
    return found


class DemoRun:
    """``reprise demo offline ARGS`` in a subprocess; its output lines collected as they come."""

    def __init__(self, args, cwd=None):
        import threading
        env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_ENV}
        self.proc = subprocess.Popen([sys.executable, "-c", DEMO, "demo", "offline", "--device", "cpu", *args],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=cwd,
                                     start_new_session=True)
        self.lines: list[str] = []
        self.pids = {self.proc.pid}  # the demo and every process it started (its ranks)
        self._reader = threading.Thread(target=lambda: self.lines.extend(self.proc.stdout), daemon=True)
        self._reader.start()
        threading.Thread(target=self._watch_children, daemon=True).start()

    def _watch_children(self):
        while self.proc.poll() is None:
            self.pids |= children_of(self.proc.pid)
            time.sleep(0.05)

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def wait_for(self, predicate, timeout: float, what: str):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            if predicate():
                return
            time.sleep(0.05)
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        pytest.fail(f"no {what} within {timeout} s:\n{self.output[-3000:]}")

    def finish(self, timeout: float) -> int:
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            pytest.fail(f"the demo ran past {timeout} s:\n{self.output[-3000:]}")
        self._reader.join(5)
        return self.proc.returncode

    def assert_clean(self):
        """No traceback; no shared memory of the demo or its ranks left; no rank left."""
        assert "Traceback" not in self.output, self.output[-3000:]
        if os.path.isdir("/dev/shm"):
            left = [f for f in os.listdir("/dev/shm") if any(f.startswith(f"reprise-{p}-") for p in self.pids)]
            assert left == [], (left, self.pids)
        # Its ranks are gone (and multiprocessing's resource tracker, which follows its parent).
        deadline = time.monotonic() + 5.0
        alive = self.pids - {self.proc.pid}
        while alive and time.monotonic() < deadline:
            alive = {p for p in alive if Path(f"/proc/{p}").exists()}
            time.sleep(0.05)
        assert not alive, alive


def test_help_shows_every_default_once():
    import re
    from reprise.examples import offline
    parser = offline.make_parser()
    entries = re.split(r"\n(?=  -)", parser.format_help().split("options:")[1].split("\n\n")[0])
    options = [e for e in entries if e.strip().startswith("--")]
    assert len(options) == len([a for a in parser._actions if a.option_strings]) - 1
    for entry in options:
        assert entry.count("(default:") == 1, entry
        assert "None" not in entry, entry


def test_cuda_without_cuda_is_refused_before_anything_starts(tmp_path, capsys, monkeypatch):
    import torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for extra in ([], ["--nproc", "2"]):
        assert cli.main(["demo", "offline", "--smoke", "--device", "cuda", *extra,
                         "--out", str(tmp_path / "never")]) == 2
        err = capsys.readouterr().err
        assert "reprise demo offline: --device cuda:" in err and "--device cpu" in err and "Traceback" not in err
        assert not (tmp_path / "never").exists()


def test_sigint_while_training_writes_a_summary_in_a_new_run_directory(tmp_path):
    """No --out: ./reprise-runs/offline-<time>-<pid>. Ctrl-C while training: exit 130, a
    summary of how far it got, the store's shared memory removed."""
    run = DemoRun(["--smoke"], cwd=tmp_path)
    run.wait_for(lambda: "train " in run.output, 60, "training")
    os.kill(run.proc.pid, signal.SIGINT)
    assert run.finish(timeout=30) == 130, run.output[-3000:]
    [out] = list((tmp_path / "reprise-runs").iterdir())
    assert out.name.startswith("offline-") and out.name.endswith(f"-{run.proc.pid}")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["ended"] == "interrupted" and summary["signal"] == "SIGINT" and summary["phase"] == "training"
    assert 1 <= summary["train"]["steps_done"] < 300 and summary["dataset"]["episodes"] == 40
    assert summary["config"]["out"] == str(Path("reprise-runs") / out.name)
    assert "stopped by SIGINT while training" in run.output
    run.assert_clean()


def test_sigterm_while_the_dataset_is_made(tmp_path):
    out = tmp_path / "run"
    run = DemoRun(["--smoke", "--episodes", "2000", "--out", str(out)])
    run.wait_for(lambda: out.exists(), 60, "run directory")
    time.sleep(0.5)
    os.kill(run.proc.pid, signal.SIGTERM)
    assert run.finish(timeout=30) == 143, run.output[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["ended"] == "interrupted" and summary["signal"] == "SIGTERM"
    assert summary["phase"] in ("starting", "making the dataset") and summary["train"]["steps_done"] == 0
    run.assert_clean()


def test_ctrl_c_storm_on_two_ranks(tmp_path):
    """--nproc 2: SIGINT to the whole group (as a terminal sends it) every 50 ms once training
    runs. The ranks stop without a traceback, the parent writes the summary, and the ranks'
    shards (shared memory they could not close) are removed."""
    out = tmp_path / "run"
    run = DemoRun(["--smoke", "--nproc", "2", "--out", str(out)])
    run.wait_for(lambda: "train " in run.output, 60, "training")
    while run.proc.poll() is None:
        try:
            os.killpg(run.proc.pid, signal.SIGINT)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    assert run.finish(timeout=30) == 130, run.output[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["ended"] == "interrupted" and summary["signal"] == "SIGINT"
    assert summary["phase"] == "training on 2 ranks" and summary["cluster"]["ranks"] == 2
    run.assert_clean()
