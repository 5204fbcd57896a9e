"""Integrations comparison (issue 33): Reprise inside Stable-Baselines3 and TorchRL against the
buffers it replaces, on this machine, in one run.

    python -m benchmarks.integrations.compare            # ~7 minutes on 2 cores
    python -m benchmarks.integrations.compare --quick    # smoke test (~40 s); numbers are noise

1. SB3 replay buffers (``sb3_replay.py``, one process per arm and repeat, arms in rotating
   order): SB3's ``ReplayBuffer`` as DQN builds it, with ``optimize_memory_usage=True``, and
   ``RepriseReplayBuffer`` (default sizing, and told the shortest episode), on recorded
   CartPole-v1 (float32[4]) and Pong (uint8[4,84,84] stacks through SB3's ``AtariWrapper``;
   random frames without ``ale-py``) transitions: bytes per stored transition (reserved and
   resident), ``add`` transitions/s, ``sample(256)`` samples/s as torch tensors.
2. SB3 DQN on CartPole-v1 (``dqn_cartpole.py``): env steps/s of ``learn`` with SB3's buffer
   and with the integration, same seed, arms alternating.
3. TorchRL (``torchrl_reprise.py`` against the core suite's ``peers/torchrl_core.py``, both
   in this python): ``ReplayBuffer`` over ``LazyTensorStorage`` vs ``RepriseStorage`` on the
   core workloads (batched insert of 256 into a full buffer, uniform sample of 256, at 400 B
   and 4 KB; prioritized sample + update with ``PrioritizedSampler`` vs
   ``ReprisePrioritizedSampler``), passes alternating, medians over every round.

Every measuring process runs the same python (``sys.executable``) with ``torch_threads``
intra-op threads. Writes ``benchmarks/out/integrations-<date>.json`` (every run's full
output, the summaries, the goals) and ``.md`` (``report.py``); ``--out-dir`` elsewhere.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile

from benchmarks.common.driver import OUT, command_line, run_system, start_report, write_outputs
from benchmarks.integrations import workloads as wl
from benchmarks.integrations.report import build_markdown

PARTS = ["replay", "dqn", "torchrl"]
TORCHRL_SIDES = [("torchrl", "benchmarks.peers.torchrl_core"),
                 ("torchrl-reprise", "benchmarks.integrations.torchrl_reprise")]


def _echo(line: str) -> bool:
    return line.startswith(("[replay:", "[dqn:", "[torchrl")) or "Traceback" in line or "Error" in line


def _run(report: dict, stem: str, args, name: str, module: str, extra: list[str], budget: float) -> dict:
    sys_args = ["--budget", str(budget)] + (["--quick"] if args.quick else []) + extra
    load = os.getloadavg()[0]
    result = run_system(name, sys.executable, module, sys_args, timeout=budget + 180,
                        log_path=os.path.join(args.out_dir, f"{stem}-{name.replace(':', '-')}.log"),
                        echo=_echo)
    result["loadavg_1m_before"] = round(load, 2)
    report["systems"][name] = result
    return result


def _rotated(items: list, r: int) -> list:
    return items[r % len(items):] + items[:r % len(items)]


# --- the parts ------------------------------------------------------------------------------
def record_all(cfg, data_dir: str) -> dict:
    """Record each observation kind once (``workloads.record``) into ``data_dir``."""
    out = {}
    for kind in wl.OBS_KINDS:
        synthetic = kind == "atari" and not wl.atari_available()
        print(f"recording {cfg.record_steps[kind]} steps of {kind}"
              f"{' (synthetic: ale-py is not installed)' if synthetic else ''} ...", file=sys.stderr, flush=True)
        rec = wl.record(kind, cfg.record_steps[kind], synthetic=synthetic)
        wl.save(wl.data_path(data_dir, kind), rec)
        lengths = wl.episode_lengths(rec)
        out[kind] = dict(env="random uint8[4,84,84] frames" if synthetic else wl.ENV_IDS[kind],
                         synthetic=synthetic, steps=len(rec["action"]), episodes=len(lengths),
                         shortest_episode=min(lengths), longest_episode=max(lengths),
                         obs_shape=list(rec["obs"].shape[1:]), obs_dtype=str(rec["obs"].dtype))
    return out


def run_replay(report: dict, stem: str, args, cfg, data_dir: str) -> None:
    for r in range(cfg.replay_repeats):
        for arm in _rotated(wl.ARMS, r):
            _run(report, stem, args, f"replay:{arm}#{r + 1}", "benchmarks.integrations.sb3_replay",
                 ["--arm", arm, "--data", data_dir], cfg.budget_seconds)


def run_dqn(report: dict, stem: str, args, cfg) -> None:
    for r in range(cfg.dqn_repeats):
        for arm in _rotated(wl.DQN_ARMS, r):
            _run(report, stem, args, f"dqn:{arm}#{r + 1}", "benchmarks.integrations.dqn_cartpole",
                 ["--arm", arm, "--seed", "0"], cfg.budget_seconds)


def run_torchrl(report: dict, stem: str, args, cfg) -> None:
    os.environ["TORCHRL_THREADS"] = str(cfg.torch_threads)  # both sides, through the environment
    for p in range(cfg.torchrl_passes):
        for name, module in _rotated(TORCHRL_SIDES, p):
            _run(report, stem, args, f"{name}#{p + 1}", module, ["--only", wl.TORCHRL_ONLY], cfg.budget_seconds)


# --- summaries -------------------------------------------------------------------------------
def _runs(report: dict, prefix: str) -> list[dict]:
    """The results of every run named ``prefix#N``."""
    return [s["results"] for name, s in report["systems"].items()
            if name.split("#")[0] == prefix and "results" in s]


