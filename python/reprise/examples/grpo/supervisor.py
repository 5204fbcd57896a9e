"""The supervisor: serves the tables, runs the trainer and the rollout workers
(``reprise.examples.children``), shows progress, and at the end writes ``summary.json`` and
``grpo.png``. ``run(cfg)`` is the whole demo; ``main(argv)`` the command.

The tables live in this process (``rp.Server``), or with ``--ray`` in a Ray actor
(``reprise.ray.serve``) beside the trainer's and the rollout workers' actors; either way this
process reads them through a client, as the others do.

A run ends (``summary.json``'s ``ended``) ``solved`` (the trainer's greedy evaluation reached
``--solve-reward``), at the ``time_limit``, ``failed`` (a process kept exiting: exit 1), or
``interrupted`` by SIGINT or SIGTERM (exit 130 or 143). Every end takes the same way out: the
children are stopped before the server, ``summary.json`` is written, then ``grpo.png`` (a
second signal skips the plot); the server is stopped and the stores closed.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import time

from pathlib import Path

import reprise as rp

from .. import rundirs
from ..children import Children, RayChildren, connect, shut_down
from ..devices import device_problem
from ..progress import ProgressLine
from ..stopping import Interrupted, StopSignals, signal_name
from .config import Config, parse_args
from .model import num_parameters
from .plots import plot
from .rollout import rollout_main
from ..reports import RunRecord, drain
from .tables import make_tables
from .task import RANDOM_REWARD, SEQUENCE
from .trainer import trainer_main

TICK_S = 0.5
LINE_EVERY_S = 10.0


class Record(RunRecord):
    """What happened, as the run goes: the trainer's steps and evaluations, the log."""

    def __init__(self, started: float, progress: ProgressLine):
        super().__init__(started, progress)
        self.metrics: list[dict] = []


def children(cfg: Config, address, stop: StopSignals) -> Children:
    """The trainer and the rollout workers: processes, or Ray actors with ``--ray``
    (``address``: the server's local address, or its ``reprise.ray.ServerInfo``)."""
    parent = None if cfg.ray else os.getpid()

    def launch(name, launches):
        seed = cfg.seed * 7919 + launches
        if name == "trainer":
            return trainer_main, (cfg, address, seed, parent)
        return rollout_main, (cfg, int(name.split("-")[1]), address, seed, parent)
    return (RayChildren if cfg.ray else Children)("grpo", launch, stop, ["trainer", "rollouts"])


def start_ray(stop: StopSignals):
    """A local Ray instance for ``--ray`` (its workers import reprise from where this does);
    None when this process is in a Ray job already (which is then left running). The demo's
    signal handlers are put back after ``ray.init``, which installs its own."""
    import ray
    if ray.is_initialized():
        return None
    import reprise
    here = os.path.dirname(os.path.dirname(reprise.__file__))
    path = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p)
    ray.init(num_cpus=max(2, os.cpu_count() or 2), include_dashboard=False, log_to_driver=True,
             configure_logging=False, runtime_env={"env_vars": {"PYTHONPATH": path}})
    stop.reclaim()
    return ray


def serve(cfg: Config):
    """The tables served: ``(server, address, tables made here, the server's pid)``. In this
    process, or with ``--ray`` in a Ray actor on this node (``reprise.ray.serve``; ``address``
    is then its ``ServerInfo``, which every actor turns into a client)."""
    make = functools.partial(make_tables, cfg, num_parameters(cfg.width, cfg.layers))
    if cfg.ray:
        import ray
        import reprise.ray
        server = reprise.ray.serve(make, dashboard_address=cfg.dashboard)
        return server, server.info, [], ray.get(server.actor.pid.remote(), timeout=60)
    tables = make()
    server = rp.Server(tables, name=f"grpo-{os.getpid()}", dashboard_address=cfg.dashboard)
    return server, server.local_address, tables, os.getpid()


