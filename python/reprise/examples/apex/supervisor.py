"""The supervisor: owns and serves the tables, runs the actor and learner processes (restarting
any that die), shows progress, and at the end evaluates the newest parameters and writes
``summary.json`` and ``apex.png``. ``run(cfg)`` is the whole demo; ``main(argv)`` the command."""

from __future__ import annotations

import dataclasses
import json
import multiprocessing as mp
import os
import sys
import time

from pathlib import Path

import numpy as np

import reprise as rp

from .actor import actor_main
from .config import Config, parse_args, solve_threshold
from .envs import env_spec, evaluate
from .learner import learner_main
from .model import load_flat_parameters, make_network, num_parameters
from .plots import plot
from .tables import drain, make_tables

RANDOM_CARTPOLE_RETURN = 22.0  # mean return of a uniformly random policy on CartPole-v1


class Supervisor:
    """Starts the learner and the actors as processes, restarts any that die."""

    def __init__(self, cfg: Config, address: str, started: float):
        self.cfg, self.address, self.started = cfg, address, started
        self.ctx = mp.get_context("spawn")
        self.procs: dict[str, mp.Process] = {}
        self.restarts = {"learner": 0, "actors": 0}
        self.launches = 0

    def start(self, name: str):
        self.launches += 1
        seed = self.cfg.seed * 7919 + self.launches
        if name == "learner":
            p = self.ctx.Process(target=learner_main, args=(self.cfg, self.address, seed, self.started),
                                 name="reprise-apex-learner", daemon=True)
        else:
            actor_id = int(name.split("-")[1])
            p = self.ctx.Process(target=actor_main, args=(self.cfg, actor_id, self.address, seed),
                                 name=f"reprise-apex-{name}", daemon=True)
        p.start()
        self.procs[name] = p

    def start_all(self):
        self.start("learner")
        for i in range(self.cfg.actors):
            self.start(f"actor-{i}")

    def check(self, log) -> None:
        for name, p in list(self.procs.items()):
            if p.exitcode is not None:
                log(f"{name} (pid {p.pid}) exited with {p.exitcode}: restarting it")
                self.restarts["learner" if name == "learner" else "actors"] += 1
                self.start(name)

    def pids(self) -> dict:
        return {name: p.pid for name, p in self.procs.items()}

    def stop(self):
        for p in self.procs.values():
            if p.exitcode is None:
                p.terminate()
        deadline = time.monotonic() + 5.0
        for p in self.procs.values():
            p.join(max(0.0, deadline - time.monotonic()))
            if p.exitcode is None:
                p.kill()
                p.join()


def write_json(path: Path, value) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(value, indent=2))
    os.replace(tmp, path)


