"""The asynchronous GRPO demo (``reprise demo grpo``): the task's checker, GRPO's
advantages, the policy, the command line, a smoke run that must learn, the straggler policy
with an injected slow worker, and Ctrl-C while it trains."""

import json
import os
import signal

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from demo_runs import DemoRun, status  # noqa: E402

from reprise.examples import grpo  # noqa: E402
from reprise.examples.grpo import model, task  # noqa: E402


def test_the_checker_gives_partial_credit_per_sorted_position():
    p = np.array([[3, 1, 2, 0], [5, 5, 0, 1]])
    assert grpo.rewards(p, np.sort(p, axis=1)).tolist() == [1.0, 1.0]
    assert grpo.rewards(p, np.array([[0, 1, 3, 3], [5, 5, 5, 5]])).tolist() == [0.75, 0.5]
    with pytest.raises(ValueError, match=r"must both be \[n, 4\]"):
        grpo.rewards(p, p[:, :3])
    # A uniformly random answer scores 1 / DIGITS on average.
    rng = np.random.default_rng(0)
    q = task.prompts(20_000, rng)
    assert abs(grpo.rewards(q, rng.integers(0, task.DIGITS, q.shape)).mean() - task.RANDOM_REWARD) < 0.01


def test_advantages_are_normalised_within_each_drawn_group():
    r = np.array([1.0, 0.0, 0.5, 0.5, 0.2, 0.4, 0.2, 0.4], np.float32)
    g = np.array([7, 7, 9, 9, 7, 7, 7, 7])  # group 7 drawn again later: its own run
    a = grpo.group_advantages(r, g)
    assert np.allclose(a[:2], [1.0, -1.0], atol=1e-3)
    assert np.allclose(a[2:4], 0.0)  # equal rewards: no signal
    assert np.allclose(a[4:], [-1, 1, -1, 1], atol=1e-3)
    assert a.dtype == np.float32


def test_the_policy_samples_scores_and_round_trips_its_parameters():
    torch.manual_seed(0)
    policy = model.make_policy(32, 1).eval()
    p = task.prompts(5, np.random.default_rng(1))
    seqs, logps = model.generate(policy, p)
    assert seqs.shape == (5, task.SEQUENCE) and logps.shape == (5, task.LENGTH)
    assert (seqs[:, :task.LENGTH].numpy() == p).all() and (seqs[:, task.LENGTH] == task.SEP).all()
    assert ((seqs[:, task.PROMPT:] >= 0) & (seqs[:, task.PROMPT:] < task.DIGITS)).all()
    # The trainer's forward pass scores the same tokens as generation did.
    assert torch.allclose(model.answer_logprobs(policy, seqs), logps, atol=1e-5)
    g1, _ = model.generate(policy, p, greedy=True)
    g2, _ = model.generate(policy, p, greedy=True)
    assert torch.equal(g1, g2)
    flat = model.flat_parameters(policy)
    assert flat.size == model.num_parameters(32, 1)
    other = model.make_policy(32, 1).eval()
    model.load_flat_parameters(other, flat)
    assert torch.equal(model.generate(other, p, greedy=True)[0], g1)
    with pytest.raises(ValueError, match="parameters given"):
        model.load_flat_parameters(other, flat[:-1])


