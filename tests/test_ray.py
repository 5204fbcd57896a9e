"""``reprise.ray`` with a local Ray instance: a server placed in an actor on the node, a
task on the same node reaching it through the local path (shared memory), the driver over
gRPC when it asks for it, an actor killed and restarted from its checkpoint, nothing left
behind, and Ray never imported by the rest of the package."""

import os
import subprocess
import sys
import time

import numpy as np
import pytest

ray = pytest.importorskip("ray")

import reprise as rp  # noqa: E402
import reprise.ray  # noqa: E402,F401


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False,
             runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join(sys.path)}})
    yield
    ray.shutdown()


def make_tables():
    store = rp.Store({"token": rp.Field((), "int32")}, capacity=4096, block_steps=64)
    return [rp.Table("rollouts", store, max_size=100, seed=0, attributes={"version": "int64"})]


def write_and_count(info, n):
    """A Ray task: writes n items through ``info.client()``; returns which path it used."""
    with info.client() as c:
        with c.writer("rollouts") as w:
            for i in range(n):
                w.extend({"token": np.arange(3, dtype=np.int32) + i})
                w.create_item("rollouts", 3, 1.0, attributes={"version": i})
                w.end_episode()
        return c.address, c.info()["rollouts"]["size"]


def test_a_task_on_the_node_writes_through_the_local_path_and_the_driver_reads(local_ray):
    server = rp.ray.serve(make_tables)
    try:
        info = server.info
        assert info.local_address.startswith("unix://") and info.on_this_node()
        address, size = ray.get(ray.remote(write_and_count).remote(info, 5), timeout=60)
        assert address == info.local_address and size == 5  # same node: shared memory, not gRPC
        with rp.Client(info.address, token=info.token) as remote:  # another node's view: gRPC with the token
            s = remote.sample("rollouts", 5, timeout=10)
            assert len(s) == 5 and set(s.attributes["version"].tolist()) <= {0, 1, 2, 3, 4}
            assert set(remote.info()["rollouts"]["attributes"]) == {"version"}
        with pytest.raises(rp.errors.Unauthenticated):
            rp.Client(info.address, token="wrong").info()
    finally:
        server.stop()


def test_a_killed_server_actor_restarts_from_its_checkpoint_and_leaves_nothing(local_ray, tmp_path):
    server = rp.ray.serve(make_tables, checkpoint_dir=str(tmp_path / "ckpt"), max_restarts=1)
    try:
        pid = ray.get(server.actor.pid.remote(), timeout=30)
        ray.get(ray.remote(write_and_count).remote(server.info, 4), timeout=60)
        server.checkpoint()
        ray.kill(server.actor, no_restart=False)   # the process dies (SIGKILL); Ray restarts the actor
        new_pid, deadline = pid, time.monotonic() + 60
        while new_pid == pid and time.monotonic() < deadline:
            try:
                new_pid = ray.get(server.actor.pid.remote(), timeout=5)
            except ray.exceptions.RayError:
                time.sleep(0.2)
        assert new_pid != pid, "the actor was not restarted"
        info = server.refresh(timeout=60)
        assert ray.get(server.actor.restored_from.remote(), timeout=30)
        with info.client() as c:
            assert c.info()["rollouts"]["size"] == 4   # restored from the checkpoint
        # The killed process's shared memory went with the restarted server's first store.
        assert not [f for f in os.listdir("/dev/shm") if f.startswith(f"reprise-{pid}-")]
    finally:
        server.stop()
    assert not [f for f in os.listdir("/dev/shm") if f.startswith(f"reprise-{new_pid}-")]


def test_one_server_per_node_and_refusals(local_ray):
    servers = rp.ray.serve_per_node(make_tables)
    try:
        assert len(servers) == len([n for n in ray.nodes() if n["Alive"]]) == 1
    finally:
        for s in servers:
            s.stop()
    with pytest.raises(rp.errors.InvalidArgument, match="not both"):
        rp.ray.serve(make_tables, node_id="x", scheduling_strategy="SPREAD")
    with pytest.raises(rp.errors.InvalidArgument, match="pass port="):
        rp.ray.serve(make_tables, address="0.0.0.0:1")


def test_the_package_does_not_import_ray():
    code = "import sys, reprise, reprise.examples.grpo; assert 'ray' not in sys.modules, 'ray imported'"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]


def test_the_grpo_demo_runs_as_ray_actors_and_learns(local_ray, tmp_path):
    from reprise.examples import grpo
    cfg = grpo.Config(ray=True, time_limit=60.0, solve_reward=0.9, eval_every=2.0, seed=0, out=str(tmp_path / "run"))
    summary = grpo.run(cfg)
    assert summary["ended"] in ("solved", "time_limit"), summary["log"][-5:]
    # The tables were served from a reprise.ray actor, not from this process.
    assert any("serving the tables and running the trainer and the rollout workers as Ray actors" in line
               for line in summary["log"]), summary["log"][:5]
    serving = next(line for line in summary["log"] if "serving rollouts" in line)
    assert f"-{os.getpid()}" not in serving and summary["tokens_generated"] > 0, serving
    assert summary["best_greedy_reward"] >= summary["untrained_greedy_reward"] + 0.3
    assert summary["restarts"] == {"trainer": 0, "rollouts": 0}


def test_sigterm_stops_the_ray_run_writes_the_summary_and_leaves_nothing(tmp_path):
    """``reprise demo grpo --ray`` as a user runs it (its own local Ray instance), stopped by
    SIGTERM while training: exit 143, the summary written, and no actor process, socket or
    shared memory of the run left (the server's actor included)."""
    import json
    import signal
    sys.path.insert(0, os.path.dirname(__file__))
    from demo_runs import DemoRun, status
    out = tmp_path / "run"
    run = DemoRun("grpo", ["--ray", "--solve-reward", "1.01", "--out", str(out)])
    run.wait_for(lambda: (status(out) or {}).get("trainer_step", 0) > 0, 180, "trainer steps")
    st = status(out)
    pids = [*st["pids"].values(), st["server_pid"]]
    assert run.proc.pid not in pids, "the server ran in the driver, not in a Ray actor"
    os.kill(run.proc.pid, signal.SIGTERM)
    assert run.finish(timeout=120) == 143, run.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["ended"] == "interrupted" and summary["signal"] == "SIGTERM" and summary["trainer_steps"] > 0
    deadline = time.monotonic() + 30   # Ray's shutdown ends its workers as it goes
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.2)
    run.assert_clean(pids)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
