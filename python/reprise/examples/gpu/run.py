"""The run: the actor thread, the learner loop on the main thread, evaluations, progress,
``summary.json``; ``run`` and ``main``."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import os
import sys
import threading
import time

import numpy as np

import reprise as rp

from .. import rundirs
from ..devices import device_problem
from ..progress import ProgressLine
from ..stopping import Interrupted, StopSignals, signal_name
from .cartpole import SOLVED_RETURN, greedy_returns
from .config import Config, parse_args
from .dqn import Learner
from .replay import Actor, make_replay
from ..rundirs import write_json

SAMPLE_WAIT_S = 0.5   # a learner's sample waits this long before it checks the actor and the clock
JOIN_S = 30.0         # how long the end of the run waits for the actor thread


def resolve_device(cfg: Config, torch):
    """``(torch device, store device, emulated)``: CUDA when asked for or available, else the
    CPU with Reprise's GPU path emulated (``reprise.torch.emulate_cuda``), so the store is
    still a device store and samples still take the device path."""
    dev = torch.device(cfg.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise rp.errors.InvalidArgument(f"--device {cfg.device}: CUDA is not available here")
        return dev, str(dev), False
    if dev.type != "cpu":
        raise rp.errors.InvalidArgument(f"--device {cfg.device}: expected cuda, cuda:N or cpu")
    return dev, "cuda", True


@contextlib.contextmanager
def emulation(on: bool):
    """``reprise.torch.emulate_cuda(on)`` for the block, the previous setting after it."""
    import reprise.torch as rt
    before = rt.emulated()
    rt.emulate_cuda(on or before)
    try:
        yield
    finally:
        rt.emulate_cuda(before)


class Meter:
    """Counts since the start and since the last report: env steps, learner steps, items
    sampled, training episodes and their returns."""

    def __init__(self, started: float):
        self.started = self.last = started
        self.ended: float | None = None   # when training ended (the final evaluation is not counted)
        self.env_steps = self.learner_steps = self.items = 0
        self.last_env_steps = self.last_items = 0
        self.episodes, self.return_sum = 0, 0.0
        self.window_episodes, self.window_return_sum = 0, 0.0

    def rates(self, now: float) -> tuple[float, float]:
        """``(env steps/s, samples/s)`` since the last call."""
        dt = max(now - self.last, 1e-9)
        rates = ((self.env_steps - self.last_env_steps) / dt, (self.items - self.last_items) / dt)
        self.last, self.last_env_steps, self.last_items = now, self.env_steps, self.items
        return rates

    def take_episodes(self, actor: Actor) -> float | None:
        """Adds the episodes the actor's environments finished; the mean return of those
        since the last call (None when none finished)."""
        n, total = actor.take_returns()
        self.episodes += n
        self.return_sum += total
        self.window_episodes += n
        self.window_return_sum += total
        if self.window_episodes == 0:
            return None
        mean = self.window_return_sum / self.window_episodes
        self.window_episodes, self.window_return_sum = 0, 0.0
        return mean


def evaluate(learner: Learner, cfg: Config, dev, seed: int) -> float:
    """The mean greedy return over ``eval_envs`` fresh environments (one episode each)."""
    return float(np.mean(greedy_returns(learner.net, cfg.eval_envs, dev, seed)))


def train(cfg: Config, learner: Learner, actor: Actor, table, dev, store_device: str, meter: Meter, evals: list,
          show: bool) -> str:
    """The learner loop until the run ends; returns how it ended: ``time_limit``, ``steps``
    or ``actor_failed``. A signal raises ``Interrupted`` out of it."""
    line = ProgressLine("gpu", enabled=show)
    next_eval = meter.started + cfg.eval_every
    try:
        while True:
            now = time.time()
            meter.env_steps = actor.iterations * cfg.envs
            if actor.error is not None:
                return "actor_failed"
            if cfg.steps and meter.env_steps >= cfg.steps:
                return "steps"
            if now - meter.started >= cfg.time_limit:
                return "time_limit"
            if now >= next_eval:
                next_eval = now + cfg.eval_every
                env_rate, sample_rate = meter.rates(now)
                train_return = meter.take_episodes(actor)
                score = evaluate(learner, cfg, dev, cfg.seed + 1000 + len(evals))
                loss = learner.take_loss()
                evals.append({"t": now - meter.started, "env_steps": meter.env_steps,
                              "learner_steps": meter.learner_steps, "eval_return": score,
                              "train_return": train_return, "loss": loss,
                              "env_steps_per_s": env_rate, "samples_per_s": sample_rate})
                train_text = "-" if train_return is None else f"{train_return:.1f}"
                line.log(f"{now - meter.started:6.1f} s  env steps/s {env_rate:10,.0f}  samples/s "
                         f"{sample_rate:10,.0f}  train return {train_text}  eval {score:.1f}")
            fraction = min(1.0, (now - meter.started) / cfg.time_limit)
            try:
                sample = table.sample(cfg.batch_size, timeout=SAMPLE_WAIT_S, device=store_device)
            except rp.errors.Timeout as e:
                # The rate limiter waits for the actor: check it and the clock again. Items
                # drawn before the deadline count as sampled (the table counted them).
                meter.items += 0 if e.partial is None else len(e.partial.keys)
                continue
            priorities = learner.update(sample, beta=cfg.beta + (1.0 - cfg.beta) * fraction)
            if priorities is not None:
                table.update_priorities(sample.keys, priorities)
                if learner.max_priority > actor.priorities[0]:   # new items enter at the largest priority seen
                    actor.priorities = np.full(cfg.envs, learner.max_priority)
            meter.learner_steps += 1
            meter.items += cfg.batch_size
            line.update(fraction, f"{meter.env_steps:,} env steps, {meter.learner_steps:,} learner steps")
    finally:
        line.close()


def summarize(cfg: Config, ended: str, meter: Meter, evals: list, final: float | None, actor: Actor, table,
              dev, emulated: bool, stop: StopSignals) -> dict:
    elapsed = (meter.ended or time.time()) - meter.started
    info = table.info()
    return {
        "ended": ended,
        "interrupted": stop.interrupted,
        "signal": signal_name(stop.first),
        "config": dataclasses.asdict(cfg),
        "device": str(dev),
        "emulated": emulated,
        "env_steps": meter.env_steps,
        "env_steps_per_s": meter.env_steps / elapsed,
        "learner_steps": meter.learner_steps,
        "samples": meter.items,
        "samples_per_s": meter.items / elapsed,
        "train_episodes": meter.episodes,
        "train_mean_return": meter.return_sum / meter.episodes if meter.episodes else None,
        "evals": evals,
        "final_eval_return": final,
        "solved": final is not None and final >= SOLVED_RETURN,
        "items_dropped_at_stop": actor.dropped,
        "table": {k: info[k] for k in ("size", "num_inserts", "num_samples", "num_evictions",
                                       "num_store_evictions") if k in info},
        "elapsed_s": elapsed,
    }


def run(cfg: Config, stop: StopSignals | None = None, show: bool = True) -> dict:
    """Runs the demo; returns the summary (also written to ``<out>/summary.json``). ``stop``:
    the signal handlers ``main`` installed; without them ``run`` installs its own. A signal
    ends the run early, with a summary (``ended: interrupted``)."""
    if stop is None:
        with StopSignals() as own:
            return run(cfg, own, show)
    import torch
    dev, store_device, emulated = resolve_device(cfg, torch)
    cfg = cfg.for_device(not emulated)
    threads = torch.get_num_threads()
    if emulated:   # two threads share the cores: the actor's and the learner's
        torch.set_num_threads(max(1, min(4, (os.cpu_count() or 1) // 2)))
    try:
        with emulation(emulated):
            return _run(cfg, dev, store_device, emulated, stop, show)
    finally:
        torch.set_num_threads(threads)


def _run(cfg: Config, dev, store_device: str, emulated: bool, stop: StopSignals, show: bool) -> dict:
    with stop.hold():   # the directory, the store, the learner and the actor are made, or none
        run_dir = rundirs.claim("gpu", cfg.out)
        cfg = dataclasses.replace(cfg, out=str(run_dir.path))
        store = None
        try:
            store, table = make_replay(cfg, store_device)
            learner = Learner(cfg, dev, cfg.seed)
            actor = Actor(cfg, table, learner.policy, learner.lock, dev, cfg.seed)
        except BaseException:
            if store is not None:
                store.close()
            run_dir.release()
            raise
    thread = None
    halt = threading.Event()
    meter = Meter(time.time())
    evals: list = []
    ended = "interrupted"
    try:
        try:
            thread = threading.Thread(target=actor.run, args=(halt,), name="reprise-gpu-actor", daemon=True)
            if show:
                print(f"reprise demo gpu: {cfg.envs} CartPole environments on {dev}"
                      f"{' (GPU path emulated on the CPU)' if emulated else ''}, batch {cfg.batch_size}, "
                      f"{cfg.time_limit:g} s; writing {run_dir.path}", flush=True)
            thread.start()
            with contextlib.suppress(Interrupted):
                ended = train(cfg, learner, actor, table, dev, store_device, meter, evals, show)
        finally:
            stop.stopping()
            halt.set()
            if thread is not None:
                thread.join(JOIN_S)
            meter.ended = time.time()
        meter.env_steps = actor.iterations * cfg.envs   # the actor has stopped: every step it took
        meter.take_episodes(actor)                      # and every episode it finished
        final = None
        if ended != "actor_failed":
            _, final = stop.optional(evaluate, learner, cfg, dev, cfg.seed + 999_999)
        summary = summarize(cfg, ended, meter, evals, final, actor, table, dev, emulated, stop)
        if actor.error is not None:
            summary["actor_error"] = f"{type(actor.error).__name__}: {actor.error}"
        write_json(run_dir.path / "summary.json", summary)
        if show:
            final_text = "skipped" if final is None else f"{final:.1f}"
            head = f"stopped by {summary['signal']}" if stop.interrupted else ended
            print(f"{head}: {summary['env_steps']:,} env steps ({summary['env_steps_per_s']:,.0f}/s), "
                  f"{summary['samples']:,} items sampled ({summary['samples_per_s']:,.0f}/s), final greedy "
                  f"return {final_text}; wrote {run_dir.path / 'summary.json'}", flush=True)
        return summary
    finally:
        actor.close()
        store.close()
        run_dir.release()


def main(argv=None) -> int:
    """``reprise demo gpu``. Exit status: 0 the run ended, 1 the actor failed, 2 refused
    (options, missing packages, device, output directory in use), 130 / 143 stopped by
    SIGINT / SIGTERM (the summary is still written)."""
    with StopSignals(quiet_after=True) as stop:
        try:
            cfg = parse_args(sys.argv[1:] if argv is None else argv)
            if importlib.util.find_spec("torch") is None:
                print("reprise demo gpu: needs torch: pip install 'reprise[demo]'", file=sys.stderr)
                return 2
            problem = device_problem(cfg.device)
            if problem is not None:
                print(f"reprise demo gpu: {problem}", file=sys.stderr)
                return 2
            summary = run(cfg, stop)
        except Interrupted as e:
            print(f"reprise demo gpu: stopped by {e.name} before the run began; nothing was written",
                  file=sys.stderr)
            return e.exit_code
        except (rp.errors.RepriseError, rundirs.DirectoryInUse) as e:
            print(f"reprise demo gpu: {e}", file=sys.stderr)
            return 2
        if summary.get("actor_error"):
            print(f"reprise demo gpu: the actor failed: {summary['actor_error']}", file=sys.stderr)
            return 1
    if stop.interrupted:
        return stop.exit_code
    return 0


__all__ = ["main", "resolve_device", "run"]
