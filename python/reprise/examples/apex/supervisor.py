"""The supervisor: owns and serves the tables, runs the learner and the actors
(``processes.Supervisor``), shows progress, and at the end evaluates the newest parameters
and writes ``summary.json`` and ``apex.png``. ``run(cfg)`` is the whole demo; ``main(argv)``
the command.

Before anything starts, ``main`` refuses (exit 2, one line, no traceback) an environment
the demo cannot run (``envs.env_spec``) and a ``--device`` this machine lacks.

A run ends (``summary.json``'s ``ended``) ``solved``, at the ``time_limit``, ``failed`` (a
process kept exiting: exit 1), or ``interrupted`` by SIGINT or SIGTERM at any point
(``signal``, and the ``phase`` it came in: exit 130 or 143). Every end takes the same way
out: the children are stopped (before the server, so none sees its connection lost); the
final greedy evaluation runs when the run was solved or reached its time limit and the
learner had published parameters; ``summary.json`` is written, then ``apex.png``; the
server is stopped (its socket and lock file removed) and the stores closed (their shared
memory removed). A second signal skips the final evaluation or the plot, whichever is left,
and nothing else (``stopping.StopSignals``).
"""

from __future__ import annotations

import dataclasses
import os
import time

from pathlib import Path

import numpy as np

import reprise as rp

from .. import rundirs
from ..children import shut_down
from ..devices import device_problem
from ..progress import ProgressLine
from ..stopping import Interrupted, StopSignals, signal_name
from .config import Config, parse_args, solve_threshold
from .envs import UnsupportedEnv, env_spec, evaluate
from .model import load_flat_parameters, make_network, num_parameters
from .plots import plot
from .processes import Supervisor
from ..reports import RunRecord, drain
from .tables import make_tables

RANDOM_CARTPOLE_RETURN = 22.0  # mean return of a uniformly random policy on CartPole-v1
TICK_S = 0.5                   # the supervisor's loop: drain reports, check processes, status, progress
LINE_EVERY_S = 10.0            # a progress line this often without a terminal