def _median(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


MEMORY = ["reserved_per_transition", "rss_per_transition", "shm_committed_per_transition",
          "store_rows_per_transition"]


def summarize_replay(report: dict) -> dict:
    """{kind: {arm: medians over repeats, and ratios against SB3's default buffer}}."""
    out = {}
    for kind in wl.OBS_KINDS:
        arms = {}
        for arm in wl.ARMS:
            entries = [r[kind] for r in _runs(report, f"replay:{arm}") if kind in r and "error" not in r[kind]]
            if not entries:
                continue
            first = entries[0]
            s = {k: _median([e.get(k) for e in entries]) for k in ["items_per_s", "samples_per_s", *MEMORY]}
            s.update(runs=len(entries), path=first["path"], capacity=first["capacity"], held=first["held"],
                     shortest_episode=first.get("shortest_episode"),
                     reserved_per_transition_at=first.get("reserved_per_transition_at"))
            arms[arm] = s
        base = arms.get("sb3")
        for arm, s in arms.items():
            if base:
                s["memory_vs_sb3"] = base["reserved_per_transition"] / s["reserved_per_transition"]
                if base.get("rss_per_transition") and s.get("rss_per_transition"):
                    s["rss_memory_vs_sb3"] = base["rss_per_transition"] / s["rss_per_transition"]
                s["add_vs_sb3"] = s["items_per_s"] / base["items_per_s"]
                s["sample_vs_sb3"] = s["samples_per_s"] / base["samples_per_s"]
            if "sb3_opt" in arms:
                s["memory_vs_sb3_opt"] = arms["sb3_opt"]["reserved_per_transition"] / s["reserved_per_transition"]
        if arms:
            out[kind] = arms
    return out


def summarize_dqn(report: dict) -> dict:
    out = {}
    for arm in wl.DQN_ARMS:
        runs = [r["dqn_cartpole"] for r in _runs(report, f"dqn:{arm}") if "steps_per_s" in r.get("dqn_cartpole", {})]
        if runs:
            out[arm] = dict(steps_per_s=_median([r["steps_per_s"] for r in runs]),
                            runs=[round(r["steps_per_s"], 1) for r in runs], steps=runs[0]["steps"],
                            mean_return_last20=_median([r["mean_return_last20"] for r in runs]),
                            path=runs[0]["path"])
    if "sb3" in out and "reprise" in out:
        out["ratio"] = out["reprise"]["steps_per_s"] / out["sb3"]["steps_per_s"]
    return out


def summarize_torchrl(report: dict) -> dict:
    """{workload: {side: median over every round of every pass}, ratio}."""
    out = {}
    for key in wl.TORCHRL_ONLY.split(","):
        row = {}
        for side, _ in TORCHRL_SIDES:
            entries = [r[key] for r in _runs(report, side) if key in r and "rounds" in r[key]]
            if entries:
                unit = next(u for u in ("items", "samples", "rounds") if f"{u}_per_s" in entries[0])
                row[side] = _median([x for e in entries for x in e["rounds"]])
                row["unit"] = unit
                row[f"{side}_path"] = entries[0]["path"]
        if "torchrl" in row and "torchrl-reprise" in row:
            row["ratio"] = row["torchrl-reprise"] / row["torchrl"]
        out[key] = row
    return out


def goals(summary: dict) -> list[dict]:
    """The issue's goals, each check with its number: the integration never slower than the
    buffer it replaces (ratio >= 1), >= 2x less memory per Atari transition than SB3's default."""
    out = []
    for kind, arms in summary.get("replay", {}).items():
        for arm in ("reprise", "reprise_mel", "reprise_fs"):
            s = arms.get(arm)
            if not s or "add_vs_sb3" not in s:
                continue
            for what in ("add", "sample"):
                r = s[f"{what}_vs_sb3"]
                out.append(dict(goal="never slower", check=f"{kind} {what}: {arm} / SB3 default", value=r,
                                met=r >= 1.0))
            if kind == "atari":
                r = s["memory_vs_sb3"]
                out.append(dict(goal=">= 2x less memory", check=f"atari reserved B/transition: SB3 default / {arm} "
                                f"(capacity {s['capacity']})", value=r, met=r >= 2.0))
                at = (s.get("reserved_per_transition_at") or {}).get(str(wl.LARGE_CAPACITY))
                if at:
                    r = arms["sb3"]["reserved_per_transition"] / at
                    out.append(dict(goal=">= 2x less memory", check=f"atari reserved B/transition: SB3 default / "
                                    f"{arm} (capacity {wl.LARGE_CAPACITY:,})", value=r, met=r >= 2.0))
                if "rss_memory_vs_sb3" in s:
                    r = s["rss_memory_vs_sb3"]
                    out.append(dict(goal=">= 2x less memory", check=f"atari resident B/transition: SB3 default / "
                                    f"{arm} (capacity {s['capacity']})", value=r, met=r >= 2.0))
    if "ratio" in summary.get("dqn", {}):
        r = summary["dqn"]["ratio"]
        out.append(dict(goal="never slower", check="DQN CartPole env steps/s: Reprise / SB3", value=r, met=r >= 1.0))
    for key, row in summary.get("torchrl", {}).items():
        if "ratio" in row:
            out.append(dict(goal="never slower", check=f"TorchRL {key}: RepriseStorage / LazyTensorStorage",
                            value=row["ratio"], met=row["ratio"] >= 1.0))
    return out


# --- main ------------------------------------------------------------------------------------
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny buffers, short runs: a smoke test, numbers are noise")
    ap.add_argument("--parts", default=",".join(PARTS), help="comma-separated subset of " + ",".join(PARTS))
    ap.add_argument("--out-dir", default=OUT,
                    help="where the .json, .md and .log files go (default benchmarks/out)")
    args = ap.parse_args()
    parts = [p for p in args.parts.split(",") if p]
    if set(parts) - set(PARTS):
        ap.error(f"unknown parts {sorted(set(parts) - set(PARTS))}")
    args.out_dir = os.path.abspath(args.out_dir)
    cfg = wl.make_config(args.quick, None)
    stem, report = start_report("integrations", args.quick, args.out_dir,
                                command=command_line("benchmarks.integrations.compare"), parts=parts)
    report["config"] = cfg.as_dict()
    data_dir = tempfile.mkdtemp(prefix="reprise-integrations-")
    try:
        if "replay" in parts:
            report["recordings"] = record_all(cfg, data_dir)
            run_replay(report, stem, args, cfg, data_dir)
        if "dqn" in parts:
            run_dqn(report, stem, args, cfg)
        if "torchrl" in parts:
            run_torchrl(report, stem, args, cfg)
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)
    report["summary"] = dict(replay=summarize_replay(report), dqn=summarize_dqn(report),
                             torchrl=summarize_torchrl(report))
    report["goals"] = goals(report["summary"])
    write_outputs(args.out_dir, stem, report, build_markdown(report))


if __name__ == "__main__":
    main()
