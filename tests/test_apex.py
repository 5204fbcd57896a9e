"""The Ape-X demo: n-step items against a reference, targets, the CLI, a smoke run that
must learn while an actor and the learner are killed and restarted, and a new user's
misuses: refused devices and environments, Ctrl-C and SIGTERM at every stage, runs started
together, the time limit, a crash loop, progress without a terminal, --help."""

import json
import os
import re
import signal
import subprocess
import sys
import time

from pathlib import Path

import numpy as np
import pytest

import reprise as rp

torch = pytest.importorskip("torch")
pytest.importorskip("gymnasium")

from hypothesis import given, settings, strategies as st  # noqa: E402

from reprise.examples import apex  # noqa: E402
from demo_runs import DemoRun as _DemoRun, status as _status  # noqa: E402


def DemoRun(args, cwd=None, env=None):
    return _DemoRun("apex", args, cwd, env)

def reference_transitions(episodes, n, gamma):
    """Plain model: for every transition t of every episode, the steps t..t+k it spans, its
    n-step return, bootstrap flag and |TD error| priority."""
    out = []
    for steps, final_obs, q_final, terminated in episodes:
        L = len(steps)
        obs = [s[0] for s in steps] + [final_obs]
        qs = [s[1] for s in steps] + [q_final]
        for t in range(L):
            k = min(n, L - t)
            ret = sum(gamma ** i * steps[t + i][3] for i in range(k))
            ends_episode = t + k == L
            boot = 0.0 if (ends_episode and terminated) else max(qs[t + k])
            priority = abs(ret + gamma ** k * boot - steps[t][1][steps[t][2]]) + 1e-3
            out.append({
                "obs": np.array(obs[t:t + k + 1], np.float32),
                "action": [s[2] for s in steps[t:t + k]] + ([0] if ends_episode else [steps[t + k][2]]),
                "reward": [s[3] for s in steps[t:t + k]] + ([0.0] if ends_episode else [steps[t + k][3]]),
                "terminal_end": bool(ends_episode and terminated),
                "priority": priority,
                "return": ret,
            })
    return out


episode_strategy = st.lists(
    st.tuples(st.integers(1, 9), st.booleans()),  # (length, terminated)
    min_size=1, max_size=4,
)


@settings(max_examples=40, deadline=None)
@given(episodes=episode_strategy, n=st.integers(1, 4), seed=st.integers(0, 2**16))
def test_n_step_items_match_reference(episodes, n, seed):
    rng = np.random.default_rng(seed)
    gamma = 0.9
    store = rp.Store({"obs": rp.Field((2,), "float32"), "action": rp.Field((), "int64"),
                      "reward": rp.Field((), "float32"), "terminal": rp.Field((), "bool")},
                     capacity=512, block_steps=4)
    try:
        table = rp.Table.queue("replay", store, max_size=400)
        stream = apex.NStepTransitions(store.writer(max_sequence_length=n + 1), "replay", n, gamma)
        generated = []
        for length, terminated in episodes:
            steps = []
            for _ in range(length):
                o = rng.standard_normal(2).astype(np.float32)
                q = rng.standard_normal(3)
                a = int(rng.integers(0, 3))
                r = float(np.float32(rng.standard_normal()))
                stream.step(o, q, a, r)
                steps.append((o, q, a, r))
            final = rng.standard_normal(2).astype(np.float32)
            q_final = rng.standard_normal(3)
            stream.end(final, q_final, terminated)
            generated.append((steps, final, q_final, terminated))
        expected = reference_transitions(generated, n, gamma)
        # Items are created in order of completion, not of t: compare as sets keyed by first obs.
        assert table.size == len(expected)
        got = table.sample(table.size, timeout=0)
        by_obs = {tuple(e["obs"][0]): e for e in expected}
        for i in range(len(got)):
            length = int(got.lengths[i])
            e = by_obs[tuple(got.data["obs"][i, 0])]
            assert length == len(e["obs"])
            np.testing.assert_array_equal(got.data["obs"][i, :length], e["obs"])
            assert got.data["action"][i, :length].tolist() == e["action"]
            np.testing.assert_allclose(got.data["reward"][i, :length], e["reward"], rtol=1e-6)
            assert bool(got.data["terminal"][i, length - 1]) == e["terminal_end"]
            assert not got.data["terminal"][i, :length - 1].any()
            assert got.priorities[i] == pytest.approx(e["priority"], rel=1e-5, abs=1e-6)
            # The learner's target computation agrees with the reference return and bootstrap flag.
            y = apex.n_step_targets(torch.as_tensor(got.data["reward"][i:i + 1]),
                                    torch.as_tensor(got.data["terminal"][i:i + 1]),
                                    torch.as_tensor([length]), gamma, torch.tensor([2.0]))
            boot = 0.0 if e["terminal_end"] else 2.0
            assert float(y[0]) == pytest.approx(e["return"] + gamma ** (length - 1) * boot, rel=1e-5, abs=1e-5)
    finally:
        store.close()