def clock(seconds: float) -> str:
    seconds = max(0, int(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}" if seconds >= 3600 \
        else f"{seconds // 60}:{seconds % 60:02d}"


class Record(RunRecord):
    """What happened, as the run goes: reports drained from the tables, counters, the log.
    Phases: starting, starting the processes, waiting for the processes (their imports, the
    first transitions), training, stopping, final evaluation, writing the plot."""

    def __init__(self, started: float, progress: ProgressLine):
        super().__init__(started, progress)
        self.episodes: list[tuple] = []
        self.env_steps = 0


def solve_progress(cfg: Config, threshold, rec: Record, info: dict, rates: dict) -> tuple:
    """``(fraction, text)`` for the progress line. The fraction is the newest greedy
    evaluation's mean return on the way to the solve threshold, from the lowest return seen
    (or 0: so ``return / 475`` on CartPole); the text has the time against the limit."""
    when = f"{clock(rec.now())} of {clock(cfg.time_limit)}"
    if info["num_inserts"] == 0:
        return 0.0, f"{when} | starting the learner and {cfg.actors} actors (each imports torch)"
    if info["num_samples"] == 0:
        return 0.0, f"{when} | filling replay: {info['size']:,} of {cfg.min_replay:,} transitions before learning"
    recent = [r for _, r in rec.episodes[-100:]]
    actors = f"actors {np.mean(recent):.0f} (last {len(recent)})" if recent else "actors -"
    speed = (f"env {rates.get('env_steps', 0):,.0f}/s ins {rates.get('inserts', 0):,.0f}/s "
             f"smp {rates.get('samples', 0):,.0f}/s")
    last = rec.evals[-1]["mean_return"] if rec.evals else None
    if threshold is None:
        solve = f"greedy return {last:.0f} (no solve threshold)" if last is not None else "no greedy evaluation yet"
        return min(1.0, rec.now() / cfg.time_limit), f"{solve} | {when} | {actors} | {speed}"
    if last is None:
        return 0.0, f"greedy return - of {threshold:g} | {when} | {actors} | {speed}"
    lowest = min([0.0, last] + [r for _, r in rec.episodes] + [e["mean_return"] for e in rec.evals])
    fraction = (last - lowest) / (threshold - lowest) if threshold > lowest else 1.0
    return fraction, f"greedy return {last:.0f} of {threshold:g} | {when} | {actors} | {speed}"


def train(cfg: Config, rec: Record, sup: Supervisor, tables, threshold, out: Path) -> str:
    """The supervisor's loop while the processes work; returns how it ended: ``solved``,
    ``time_limit`` or ``failed``."""
    replay, _, episodes_q, evals_q, _ = tables
    while True:
        time.sleep(TICK_S)
        now = rec.now()
        got = drain(episodes_q)
        for ret, length in zip(got.get("episode_return", []), got.get("episode_length", [])):
            rec.episodes.append((now, float(ret)))
            rec.env_steps += int(length)
        got = drain(evals_q)
        for i in range(len(got.get("mean_return", []))):
            e = {"time": now, "learner_step": int(got["learner_step"][i]),
                 "mean_return": float(got["mean_return"][i]), "episodes": int(got["episodes"][i]),
                 "loss": float(got["loss"][i])}
            rec.evals.append(e)
            if e["episodes"] >= cfg.eval_episodes and threshold is not None and e["mean_return"] >= threshold:
                rec.solved_at = e
        info = replay.info()
        rec.history.append({"time": now, "inserts": info["num_inserts"], "samples": info["num_samples"],
                            "env_steps": rec.env_steps})
        failure = sup.check(rec.log)
        if failure is not None:
            rec.log(failure)
            return "failed"
        recent = [r for _, r in rec.episodes[-100:]]
        window = [h for h in rec.history if h["time"] >= now - 5.0]
        rates = {k: (window[-1][k] - window[0][k]) / max(1e-9, window[-1]["time"] - window[0]["time"])
                 for k in ("inserts", "samples", "env_steps")} if len(window) > 1 else {}
        # The phase first: a signal that comes once status.json shows inserts finds it set.
        rec.phase = "training" if info["num_inserts"] else "waiting for the processes"
        rundirs.write_json(out / "status.json", {
            "time": now, "pids": sup.pids(), "restarts": sup.restarts, "env_steps": rec.env_steps,
            "inserts": info["num_inserts"], "samples": info["num_samples"], "episodes": len(rec.episodes),
            "learner_step": rec.evals[-1]["learner_step"] if rec.evals else 0,
            "mean_actor_return": float(np.mean(recent)) if recent else None,
            "last_eval": rec.evals[-1]["mean_return"] if rec.evals else None,
            "dashboard": rec.dashboard,
        })
        rec.progress.update(*solve_progress(cfg, threshold, rec, info, rates))
        if rec.solved_at is not None:
            rec.log(f"solved: greedy mean return {rec.solved_at['mean_return']:.1f} over "
                    f"{rec.solved_at['episodes']} episodes at learner step {rec.solved_at['learner_step']}")
            return "solved"
        if now >= cfg.time_limit:
            rec.log(f"time limit ({cfg.time_limit:g} s) reached")
            return "time_limit"


def final_evaluation(cfg: Config, spec: dict, source) -> tuple[list, int]:
    """Greedy returns of ``--eval-episodes`` episodes of the parameters ``source`` (the
    ``params`` or the ``best`` table) draws, in this process, and their learner step."""
    net = make_network(spec, cfg.hidden)
    p = source.sample(1, timeout=0)
    load_flat_parameters(net, p.data["weights"][0, 0])
    net.eval()
    return evaluate(net, cfg, cfg.eval_episodes, seed=123_456), int(p.data["learner_step"][0, 0])


def final_parameters(ended: str, tables) -> tuple:
    """``(table, which)``: what the final evaluation evaluates. A solved run: the newest
    parameters (the ones that solved it). Otherwise the best quick evaluation's: DQN's greedy
    policy can collapse for a while late in a run, and the policy a run hands over is the best
    one it found. None when the learner published nothing."""
    params, best = tables[1], tables[4]
    if ended != "solved" and best.size > 0:
        return best, "best"
    return (params, "newest") if params.size > 0 else (None, None)


def run(cfg: Config, stop: StopSignals | None = None) -> dict:
    """Runs the demo; returns the summary (also written to ``<out>/summary.json``).
    ``stop``: the signal handlers ``main`` installed; without them ``run`` installs its own
    for its duration. A signal ends the run early, with a summary (see the module doc)."""
    if stop is None:
        with StopSignals() as own:
            return run(cfg, own)
    cfg = cfg.resolved()
    run_dir = progress = rec = spec = threshold = server = sup = ended = None
    tables, device = [], cfg.device
    try:
        try:
            with stop.hold():  # a signal waits until the directory is claimed: the summary goes there
                run_dir = rundirs.claim("apex", cfg.out)
                cfg = dataclasses.replace(cfg, out=str(run_dir.path))
                progress = ProgressLine(f"apex {cfg.env}", every=LINE_EVERY_S)
                rec = Record(time.time(), progress)
            rec.log(f"writing to {run_dir.path}; Ctrl-C stops the run and still writes the summary")
            import torch
            device = cfg.device or ("cuda" if torch.cuda.is_available() else "cpu")
            spec = env_spec(cfg.env)
            threshold = solve_threshold(cfg, spec)
            with stop.hold():  # the stores, tables and server exist whole or not at all
                tables = make_tables(cfg, spec, num_parameters(spec, cfg.hidden))
                server = rp.Server(tables, name=f"apex-{os.getpid()}", dashboard_address=cfg.dashboard)
            if server.dashboard_url is not None:
                rec.dashboard = server.dashboard_url
                rec.log(f"dashboard: open {server.dashboard_url} in a browser")
            sup = Supervisor(cfg, server.local_address, rec.started, stop)
            rec.log(f"serving replay, params, episodes, evals, best at {server.local_address}; "
                    f"{cfg.actors} actors x {cfg.envs_per_actor} envs, learner on {device}")
            rec.phase = "starting the processes"
            sup.start_all()
            rec.phase = "waiting for the processes"
            ended = train(cfg, rec, sup, tables, threshold, run_dir.path)
            stop.stopping()
        except Interrupted:
            if rec is None:
                raise  # before the run directory: main says that nothing was written
            ended = "interrupted"
        stop.stopping()
        return _finish(cfg, stop, rec, ended, spec, threshold, tables, sup, device, run_dir.path)
    finally:
        shut_down(stop, progress, sup, server, tables, run_dir)


def _finish(cfg, stop, rec, ended, spec, threshold, tables, sup, device, out: Path) -> dict:
    """The shutdown after the run ended: children stopped, final evaluation, summary, plot."""
    interrupted_in = rec.phase
    rec.progress.close()
    if stop.interrupted:
        rec.log(f"stopped by {signal_name(stop.first)} while {rec.phase}: stopping"
                + (" the processes" if sup is not None else "") + " and writing the summary")
    rec.phase = "stopping"
    if sup is not None:
        sup.stop()
    final, final_step, which = None, None, None
    if ended in ("solved", "time_limit"):
        source, which = final_parameters(ended, tables) if tables else (None, None)
        if source is not None:
            rec.phase = "final evaluation"
            what = "newest parameters" if which == "newest" else "parameters of the best quick evaluation"
            rec.log(f"final evaluation: {cfg.eval_episodes} greedy episodes of the {what}")
            ran, result = stop.optional(final_evaluation, cfg, spec, source)
            if ran:
                final, final_step = result
            else:
                rec.log(f"final evaluation skipped: stopped by {signal_name(stop.first)}")
                interrupted_in = interrupted_in if ended == "interrupted" else rec.phase
        else:
            rec.log("no final evaluation: the learner published no parameters before the end")
    info = tables[0].info() if tables else None
    elapsed = rec.now()
    recent = [r for _, r in rec.episodes[-100:]]
    inserts = info["num_inserts"] if info else 0
    samples = info["num_samples"] if info else 0
    summary = {
        "env": cfg.env,
        "ended": ended,
        "interrupted": stop.interrupted,
        "signal": signal_name(stop.first),
        "phase": interrupted_in if stop.interrupted else None,   # where the first signal came
        "solved": rec.solved_at is not None,
        "solve_threshold": threshold,
        "solved_at_seconds": rec.solved_at["time"] if rec.solved_at else None,
        "solved_at_learner_step": rec.solved_at["learner_step"] if rec.solved_at else None,
        "final_eval_mean_return": float(np.mean(final)) if final else None,
        "final_eval_episodes": len(final) if final else 0,
        "final_eval_returns": final,
        "final_eval_parameters": which if final else None,
        "final_learner_step": final_step if final_step is not None else
        (rec.evals[-1]["learner_step"] if rec.evals else None),
        "random_policy_return": RANDOM_CARTPOLE_RETURN if cfg.env.startswith("CartPole") else None,
        "mean_actor_return_last_100": float(np.mean(recent)) if recent else None,
        "seconds": elapsed,
        "time_limit": cfg.time_limit,
        "env_steps": rec.env_steps,
        "episodes": len(rec.episodes),
        "inserts": inserts,
        "samples": samples,
        "inserts_per_second": inserts / max(elapsed, 1e-9),
        "samples_per_second": samples / max(elapsed, 1e-9),
        "samples_per_insert": samples / max(1, inserts),
        "restarts": sup.restarts if sup else {"learner": 0, "actors": 0},
        "learner_device": device,
        "evals": rec.evals,
        "replay_info": info,
        "plot": None,
        "log": rec.lines,
        "config": dataclasses.asdict(cfg),
    }
    rundirs.write_json(out / "summary.json", summary)
    if rec.history:
        rec.phase = "writing the plot"
        rec.log(f"writing {out / 'apex.png'} (Ctrl-C skips it)")
        ran, _ = stop.optional(plot, out / "apex.png", rec.history, rec.episodes, rec.evals, threshold,
                               f"Ape-X DQN on Reprise: {cfg.env}, {cfg.actors} actors x {cfg.envs_per_actor} envs")
        if ran:
            summary["plot"] = "apex.png"
        else:
            rec.log(f"plot skipped: stopped by {signal_name(stop.first)}")
        if stop.interrupted and not summary["interrupted"]:  # the first signal came during the plot
            summary.update(interrupted=True, signal=signal_name(stop.first), phase=rec.phase)
        summary["log"] = rec.lines
        rundirs.write_json(out / "summary.json", summary)
    how = {"solved": "solved", "time_limit": "not solved (time limit)", "failed": "failed",
           "interrupted": f"interrupted by {summary['signal']}"}[ended]
    if stop.interrupted and ended != "interrupted":
        how += f", then stopped by {summary['signal']} while {summary['phase']}"
    result = (f"final greedy mean return {summary['final_eval_mean_return']:.1f} over {len(final)} episodes"
              if final else "no final evaluation")
    print(f"{how} after {elapsed:.0f} s: {result}; {rec.env_steps:,} env steps, {inserts:,} inserts, "
          f"{samples:,} samples ({summary['samples_per_insert']:.1f} per insert); restarts {summary['restarts']}")
    print(f"wrote {out / 'summary.json'}" + (f" and {out / 'apex.png'}" if summary["plot"] else ""), flush=True)
    return summary


def preflight(cfg: Config) -> str | None:
    """Why the demo cannot run with ``cfg`` here (an environment it does not support, a
    device this machine lacks), or None."""
    try:
        env_spec(cfg.env)
    except UnsupportedEnv as e:
        return str(e)
    return device_problem(cfg.device)


def main(argv=None) -> int:
    """``reprise demo apex``. Exit status: 0 the run ended (solved or at the time limit), 1 a
    process kept failing, 2 refused (options, environment, device, output directory in use),
    128 + the signal's number when stopped by SIGINT (130) or SIGTERM (143). After such a stop
    the process goes on ignoring the two signals while it exits."""
    return rundirs.demo_main("apex", argv, parse_args, preflight, run)
