"""The Ape-X demo: n-step items against a reference, targets, the CLI, and a smoke run that
must learn while an actor and the learner are killed and restarted."""

import json
import os
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
    assert "usage: reprise demo {apex,offline}" in capsys.readouterr().err
    assert cli.main(["frobnicate"]) == 2
    assert "unknown command 'frobnicate'" in capsys.readouterr().err


def _status(out: Path) -> dict | None:
    try:
        return json.loads((out / "status.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def test_smoke_learns_and_survives_killed_actor_and_learner(tmp_path):
    """`reprise demo apex --smoke` in a subprocess: SIGKILL an actor, then the learner, while it
    trains; both are restarted, training continues from the published parameters, and the
    final greedy policy is far better than random."""
    out = tmp_path / "apex"
    # The child finds reprise as this process did (installed, or PYTHONPATH in a checkout).
    proc = subprocess.Popen([sys.executable, "-m", "reprise.cli", "demo", "apex", "--smoke", "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        killed = {}
        deadline = time.monotonic() + 200
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
            s = _status(out)
            if s is None:
                continue
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
    # Learning: a random policy scores about 22 on CartPole-v1.
    assert summary["final_eval_mean_return"] >= 75, (summary["final_eval_mean_return"], summary["evals"])
    assert summary["samples_per_insert"] == pytest.approx(summary["config"]["samples_per_insert"], rel=0.3)
    assert "solved" in output and "wrote" in output


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