def test_n_step_targets_batch():
    reward = torch.tensor([[1.0, 1.0, 1.0, 5.0], [2.0, 3.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]])
    terminal = torch.zeros(3, 4, dtype=torch.bool)
    terminal[1, 2] = True
    lengths = torch.tensor([4, 3, 2])
    y = apex.n_step_targets(reward, terminal, lengths, 0.5, torch.tensor([8.0, 8.0, 8.0]))
    # full window: 1 + .5 + .25 + .125 * 8; terminated after 2 rewards: 2 + 1.5; one reward then bootstrap: 1 + .5 * 8
    assert y.tolist() == pytest.approx([1.75 + 1.0, 3.5, 5.0])


def test_epsilons_follow_apex_schedule():
    cfg = apex.Config(actors=2, envs_per_actor=4)
    eps = [apex.actor_epsilon(cfg, i) for i in range(8)]
    assert eps[0] == pytest.approx(0.4)
    assert eps[-1] == pytest.approx(0.4 ** 8)
    assert all(a > b for a, b in zip(eps, eps[1:]))


@pytest.mark.parametrize("argv, message", [
    (["--actors", "-1"], "--actors must be >= 0, got -1"),
    (["--n-step", "0"], "--n-step must be >= 1, got 0"),
    (["--min-replay", "10", "--replay-size", "5"], "--min-replay (10) must be <= --replay-size (5)"),
    (["--gamma", "1.5"], "--gamma must be in (0, 1], got 1.5"),
    (["--lr", "0"], "must be > 0"),
])
def test_bad_options_are_refused(argv, message, capsys, tmp_path):
    with pytest.raises(SystemExit) as e:
        from reprise import cli
        cli.main(["demo", "apex", *argv, "--out", str(tmp_path / "never")])
    assert e.value.code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "never").exists()


def test_cli_usage(capsys):
    from reprise import cli
    assert cli.main(["demo", "nonsense"]) == 2
    assert "usage: reprise demo {apex,offline,gpu,grpo}" in capsys.readouterr().err
    assert cli.main(["frobnicate"]) == 2
    assert "unknown command 'frobnicate'" in capsys.readouterr().err


def test_best_table_keeps_the_best_evaluation_and_the_final_evaluation_picks_it():
    """``best`` (MaxHeap / MinHeap, 4 items): whatever the order of the offers, the best one
    stays and is drawn; the final evaluation takes it unless the run solved."""
    from reprise.examples.apex.supervisor import final_parameters
    from reprise.examples.apex.tables import make_tables
    cfg = apex.Config(actors=1, envs_per_actor=1, replay_size=100, min_replay=10)
    tables = make_tables(cfg, {"obs_shape": (4,), "obs_dtype": "float32"}, num_params=3)
    try:
        params, best = tables[1], tables[4]
        assert final_parameters("time_limit", tables) == (None, None)
        returns = [22.0, -21.0, 140.0, 35.0, 60.0, 9.0, 139.5, 0.0, 80.0]
        for step, r in enumerate(returns):
            best.insert({"weights": np.full((1, 1, 3), step, np.float32), "learner_step": np.full((1, 1), step)},
                        [r + np.hypot(r, 1.0)])
        assert best.size == 4
        assert int(best.sample(1, timeout=0).data["learner_step"][0, 0]) == returns.index(140.0)
        params.insert({"weights": np.zeros((1, 1, 3), np.float32), "learner_step": np.full((1, 1), 99)}, [1.0])
        assert final_parameters("time_limit", tables) == (best, "best")
        assert final_parameters("solved", tables) == (params, "newest")
    finally:
        for t in tables:
            t.store.close()