def run(cfg: Config) -> dict:
    """Runs the demo; returns the summary (also written to ``<out>/summary.json``)."""
    import torch
    cfg = cfg.resolved()
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    spec = env_spec(cfg.env)
    threshold = solve_threshold(cfg, spec)
    tables = make_tables(cfg, spec, num_parameters(spec, cfg.hidden))
    replay, params, episodes_q, evals_q = tables
    server = rp.Server(tables, name=f"apex-{os.getpid()}")
    started = time.time()
    sup = Supervisor(cfg, server.local_address, started)
    history, episodes, evals, log_lines = [], [], [], []
    solved_at = None
    env_steps = 0
    interactive = sys.stderr.isatty()
    from tqdm import tqdm
    bar = tqdm(total=round(cfg.time_limit), unit="s", disable=not interactive, dynamic_ncols=True,
               bar_format="{desc} {percentage:3.0f}%|{bar}| {n:.0f}/{total:.0f} s {postfix}",
               desc=f"apex {cfg.env}")

    def log(msg):
        line = f"[{time.time() - started:6.1f}s] {msg}"
        log_lines.append(line)
        (tqdm.write if interactive else print)(line, file=sys.stderr)

    device = cfg.device or ("cuda" if torch.cuda.is_available() else "cpu")
    log(f"serving replay, params, episodes, evals at {server.local_address}; "
        f"{cfg.actors} actors x {cfg.envs_per_actor} envs, learner on {device}")
    sup.start_all()
    last_print = 0.0
    try:
        while True:
            time.sleep(0.5)
            now = time.time() - started
            got = drain(episodes_q)
            for ret, length in zip(got.get("episode_return", []), got.get("episode_length", [])):
                episodes.append((now, float(ret)))
                env_steps += int(length)
            got = drain(evals_q)
            for i in range(len(got.get("mean_return", []))):
                e = {"time": now, "learner_step": int(got["learner_step"][i]),
                     "mean_return": float(got["mean_return"][i]), "episodes": int(got["episodes"][i]),
                     "loss": float(got["loss"][i])}
                evals.append(e)
                if e["episodes"] >= cfg.eval_episodes and threshold is not None and e["mean_return"] >= threshold:
                    solved_at = e
            info = replay.info()
            history.append({"time": now, "inserts": info["num_inserts"], "samples": info["num_samples"],
                            "env_steps": env_steps})
            sup.check(log)
            recent = [r for _, r in episodes[-100:]]
            window = [h for h in history if h["time"] >= now - 5.0]
            rates = {k: (window[-1][k] - window[0][k]) / max(1e-9, window[-1]["time"] - window[0]["time"])
                     for k in ("inserts", "samples", "env_steps")} if len(window) > 1 else {}
            status = {
                "time": now, "pids": sup.pids(), "restarts": sup.restarts, "env_steps": env_steps,
                "inserts": info["num_inserts"], "samples": info["num_samples"], "episodes": len(episodes),
                "learner_step": evals[-1]["learner_step"] if evals else 0,
                "mean_actor_return": float(np.mean(recent)) if recent else None,
                "last_eval": evals[-1]["mean_return"] if evals else None,
            }
            write_json(out / "status.json", status)
            if rates:
                postfix = (f"env {rates['env_steps']:,.0f}/s ins {rates['inserts']:,.0f}/s "
                           f"smp {rates['samples']:,.0f}/s return {status['mean_actor_return'] or 0:.0f} "
                           f"eval {status['last_eval'] if status['last_eval'] is not None else float('nan'):.0f}")
                bar.set_postfix_str(postfix, refresh=False)
                if not interactive and now - last_print >= 10.0:
                    last_print = now
                    print(f"[{now:6.1f}s] {postfix}", file=sys.stderr, flush=True)
            bar.update(min(round(now), bar.total) - bar.n)
            if solved_at is not None:
                log(f"solved: greedy mean return {solved_at['mean_return']:.1f} over {solved_at['episodes']} "
                    f"episodes at learner step {solved_at['learner_step']}")
                break
            if now >= cfg.time_limit:
                log(f"time limit ({cfg.time_limit:g} s) reached")
                break
    except KeyboardInterrupt:
        log("interrupted")
    finally:
        bar.close()
        sup.stop()
    elapsed = time.time() - started

    # The final evaluation: the newest published parameters, greedy, in this process.
    net = make_network(spec, cfg.hidden)
    p = params.sample(1, timeout=0)
    load_flat_parameters(net, p.data["weights"][0, 0])
    net.eval()
    final = evaluate(net, cfg, cfg.eval_episodes, seed=123_456)
    info = replay.info()
    recent = [r for _, r in episodes[-100:]]
    summary = {
        "env": cfg.env,
        "solved": solved_at is not None,
        "solve_threshold": threshold,
        "solved_at_seconds": solved_at["time"] if solved_at else None,
        "solved_at_learner_step": solved_at["learner_step"] if solved_at else None,
        "final_eval_mean_return": float(np.mean(final)),
        "final_eval_episodes": len(final),
        "final_eval_returns": final,
        "final_learner_step": int(p.data["learner_step"][0, 0]),
        "random_policy_return": RANDOM_CARTPOLE_RETURN if cfg.env.startswith("CartPole") else None,
        "mean_actor_return_last_100": float(np.mean(recent)) if recent else None,
        "seconds": elapsed,
        "env_steps": env_steps,
        "episodes": len(episodes),
        "inserts": info["num_inserts"],
        "samples": info["num_samples"],
        "inserts_per_second": info["num_inserts"] / elapsed,
        "samples_per_second": info["num_samples"] / elapsed,
        "samples_per_insert": info["num_samples"] / max(1, info["num_inserts"]),
        "restarts": sup.restarts,
        "learner_device": device,
        "evals": evals,
        "replay_info": info,
        "log": log_lines,
        "config": dataclasses.asdict(cfg),
    }
    write_json(out / "summary.json", summary)
    plot(out / "apex.png", history, episodes, evals, threshold,
         f"Ape-X DQN on Reprise: {cfg.env}, {cfg.actors} actors x {cfg.envs_per_actor} envs")
    server.stop()
    for s in {id(t.store): t.store for t in tables}.values():
        s.close()
    print(f"{'solved' if summary['solved'] else 'not solved'} in {elapsed:.0f} s: final greedy mean return "
          f"{summary['final_eval_mean_return']:.1f} over {len(final)} episodes; {env_steps:,} env steps, "
          f"{info['num_inserts']:,} inserts, {info['num_samples']:,} samples "
          f"({summary['samples_per_insert']:.1f} per insert); restarts {sup.restarts}")
    print(f"wrote {out / 'summary.json'} and {out / 'apex.png'}")
    return summary


def main(argv=None) -> int:
    cfg = parse_args(sys.argv[1:] if argv is None else argv)
    summary = run(cfg)
    return 0 if (summary["solved"] or cfg.smoke or summary["final_eval_mean_return"] > 0) else 1
