"""``reprise demo gpu``: vectorised CartPole against gymnasium's, the replay it writes (each
item the transition of its step, nothing lost at a stop), a smoke run that learns through a
device store (emulated on the CPU in CI, CUDA when present), and a user's misuses: refused
options and devices, SIGTERM while training."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import reprise.torch as rt  # noqa: E402
from reprise import cli  # noqa: E402
from reprise.examples import gpu  # noqa: E402
from reprise.examples.gpu import cartpole  # noqa: E402
from reprise.examples.gpu.config import Config, parse_args  # noqa: E402
from reprise.examples.gpu.dqn import Learner  # noqa: E402
from reprise.examples.gpu.replay import Actor, make_replay  # noqa: E402

DEMO = ("import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
        "from reprise import cli; sys.exit(cli.main(sys.argv[1:]))")


def test_vectorised_cartpole_steps_exactly_as_gymnasium():
    """The same start states and actions: the same states to the last bit, the same
    termination, for 200 steps of 16 environments, each until it falls."""
    pytest.importorskip("gymnasium")
    from gymnasium.envs.classic_control.cartpole import CartPoleEnv
    rng = np.random.default_rng(3)
    envs = [CartPoleEnv() for _ in range(16)]
    for i, e in enumerate(envs):
        e.reset(seed=i)
    state = torch.tensor(np.stack([e.state for e in envs]), dtype=torch.float64)
    alive = np.ones(16, dtype=bool)
    for _ in range(200):
        actions = rng.integers(0, 2, 16)
        nxt = cartpole.dynamics(state, torch.as_tensor(actions))
        fell = cartpole.failed(nxt).numpy()
        for i, e in enumerate(envs):
            if not alive[i]:
                continue
            obs, reward, terminated, _, _ = e.step(int(actions[i]))
            assert np.array_equal(np.asarray(e.state, dtype=np.float64), nxt[i].numpy()), i
            assert np.array_equal(obs, nxt[i].to(torch.float32).numpy()) and reward == 1.0
            assert terminated == fell[i]
            alive[i] &= not terminated
        state = nxt
    assert not alive.any()   # every one fell: the failure test was compared at its edge too


def test_vec_cartpole_resets_finished_episodes_and_counts_their_returns():
    env = cartpole.VecCartPole(8, torch.device("cpu"), seed=0)
    lengths = np.zeros(8, dtype=int)
    finished = []
    for _ in range(600):   # always push right: every episode ends early
        _, reward, terminated, truncated = env.step(torch.ones(8, dtype=torch.int64))
        assert torch.all(reward == 1.0)
        lengths += 1
        done = (terminated | truncated).numpy()
        finished += list(lengths[done])
        lengths[done] = 0
        assert torch.all(env.obs.abs()[done] <= cartpole.RESET_BOUND)   # reset in place
    episodes, total = env.take_returns()
    assert episodes == len(finished) > 0 and total == pytest.approx(sum(finished))
    assert env.take_returns() == (0, 0.0)


@pytest.fixture
def emulated():
    rt.emulate_cuda(True)
    yield
    rt.emulate_cuda(False)


def _replay(envs: int = 32, **kw):
    cfg = Config(envs=envs, batch_size=64, replay_size=4096, min_replay=64, **kw)
    store, table = make_replay(cfg, "cuda")
    learner = Learner(cfg, torch.device("cpu"), 0)
    actor = Actor(cfg, table, learner.policy, learner.lock, torch.device("cpu"), 0)
    return cfg, store, table, learner, actor


def test_each_item_is_the_transition_of_its_step(emulated):
    """N items per iteration, item j over step j of the extend: every sampled item's next
    observation is the dynamics of its observation and action, its terminal flag the
    failure test of that next state."""
    cfg, store, table, learner, actor = _replay(samples_per_insert=0.01)   # the limiter never holds an insert
    try:
        for _ in range(10):
            actor.iteration()
        assert table.size == 10 * cfg.envs
        s = table.sample(100, device="cuda", timeout=10)   # within the limiter's buffer
        d = {k: v[:, 0] for k, v in s.data.items()}
        assert d["obs"].device.type == "cpu"   # emulated: "cuda" is the CPU
        # The float32 observation is the float64 state rounded: step from it and round again.
        expected = cartpole.dynamics(d["obs"].double(), d["action"]).to(torch.float32)
        assert torch.allclose(expected, d["next_obs"], atol=1e-5)
        assert torch.equal(cartpole.failed(d["next_obs"].double()) & d["terminal"], d["terminal"])
        assert torch.all(d["reward"] == 1.0)
        assert table.info()["num_store_evictions"] == 0
    finally:
        actor.close()
        store.close()


def test_an_actor_stopped_at_the_rate_limiter_counts_what_it_dropped(emulated):
    """No learner samples: the limiter holds inserts; the stop ends the wait, and every
    step is either an item or counted as dropped."""
    cfg, store, table, learner, actor = _replay(samples_per_insert=8.0)
    halt = threading.Event()
    thread = threading.Thread(target=actor.run, args=(halt,))
    thread.start()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not table.info().get("insert_blocked", False):
        before = table.size
        time.sleep(1.0)
        if table.size == before:
            break
    halt.set()
    thread.join(10)
    try:
        assert not thread.is_alive() and actor.error is None
        assert actor.dropped > 0
        assert table.size + actor.dropped == actor.iterations * cfg.envs
    finally:
        actor.close()
        store.close()


# ~1,900 learner steps of 64 items. On 2 busy cores (2026-11-27) the greedy return passed 100
# from about 9,000 env steps on, and 12,000-step runs ended at 107 to 151.
SMOKE_STEPS = 15_000


def test_smoke_run_learns_through_a_device_store(tmp_path, capsys):
    """CUDA when present, else the GPU path emulated on the CPU: env steps and samples flow,
    the store never evicts (the table's FIFO remover frees whole blocks in order), every
    step is an item or dropped at the stop, the limiter holds the replay ratio, and the
    greedy policy beats a constant one (about 9 steps) by far.

    The run is bounded by env steps, not by time: with ``SampleToInsertRatio`` pairing
    learner steps to env steps, what is written and learnt is the same on a fast or a
    loaded machine (the time limit is only a safety net)."""
    summary = gpu.run(parse_args(["--smoke", "--steps", str(SMOKE_STEPS), "--batch-size", "64",
                                  "--time-limit", "300", "--out", str(tmp_path / "run")]))
    captured = capsys.readouterr()
    out = captured.out + captured.err   # the progress lines go to stderr, the summary line to stdout
    assert summary == json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["ended"] == "steps", f"not {SMOKE_STEPS} env steps in 300 s: {summary['env_steps']}"
    assert not summary["interrupted"]
    assert f"steps: {summary['env_steps']:,} env steps (" in out and "items sampled (" in out
    assert "final greedy return" in out
    assert ("env steps/s" in out and "samples/s" in out) or not summary["evals"]   # one line per evaluation
    assert summary["emulated"] == (not torch.cuda.is_available())
    cfg, t = summary["config"], summary["table"]
    assert summary["env_steps"] >= SMOKE_STEPS
    assert t["num_inserts"] + summary["items_dropped_at_stop"] == summary["env_steps"]
    # The store never evicts; the table's remover evicts what passes replay_size, oldest first.
    assert t["num_store_evictions"] == 0
    assert t["num_evictions"] == max(0, t["num_inserts"] - cfg["replay_size"])
    assert t["size"] == t["num_inserts"] - t["num_evictions"]
    assert t["num_samples"] == summary["samples"]
    # The limiter pairs samples to inserts: samples_per_insert per insert past min_replay,
    # within its error buffer (replay.make_replay's), however fast either side is.
    paired = cfg["samples_per_insert"] * (t["num_inserts"] - cfg["min_replay"])
    buffer = 2.0 * (cfg["samples_per_insert"] * cfg["envs"] + cfg["batch_size"])
    assert paired - buffer <= summary["samples"] <= paired + buffer, (summary["samples"], paired, buffer)
    best = max([summary["final_eval_return"]] + [e["eval_return"] for e in summary["evals"]])
    assert best >= 60, (summary["final_eval_return"], summary["evals"])
    assert not rt.emulated()   # the run's emulation ended with it


def test_the_time_limit_ends_a_run(tmp_path):
    summary = gpu.run(parse_args(["--smoke", "--time-limit", "1", "--eval-every", "100", "--out", str(tmp_path / "run")]),
                      show=False)
    assert summary["ended"] == "time_limit" and not summary["interrupted"] and summary["elapsed_s"] >= 1
    assert summary["table"]["num_inserts"] + summary["items_dropped_at_stop"] == summary["env_steps"] > 0
    assert summary["table"]["num_store_evictions"] == 0 and summary["final_eval_return"] is not None


def test_prioritized_run_updates_priorities(tmp_path):
    summary = gpu.run(parse_args(["--smoke", "--prioritized", "--steps", "8000", "--eval-every", "100",
                                  "--out", str(tmp_path / "run")]), show=False)
    assert summary["ended"] == "steps" and summary["learner_steps"] > 0
    assert summary["config"]["prioritized"]


@pytest.mark.parametrize("args, message", [
    (["--envs", "-1"], "--envs must be >= 1 (or 0 for the device's default), got -1"),
    (["--gamma", "1.5"], "--gamma must be in (0, 1], got 1.5"),
    (["--replay-size", "100", "--min-replay", "200"], "--min-replay (200) must be <= --replay-size (100)"),
    (["--time-limit", "0"], "--time-limit must be > 0, got 0"),
])
def test_bad_options_are_refused_with_what_was_expected(args, message, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["demo", "gpu", *args, "--out", str(tmp_path / "never")])
    assert e.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "never").exists()


def test_cuda_without_cuda_is_refused_before_anything_starts(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cli.main(["demo", "gpu", "--device", "cuda", "--out", str(tmp_path / "never")]) == 2
    err = capsys.readouterr().err
    assert "reprise demo gpu: --device cuda:" in err and "--device cpu" in err and "Traceback" not in err
    assert not (tmp_path / "never").exists()


def test_help_shows_every_default_once():
    import re
    from reprise.examples.gpu.config import make_parser
    parser = make_parser()
    entries = re.split(r"\n(?=  -)", parser.format_help().split("options:")[1].split("\n\n")[0])
    options = [e for e in entries if e.strip().startswith("--")]
    assert len(options) == len([a for a in parser._actions if a.option_strings]) - 1
    for entry in options:
        assert entry.count("(default:") == 1, entry


def test_sigterm_while_training_writes_the_summary(tmp_path):
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-c", DEMO, "demo", "gpu", "--smoke", "--device", "cpu",
                             "--time-limit", "120", "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and "env steps/s" not in "".join(lines) and proc.poll() is None:
            time.sleep(0.05)
        assert "env steps/s" in "".join(lines), "".join(lines)[-3000:]
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=60) == 143, "".join(lines)[-3000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    reader.join(5)
    output = "".join(lines)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["ended"] == "interrupted" and summary["signal"] == "SIGTERM"
    assert summary["env_steps"] > 0 and summary["table"]["num_store_evictions"] == 0
    assert summary["table"]["num_inserts"] + summary["items_dropped_at_stop"] == summary["env_steps"]
    assert "stopped by SIGTERM" in output and "Traceback" not in output
    left = [f for f in os.listdir("/dev/shm") if f.startswith(f"reprise-{proc.pid}-")] \
        if os.path.isdir("/dev/shm") else []
    assert left == []