def train(cfg: Config, rec: Record, kids: Children, client, server_pid: int, out: Path) -> str:
    """The supervisor's loop; returns ``solved``, ``time_limit`` or ``failed``."""
    trained = 0
    while True:
        time.sleep(TICK_S)
        now = rec.now()
        got = drain(client, "metrics")
        for i in range(len(got.get("step", []))):
            m = {"time": now, **{k: (float(v[i]) if k in ("reward", "staleness") else int(v[i]))
                                 for k, v in got.items()}}
            rec.metrics.append(m)
            trained += m["tokens"]
        got = drain(client, "evals")
        for i in range(len(got.get("step", []))):
            e = {"time": now, "step": int(got["step"][i]), "greedy_reward": float(got["greedy_reward"][i])}
            rec.evals.append(e)
            if e["greedy_reward"] >= cfg.solve_reward and rec.solved_at is None:
                rec.solved_at = e
        info = client.info()["rollouts"]
        rec.history.append({"time": now, "generated": info["num_inserts"] * SEQUENCE, "trained": trained})
        failure = kids.check(rec.log)
        if failure is not None:
            rec.log(failure)
            return "failed"
        rec.phase = "training" if rec.metrics else "waiting for the processes"
        last = rec.evals[-1] if rec.evals else None
        rundirs.write_json(out / "status.json", {
            "time": now, "pids": kids.pids(), "server_pid": server_pid, "restarts": kids.restarts, "trainer_step": len(rec.metrics),
            "greedy_reward": last["greedy_reward"] if last else None, "version": info["version"],
            "tokens_generated": info["num_inserts"] * SEQUENCE, "tokens_trained": trained,
            "dashboard": rec.dashboard})
        when = f"{now:.0f}/{cfg.time_limit:.0f} s"
        if last is None:
            rec.progress.update(0.0, f"{when} | starting the trainer and {cfg.rollout_workers} rollout workers")
        else:
            lo = min(e["greedy_reward"] for e in rec.evals)
            frac = (last["greedy_reward"] - lo) / max(1e-9, cfg.solve_reward - lo)
            rec.progress.update(min(1.0, max(0.0, frac)),
                                f"greedy reward {last['greedy_reward']:.3f} of {cfg.solve_reward:g} | {when} | "
                                f"step {len(rec.metrics)} version {info['version']} | "
                                f"{info['num_inserts'] * SEQUENCE / max(now, 1e-9):,.0f} tokens/s generated")
        if rec.solved_at is not None:
            rec.log(f"solved: greedy reward {rec.solved_at['greedy_reward']:.3f} at trainer step "
                    f"{rec.solved_at['step']}")
            return "solved"
        if now >= cfg.time_limit:
            rec.log(f"time limit ({cfg.time_limit:g} s) reached")
            return "time_limit"


def run(cfg: Config, stop: StopSignals | None = None) -> dict:
    """Runs the demo; returns the summary (also written to ``<out>/summary.json``)."""
    if stop is None:
        with StopSignals() as own:
            return run(cfg, own)
    run_dir = progress = rec = server = kids = ended = ray_module = client = None
    tables = []
    try:
        try:
            with stop.hold():
                run_dir = rundirs.claim("grpo", cfg.out)
                cfg = dataclasses.replace(cfg, out=str(run_dir.path))
                progress = ProgressLine("grpo", every=LINE_EVERY_S)
                rec = Record(time.time(), progress)
            rec.log(f"writing to {run_dir.path}; Ctrl-C stops the run and still writes the summary")
            if cfg.ray:
                ray_module = start_ray(stop)
                rec.log("serving the tables and running the trainer and the rollout workers as Ray actors "
                        "(a local Ray instance)")
            with stop.hold():
                server, address, tables, server_pid = serve(cfg)
                client = connect(address)
            local = address if isinstance(address, str) else address.local_address
            dashboard = server.dashboard_url if isinstance(address, str) else address.dashboard_url
            if dashboard is not None:
                rec.dashboard = dashboard
                rec.log(f"dashboard: open {dashboard} in a browser")
            kids = children(cfg, address, stop)
            rec.log(f"serving {', '.join(client.tables)} at {local}; {cfg.rollout_workers} "
                    f"rollout workers, groups of {cfg.group_size}, max_staleness {cfg.max_staleness}, "
                    f"{cfg.tokens} tokens a step")
            rec.phase = "starting the processes"
            kids.start("trainer")
            for i in range(cfg.rollout_workers):
                kids.start(f"rollout-{i}")
            rec.phase = "waiting for the processes"
            ended = train(cfg, rec, kids, client, server_pid, run_dir.path)
        except Interrupted:
            if rec is None:
                raise
            ended = "interrupted"
        stop.stopping()
        return _finish(cfg, stop, rec, ended, client, kids, run_dir.path)
    finally:
        if client is not None:
            client.close()
        shut_down(stop, progress, kids, server, tables, run_dir)
        if ray_module is not None:
            ray_module.shutdown()