def test_smoke_learns_and_survives_killed_actor_and_learner(tmp_path):
    """`reprise demo apex --smoke` in a subprocess: SIGKILL an actor, then the learner, while it
    trains; both are restarted, training continues from the published parameters, and the
    final greedy policy is far better than random."""
    out = tmp_path / "apex"
    # The child finds reprise as this process did (installed, or PYTHONPATH in a checkout).
    proc = subprocess.Popen([sys.executable, "-m", "reprise.cli", "demo", "apex", "--smoke", "--dashboard",
                             "--out", str(out)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        killed, seen = {}, None
        deadline = time.monotonic() + 200
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
            s = _status(out)
            if s is None:
                continue
            if seen is None and s.get("dashboard") and s["inserts"] > 0:
                # --dashboard: the replay server's page has the demo's tables and their figures.
                import urllib.request
                with urllib.request.urlopen(s["dashboard"] + "api/snapshot", timeout=10) as r:
                    seen = json.loads(r.read())
            if "actor" not in killed and s["inserts"] > 3000:
                pid = s["pids"]["actor-0"]
                os.kill(pid, signal.SIGKILL)
                killed["actor"] = (pid, s["inserts"])
            elif "actor" in killed and "learner" not in killed and s["learner_step"] > 0 \
                    and s["inserts"] > killed["actor"][1] + 2000:
                pid = s["pids"]["learner"]
                os.kill(pid, signal.SIGKILL)
                killed["learner"] = (pid, s["learner_step"], s["inserts"])
        output, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, output
    assert set(killed) == {"actor", "learner"}, (killed, output)
    summary = json.loads((out / "summary.json").read_text())
    assert (out / "apex.png").stat().st_size > 10_000
    assert summary["restarts"]["actors"] >= 1 and summary["restarts"]["learner"] >= 1, summary["log"]
    assert any(f"actor-0 (pid {killed['actor'][0]}) exited" in line for line in summary["log"])
    assert any(f"learner (pid {killed['learner'][0]}) exited" in line for line in summary["log"])
    # Training went on after the kills: more inserts, and the restarted learner continued its step count.
    assert summary["inserts"] > killed["learner"][2]
    assert summary["final_learner_step"] > killed["learner"][1]
    # Learning: a random policy scores about 22 on CartPole-v1. The policy handed over is the best
    # quick evaluation's (the run ended at its time limit), evaluated afresh on other seeds.
    assert summary["final_eval_mean_return"] >= 75, (summary["final_eval_mean_return"], summary["evals"])
    assert summary["final_eval_parameters"] == ("newest" if summary["solved"] else "best"), summary
    assert any(e["learner_step"] == summary["final_learner_step"] for e in summary["evals"]) or summary["solved"]
    assert summary["samples_per_insert"] == pytest.approx(summary["config"]["samples_per_insert"], rel=0.3)
    assert "solved" in output and "wrote" in output
    assert seen is not None and "dashboard: open http://127.0.0.1:" in output
    assert [t["name"] for t in seen["tables"]][0] == "replay" and seen["tables"][0]["stats"]["rates"]["seconds"] == 60


def test_atari_observations_network_and_items():
    """`--env ALE/...`: 4 stacked 84x84 grey frames, the Nature CNN, items over uint8 steps."""
    pytest.importorskip("ale_py", reason="needs ale-py (with its bundled ROMs), which the test extra installs")
    pytest.importorskip("cv2", reason="gymnasium's AtariPreprocessing needs OpenCV (opencv-python-headless, in the test extra)")
    spec = apex.env_spec("ALE/Pong-v5")
    assert spec["obs_shape"] == (4, 84, 84) and spec["obs_dtype"] == "uint8" and spec["num_actions"] == 6
    net = apex.make_network(spec, 64)
    env = apex.make_env("ALE/Pong-v5", 0)
    store = rp.Store({"obs": rp.Field(spec["obs_shape"], "uint8"), "action": rp.Field((), "int64"),
                      "reward": rp.Field((), "float32"), "terminal": rp.Field((), "bool")}, capacity=256)
    try:
        table = rp.Table("replay", store)
        stream = apex.NStepTransitions(store.writer(max_sequence_length=4), "replay", 3, 0.99)
        obs, _ = env.reset(seed=0)
        frames = []
        for _ in range(6):
            with torch.no_grad():
                q = net(torch.as_tensor(obs[None]))[0].numpy()
            a = int(q.argmax())
            nxt, r, term, trunc, _ = env.step(a)
            stream.step(obs, q, a, float(r))
            frames.append(obs)
            obs = nxt
        stream.end(obs, q, False)
        assert table.size == 6
        s = table.sample(6, timeout=0)
        assert s.data["obs"].dtype == np.uint8 and s.data["obs"].shape == (6, 4, 4, 84, 84)
        firsts = {s.data["obs"][i, 0].tobytes() for i in range(6)}
        assert firsts <= {f.tobytes() for f in frames}
    finally:
        env.close()
        store.close()


def test_atari_replay_stores_each_frame_once_compressed_and_vector_observations_raw():
    from reprise.examples.apex.nstep import NStepTransitions
    from reprise.examples.apex.tables import make_tables
    cfg = apex.Config(actors=1, envs_per_actor=1, replay_size=256, min_replay=10)
    for spec, compressed in (({"obs_shape": (4, 84, 84), "obs_dtype": "uint8"}, {"obs"}),
                             ({"obs_shape": (4,), "obs_dtype": "float32"}, set())):
        tables = make_tables(cfg, spec, num_params=3)
        try:
            replay = tables[0]
            assert replay.store.compressed_fields == compressed
            assert replay.store.signature["obs"].stack == (4 if compressed else 1)
            if compressed:
                # One episode of 100 stacks as FrameStackObservation gives them (the first
                # frame repeated at the start), written by the actor's stream: each step
                # writes its newest frame; 3-step items (under the replay's rate limiter:
                # nothing samples while they go in).
                frames = np.zeros((100, 84, 84), np.uint8)
                frames[:, 40:44, :] = np.arange(100)[:, None, None] % 84
                stacks = np.stack([frames[np.maximum(np.arange(i - 3, i + 1), 0)] for i in range(100)])
                with replay.store.writer() as w:
                    stream = NStepTransitions(w, "replay", 3, 0.9, newest_frame=True)
                    q = np.zeros(100, np.float32)   # Q values indexed by the action (the step)
                    for i in range(60):
                        stream.step(stacks[i], q, i, 0.0)
                    stream.end(stacks[60], q, terminated=True)
                s = replay.sample(32, timeout=0)
                assert s.data["obs"].shape == (32, 4, 4, 84, 84)
                for j in range(32):
                    first = s.data["action"][j, 0]
                    np.testing.assert_array_equal(s.data["obs"][j, :s.lengths[j]], stacks[first:first + s.lengths[j]])
                assert replay.store.memory()["fields"]["obs"]["ratio"] > 20
        finally:
            for t in tables:
                t.store.close()


# ----------------------------------------------------------------- a new user's misuses
#
# Each demo run below is a subprocess in a session of its own (signals reach it and its
# children only), with its own runtime directory (XDG_RUNTIME_DIR: where the server puts its
# socket and lock, crates/server/src/naming.rs) and an output directory under tmp_path. The
# child restores Python's SIGINT handler first: pytest run as a background job has SIGINT
# ignored, and its children would inherit that (the demo keeps an inherited SIG_IGN).

TINY = ["--actors", "1", "--envs-per-actor", "2", "--min-replay", "100", "--batch-size", "32",
        "--eval-episodes", "5"]


def test_help_shows_every_default_once():
    text = apex.config.make_parser().format_help()
    entries = re.split(r"\n(?=  -)", text.split("options:")[1].split("\n\n")[0])
    options = [e for e in entries if e.strip().startswith("--")]
    assert len(options) == len([a for a in apex.config.make_parser()._actions if a.option_strings]) - 1
    for entry in options:
        assert entry.count("(default:") == 1, entry
        assert "None" not in entry, entry


def test_cuda_without_cuda_is_refused_before_anything_starts(tmp_path, capsys, monkeypatch):
    from reprise import cli
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cli.main(["demo", "apex", "--device", "cuda", "--out", str(tmp_path / "never")]) == 2
    err = capsys.readouterr().err
    assert "reprise demo apex: --device cuda:" in err and "--device cpu" in err and "Traceback" not in err
    assert not (tmp_path / "never").exists()
    assert cli.main(["demo", "apex", "--device", "gpu", "--out", str(tmp_path / "never")]) == 2
    assert "--device gpu: not a device torch knows" in capsys.readouterr().err


@pytest.mark.parametrize("env, expected", [
    ("Pendulum-v1", ["--env Pendulum-v1 has the action space Box(", "Discrete(n)", "CartPole-v1"]),
    ("FrozenLake-v1", ["--env FrozenLake-v1 has the observation space Discrete(16)", "vector observations"]),
    ("NoSuchEnv-v0", ["--env NoSuchEnv-v0: Environment `NoSuchEnv` doesn't exist", "supported:"]),
    ("ALE/Pong-v5", ["--env ALE/Pong-v5 needs the atari extra (ale-py is not installed here)",
                     "pip install 'reprise[atari]'"]),
])
def test_unsupported_environments_are_refused(env, expected, tmp_path, capsys, monkeypatch):
    from reprise import cli
    monkeypatch.setitem(sys.modules, "ale_py", None)  # as if the atari extra were not installed
    assert cli.main(["demo", "apex", "--env", env, "--out", str(tmp_path / "never")]) == 2
    err = capsys.readouterr().err
    for text in expected:
        assert text in err, err
    assert "Traceback" not in err
    assert not (tmp_path / "never").exists()


def test_three_runs_started_together_each_get_a_directory_and_end_at_the_time_limit(tmp_path):
    """No --out: each run makes its own ./reprise-runs/apex-<time>-<pid>. --time-limit 3 ends
    a run as it starts: a summary that says so, exit 0, nothing left behind. The third run
    gets Ctrl-C while it draws its plot (matplotlib's import): the plot is skipped, the
    summary says where the signal came, and it exits 130."""
    slow_plot = str(Path(__file__).parent / "slow_plot")  # its matplotlib import takes 10 s more
    pythonpath = os.pathsep.join(filter(None, [slow_plot, os.environ.get("PYTHONPATH")]))
    runs = [DemoRun([*TINY, "--time-limit", "3"], cwd=tmp_path, env={"PYTHONPATH": pythonpath} if k == 2 else None)
            for k in range(3)]
    runs[2].wait_for(lambda: runs[2].saw("apex.png (Ctrl-C skips it)"), 60, "the plot")
    os.kill(runs[2].proc.pid, signal.SIGINT)
    codes = [r.finish(timeout=90) for r in runs]
    dirs = list((tmp_path / "reprise-runs").iterdir())
    assert sorted(int(d.name.rsplit("-", 1)[1]) for d in dirs) == sorted(r.proc.pid for r in runs)
    assert all(re.fullmatch(r"apex-\d{8}-\d{6}-\d+", d.name) for d in dirs), dirs
    for run, code in zip(runs, codes):
        assert code == (130 if run is runs[2] else 0), run.stderr[-3000:]
        run_dir = next(d for d in dirs if d.name.endswith(f"-{run.proc.pid}"))
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["ended"] == "time_limit" and not summary["solved"]
        assert summary["config"]["out"] == str(Path("reprise-runs") / run_dir.name)
        assert "time limit (3 s) reached" in run.stderr
        assert "not solved (time limit)" in run.out
        if run is runs[2]:
            assert summary["interrupted"] and summary["signal"] == "SIGINT" and summary["phase"] == "writing the plot"
            assert summary["plot"] is None and not (run_dir / "apex.png").exists()
            assert "then stopped by SIGINT while writing the plot" in run.out
        else:
            assert not summary["interrupted"] and summary["plot"] == "apex.png"
            assert f"wrote {Path('reprise-runs') / run_dir.name / 'summary.json'} and " in run.out
        run.assert_clean()


def test_sigint_before_the_server_is_up_writes_a_summary(tmp_path):
    out = tmp_path / "run"
    run = DemoRun([*TINY, "--out", str(out)])
    run.wait_for(lambda: out.exists(), 30, "run directory")
    os.kill(run.proc.pid, signal.SIGINT)
    assert run.finish(timeout=30) == 130, run.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["ended"] == "interrupted" and summary["signal"] == "SIGINT" and summary["phase"] == "starting"
    assert "interrupted by SIGINT" in run.out
    run.assert_clean()


def test_sigterm_to_the_supervisor_while_its_children_start_then_a_ctrl_c_storm(tmp_path):
    """SIGTERM to the supervisor alone while the learner and actor import torch, then, once it
    is stopping, SIGINT to the whole group every 50 ms until it exits (as a terminal's Ctrl-C
    reaches every process): the children stop quietly, the first signal decides the exit
    code, and nothing is left behind."""
    out = tmp_path / "run"
    run = DemoRun([*TINY, "--out", str(out)])
    run.wait_for(lambda: (_status(out) or {}).get("pids"), 60, "status.json with the children's pids")
    pids = list(_status(out)["pids"].values())
    os.kill(run.proc.pid, signal.SIGTERM)
    # Python runs pending handlers in signal-number order: SIGINT sent before the SIGTERM was
    # handled would count as the first. A user's second Ctrl-C comes after the first one acted.
    run.wait_for(lambda: run.saw("stopped by SIGTERM"), 30, "the supervisor handling SIGTERM")
    while run.proc.poll() is None:
        try:
            os.killpg(run.proc.pid, signal.SIGINT)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    assert run.finish(timeout=30) == 143, run.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["ended"] == "interrupted" and summary["signal"] == "SIGTERM"
    assert summary["phase"] in ("starting the processes", "waiting for the processes", "training")
    run.assert_clean(pids)


def test_sigint_while_training_then_again_while_plotting(tmp_path):
    """The first Ctrl-C stops training: the processes stop, the summary is written; a second
    one during the plot (matplotlib's import) skips it. No traceback anywhere."""
    out = tmp_path / "run"
    run = DemoRun([*TINY, "--out", str(out)])
    run.wait_for(lambda: (_status(out) or {}).get("samples", 0) > 0, 120, "learner samples")
    pids = list(_status(out)["pids"].values())
    os.kill(run.proc.pid, signal.SIGINT)
    run.wait_for(lambda: run.saw("apex.png (Ctrl-C skips it)"), 30, "the plot")
    os.kill(run.proc.pid, signal.SIGINT)
    assert run.finish(timeout=30) == 130, run.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["ended"] == "interrupted" and summary["signal"] == "SIGINT" and summary["phase"] == "training"
    assert summary["inserts"] > 0 and summary["samples"] > 0 and summary["final_eval_returns"] is None
    assert summary["plot"] is None and any("plot skipped: stopped by SIGINT" in line for line in summary["log"])
    assert not (out / "apex.png").exists()
    # Without a terminal, progress comes as lines: toward the solve threshold, against the time limit.
    assert re.search(r"apex CartPole-v1 +\d+% .* of 10:00", run.stderr), run.stderr[-3000:]
    run.assert_clean(pids)


def test_an_interrupt_that_python_wrapped_still_ends_an_optional_step_quietly():
    """A signal raised inside a class body under construction (here, as during the plot's
    matplotlib import in the Ctrl-C storm of the test above, once in CI) comes back as a
    RuntimeError from ``__set_name__``: ``optional`` still reads it as the interrupt it is,
    and lets every other error through."""
    import signal as _signal

    from reprise.examples.stopping import Interrupted, StopSignals, caused_by_interrupt

    class Descriptor:
        def __set_name__(self, owner, name):
            raise Interrupted(_signal.SIGINT)

    def build_a_class():
        class Formatter:  # noqa: F841 - made for its __set_name__
            locs = Descriptor()

    with pytest.raises(RuntimeError) as wrapped:
        build_a_class()
    assert caused_by_interrupt(wrapped.value) and not caused_by_interrupt(RuntimeError("plain"))
    stop = StopSignals()
    assert stop.optional(build_a_class) == (False, None)

    def broken():
        raise ValueError("a real failure")
    with pytest.raises(ValueError, match="a real failure"):
        StopSignals().optional(broken)
    assert StopSignals().optional(lambda: 7) == (True, 7)


def test_a_process_that_keeps_failing_ends_the_run_instead_of_a_restart_loop(monkeypatch):
    from reprise.examples.apex import processes

    class Dead:
        pid, exitcode = 4242, 1

    sup = processes.Supervisor(apex.Config(actors=1), "unix:///nowhere", time.time(), stop=None)
    started = []
    monkeypatch.setattr(sup, "start", lambda name: (started.append(name), sup.procs.__setitem__(name, Dead())))
    sup.procs = {"learner": Dead()}
    logged = []
    for _ in range(processes.FAILURES_TO_GIVE_UP - 1):
        assert sup.check(logged.append) is None
    why = sup.check(logged.append)
    assert why.startswith(f"learner exited {processes.FAILURES_TO_GIVE_UP} times within 60 s (last exit code 1)")
    assert started == ["learner"] * (processes.FAILURES_TO_GIVE_UP - 1) and sup.restarts["learner"] == 4


def test_run_directories_are_never_shared(tmp_path):
    from reprise.examples import rundirs
    a, b = rundirs.claim("apex", None, base=tmp_path), rundirs.claim("apex", None, base=tmp_path)
    assert a.path != b.path and a.path.parent == b.path.parent == tmp_path / "reprise-runs"
    assert re.fullmatch(rf"apex-\d{{8}}-\d{{6}}-{os.getpid()}(-\d+)?", b.path.name)
    # --out given twice while the first run holds it: refused; free again once released.
    first = rundirs.claim("apex", tmp_path / "mine")
    with pytest.raises(rundirs.DirectoryInUse, match="output directory of another run"):
        rundirs.claim("apex", tmp_path / "mine")
    first.release()
    rundirs.claim("apex", tmp_path / "mine").release()
    for d in (a, b):
        d.release()
    assert not [p for p in tmp_path.rglob("*") if p.is_file()]  # the lock leaves no file


def test_progress_prints_lines_without_a_terminal_or_on_a_pty_of_size_zero():
    import pty
    from reprise.examples.progress import ProgressLine, terminal_width
    master, slave = pty.openpty()  # a new pty reports 0 x 0 until someone sizes it
    with os.fdopen(slave, "w") as stream:
        assert stream.isatty() and terminal_width(stream) is None
        line = ProgressLine("apex CartPole-v1", every=10.0, stream=stream)
        line.update(212 / 475, "greedy return 212 of 475 | 0:42 of 10:00")
        line.update(0.5, "not shown yet: within 10 s of the last line")
        line.close()  # prints the last state
        os.set_blocking(master, False)
        # The pty hands written bytes to its master side a little later (under load, after
        # this read began once in CI): read until the last line is there, or 10 s.
        shown, deadline = "", time.monotonic() + 10
        while "not shown yet" not in shown and time.monotonic() < deadline:
            try:
                shown += os.read(master, 4096).decode()
            except BlockingIOError:
                time.sleep(0.01)
    os.close(master)
    assert "apex CartPole-v1  45% greedy return 212 of 475 | 0:42 of 10:00" in shown
    assert "apex CartPole-v1  50% not shown yet" in shown and "\x1b[K" not in shown