@pytest.mark.parametrize("argv,message", [
    (["--group-size", "0"], "--group-size must be >= 1"),
    (["--tokens", "10"], "--tokens (10) must hold at least one group"),
    (["--max-staleness", "-1"], "--max-staleness must be >= 0"),
    (["--lr", "0"], "--lr must be > 0"),
    (["--group-timeout", "-1"], "--group-timeout must be >= 0"),
])
def test_bad_options_are_refused(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        grpo.parse_args(argv)
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_cli_lists_the_demo(capsys):
    from reprise import cli
    assert cli.main(["--help"]) == 0
    assert "reprise demo grpo" in capsys.readouterr().out


def test_smoke_learns_well_past_the_untrained_policy(tmp_path):
    """The CI check that it learns: a fixed seed, a clear rise of the greedy reward over the
    untrained policy's, trained only on items within the staleness bound, groups whole."""
    summary = grpo.run(grpo.parse_args(["--smoke", "--seed", "0", "--out", str(tmp_path / "run")]))
    assert summary["ended"] in ("solved", "time_limit"), summary["log"][-5:]
    assert summary["untrained_greedy_reward"] < 0.4
    assert summary["best_greedy_reward"] >= summary["untrained_greedy_reward"] + 0.3, summary["evals"]
    assert summary["trainer_steps"] > 10 and summary["tokens_trained"] > 0
    assert len(summary["staleness_trained"]) <= summary["config"]["max_staleness"] + 1  # never past the bound
    assert summary["stale_removed"] > 0  # rollouts of old versions left at set_version
    assert (tmp_path / "run" / "grpo.png").exists()
    assert all(m["tokens"] == summary["config"]["tokens"] for m in summary["metrics"])  # full batches


def test_a_slow_worker_s_groups_are_dropped_by_the_straggler_policy(tmp_path):
    """Worker 0 sends each group's last member 1 s late; with a 0.3 s group timeout those
    groups are dropped (counted), never trained on, and the other worker keeps the run going.
    A loose staleness bound here: with max_staleness 1 the trainer's versions would outrun
    the late groups first, and they would leave as stale instead."""
    cfg = grpo.Config(rollout_workers=2, slow_worker=1.0, group_timeout=0.3, max_staleness=10_000,
                      time_limit=14.0, seed=1, out=str(tmp_path / "run"))
    summary = grpo.run(cfg)
    assert summary["straggler_groups_dropped"] >= 1, summary["rollouts_info"]["groups"]
    assert summary["trainer_steps"] > 0
    groups = summary["rollouts_info"]["groups"]
    assert groups["dropped"] == summary["straggler_groups_dropped"] and groups["partial"] == 0


def test_ctrl_c_while_training_writes_the_summary_and_leaves_nothing(tmp_path):
    out = tmp_path / "run"
    run = DemoRun("grpo", ["--solve-reward", "1.01", "--out", str(out)])
    run.wait_for(lambda: (status(out) or {}).get("trainer_step", 0) > 0, 120, "trainer steps")
    pids = list(status(out)["pids"].values())
    os.kill(run.proc.pid, signal.SIGINT)
    assert run.finish(timeout=60) == 130, run.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["ended"] == "interrupted" and summary["signal"] == "SIGINT" and summary["phase"] == "training"
    assert summary["trainer_steps"] > 0
    run.assert_clean(pids)


def test_a_parked_partial_rollout_is_finished_by_a_newer_policy_with_per_token_versions():
    """park + resume, as a worker does when a new version arrives mid-generation: the finished
    sequence keeps the tokens, log-probabilities and versions it had, the new digits carry the
    newer version, and the item's version attribute is its oldest token's."""
    import reprise as rp
    from reprise.examples.grpo import rollout, tables

    cfg = grpo.Config(group_size=2, prompts_per_round=1, partial_rollouts=True, max_staleness=10)
    ts = tables.make_tables(cfg, model.num_parameters(cfg.width, cfg.layers))
    policy = model.make_policy(cfg.width, cfg.layers).eval()
    gen = torch.Generator().manual_seed(0)
    with rp.Server(ts) as server, rp.Client(server.local_address) as client:
        p = np.repeat(task.prompts(1, np.random.default_rng(3)), 2, axis=0)
        x = torch.cat([torch.as_tensor(p), torch.full((2, 1), task.SEP)], dim=1)
        x, lp = model.extend(policy, x, 2, generator=gen)  # two digits under version 3, then a new version
        with client.writer("partials") as pw:
            rollout.park(pw, x.numpy(), lp.numpy(), np.full((2, 2), 3), np.array([77, 77]))
        assert ts[4].size == 2 and ts[0].info()["groups"]["pending"] == 0
        with client.writer("rollouts") as w:
            rollout.resume(client, w, policy, 5, gen, limit=8)
        assert ts[4].size == 0 and ts[4].info()["num_samples"] == 2
        s = ts[0].sample(2, timeout=5)  # the group of 2 is complete: admitted, drawn whole
    for i in range(2):
        assert s.data["version"][i, task.PROMPT:].tolist() == [3, 3, 5, 5]
        assert np.allclose(s.data["logprob"][i, task.PROMPT:task.PROMPT + 2], lp[i].numpy())
        assert s.data["token"][i, :task.PROMPT + 2].tolist() == x[i].tolist()
    assert s.attributes["version"].tolist() == [3, 3] and s.attributes["group"].tolist() == [77, 77]
    for t in ts:
        t.store.close()


def test_partial_rollouts_run_learns_and_resumes_what_it_parks(tmp_path):
    summary = grpo.run(grpo.Config(smoke=True, partial_rollouts=True, time_limit=40.0, seed=2, solve_reward=0.9,
                                   out=str(tmp_path / "run")))
    assert summary["best_greedy_reward"] >= summary["untrained_greedy_reward"] + 0.3
    assert summary["partial_rollouts_parked"] > 0
    # Parked sequences are finished by the next round of some worker (a few may still wait at the end).
    assert summary["partial_rollouts_resumed"] >= summary["partial_rollouts_parked"] - 64 * 2


def test_ray_without_ray_is_refused_before_anything_starts(monkeypatch, capsys, tmp_path):
    import importlib.util
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a))
    assert grpo.main(["--ray", "--out", str(tmp_path / "run")]) == 2
    assert "--ray needs Ray: pip install 'reprise[ray]'" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