def _finish(cfg, stop, rec, ended, client, kids, out: Path) -> dict:
    interrupted_in = rec.phase
    rec.progress.close()
    if stop.interrupted:
        rec.log(f"stopped by {signal_name(stop.first)} while {rec.phase}: stopping the processes and writing "
                f"the summary")
    rec.phase = "stopping"
    if kids is not None:
        kids.stop()
    infos = client.info() if client is not None else {}
    info, partials = infos.get("rollouts"), infos.get("partials")
    stats = client.stats()["rollouts"].get("staleness", {}) if client is not None else {}
    behind = list(stats.get("behind", []))
    while behind and behind[-1] == 0:
        behind.pop()
    elapsed = rec.now()
    generated = info["num_inserts"] * SEQUENCE if info else 0
    trained = sum(m["tokens"] for m in rec.metrics)
    untrained = rec.evals[0]["greedy_reward"] if rec.evals else None
    summary = {
        "task": "sort 4 digits of 0-5 (reward: fraction of positions right)",
        "ended": ended,
        "interrupted": stop.interrupted,
        "signal": signal_name(stop.first),
        "phase": interrupted_in if stop.interrupted else None,
        "solved": rec.solved_at is not None,
        "solve_reward": cfg.solve_reward,
        "solved_at_seconds": rec.solved_at["time"] if rec.solved_at else None,
        "solved_at_step": rec.solved_at["step"] if rec.solved_at else None,
        "untrained_greedy_reward": untrained,
        "random_policy_reward": RANDOM_REWARD,
        "final_greedy_reward": rec.evals[-1]["greedy_reward"] if rec.evals else None,
        "best_greedy_reward": max((e["greedy_reward"] for e in rec.evals), default=None),
        "trainer_steps": len(rec.metrics),
        "seconds": elapsed,
        "time_limit": cfg.time_limit,
        "tokens_generated": generated,
        "tokens_trained": trained,
        "tokens_generated_per_second": generated / max(elapsed, 1e-9),
        "tokens_trained_per_second": trained / max(elapsed, 1e-9),
        "staleness_trained": behind,
        "mean_staleness_trained": stats.get("mean_behind"),
        "stale_removed": info["stale_removed"] if info else 0,
        "stale_dropped": info["stale_dropped"] if info else 0,
        "straggler_groups_dropped": info["groups"]["dropped"] if info else 0,
        "partial_rollouts_parked": partials["num_inserts"] if partials else None,
        "partial_rollouts_resumed": partials["num_samples"] if partials else None,
        "restarts": kids.restarts if kids else {},
        "evals": rec.evals,
        "metrics": rec.metrics,
        "rollouts_info": info,
        "plot": None,
        "log": rec.lines,
        "config": dataclasses.asdict(cfg),
    }
    rundirs.write_json(out / "summary.json", summary)
    if rec.evals or rec.metrics:
        rec.phase = "writing the plot"
        ran, _ = stop.optional(plot, out / "grpo.png", rec.evals, rec.metrics, rec.history, behind,
                               cfg.solve_reward, untrained,
                               f"async GRPO on Reprise: {cfg.rollout_workers} rollout workers, G={cfg.group_size}, "
                               f"max_staleness={cfg.max_staleness}")
        if ran:
            summary["plot"] = "grpo.png"
        else:
            rec.log(f"plot skipped: stopped by {signal_name(stop.first)}")
        if stop.interrupted and not summary["interrupted"]:
            summary.update(interrupted=True, signal=signal_name(stop.first), phase=rec.phase)
        summary["log"] = rec.lines
        rundirs.write_json(out / "summary.json", summary)
    how = {"solved": "solved", "time_limit": "not solved (time limit)", "failed": "failed",
           "interrupted": f"interrupted by {summary['signal']}"}[ended]
    final = summary["final_greedy_reward"]
    print(f"{how} after {elapsed:.0f} s: greedy reward {untrained if untrained is None else round(untrained, 3)} "
          f"-> {final if final is None else round(final, 3)} in {len(rec.metrics)} trainer steps; "
          f"{generated:,} tokens generated, {trained:,} trained; stale removed {summary['stale_removed']}, "
          f"straggler groups dropped {summary['straggler_groups_dropped']}")
    print(f"wrote {out / 'summary.json'}" + (f" and {out / 'grpo.png'}" if summary["plot"] else ""), flush=True)
    return summary


def main(argv=None) -> int:
    """``reprise demo grpo``. Exit status: 0 the run ended (solved or at the time limit), 1 a
    process kept failing, 2 refused (options, device, output directory in use), 130 / 143
    stopped by SIGINT / SIGTERM."""
    return rundirs.demo_main("grpo", argv, parse_args, preflight, run)


def preflight(cfg: Config) -> str | None:
    """Why the demo cannot run with ``cfg`` here (a device this machine lacks, ``--ray``
    without Ray), or None."""
    if cfg.ray:
        import importlib.util
        if importlib.util.find_spec("ray") is None:
            return "--ray needs Ray: pip install 'reprise[ray]'"
    return device_problem(cfg.device)
