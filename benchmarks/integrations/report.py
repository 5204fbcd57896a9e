"""The integrations comparison's markdown (``compare.py``'s summaries as tables)."""

from __future__ import annotations

import statistics

from benchmarks.common.report import machine_lines, md_table, si
from benchmarks.integrations.workloads import ARMS, BATCH, LARGE_CAPACITY

ARM_NAMES = {"sb3": "SB3 ReplayBuffer (default)", "sb3_opt": "SB3 ReplayBuffer (optimize_memory_usage)",
             "reprise": "RepriseReplayBuffer (default sizing)",
             "reprise_mel": "RepriseReplayBuffer (min_episode_length={mel})",
             "reprise_fs": "RepriseReplayBuffer (min_episode_length={mel}, frame_stack=4)"}


def _x(v) -> str:
    return "—" if v is None else f"{v:.2f}x"


def _b(v) -> str:
    return "—" if v is None else f"{v:,.0f}"


def replay_lines(report: dict) -> list[str]:
    out = ["## 1. SB3 replay buffers: memory per stored transition, add and sample(256)", ""]
    for kind, arms in report["summary"]["replay"].items():
        rec = report.get("recordings", {}).get(kind, {})
        cap = next(iter(arms.values()))["capacity"]
        out += [f"### {kind}: {rec.get('obs_dtype', '?')}{rec.get('obs_shape', '?')}, capacity {cap:,} transitions",
                "",
                f"Transitions: {rec.get('steps', '?'):,} recorded steps of {rec.get('env', '?')} (random actions, "
                f"{rec.get('episodes', '?')} episodes, shortest {rec.get('shortest_episode', '?')}), added in a loop "
                f"until the buffer was full and wrapped. Medians of {next(iter(arms.values()))['runs']} processes per "
                "arm. Ratios are against SB3's default buffer (memory: its bytes / the arm's; speed: the arm's "
                "rate / its).",
                ""]
        rows = []
        for arm in ARMS:
            s = arms.get(arm)
            if s is None:
                continue
            rows.append([ARM_NAMES[arm].format(mel=s.get('shortest_episode', '?')), _b(s["reserved_per_transition"]),
                         _b(s.get("rss_per_transition")), _x(s.get("memory_vs_sb3")),
                         si(s["items_per_s"]), _x(s.get("add_vs_sb3")), si(s["samples_per_s"]),
                         _x(s.get("sample_vs_sb3")), f"{s['held']:,}"])
        out += md_table(["arm", "reserved B/transition", "resident B/transition", "memory: SB3 / arm",
                         "add transitions/s", "add vs SB3", f"sample({BATCH}) samples/s", "sample vs SB3", "held"],
                        rows)
        notes = []
        for arm in ("reprise", "reprise_mel", "reprise_fs"):
            s = arms.get(arm)
            if s and s.get("store_rows_per_transition"):
                at = (s.get("reserved_per_transition_at") or {}).get(str(LARGE_CAPACITY))
                sb3 = arms.get("sb3", {}).get("reserved_per_transition")
                text = (f"- {ARM_NAMES[arm].format(mel=s.get('shortest_episode', '?'))}: the store holds "
                        f"{s['store_rows_per_transition']:.2f} rows per transition at this capacity, "
                        f"{_b(s.get('shm_committed_per_transition'))} B/transition of it written")
                if at:
                    text += (f"; at capacity {LARGE_CAPACITY:,} it reserves {_b(at)} B/transition"
                             + (f" (SB3 default / this: {sb3 / at:.2f}x)" if sb3 else ""))
                notes.append(text + ".")
        out += ["", *notes, ""]
    return out


def dqn_lines(report: dict) -> list[str]:
    d = report["summary"]["dqn"]
    if not d:
        return []
    out = ["## 2. SB3 DQN on CartPole-v1: env steps/s of learn()", "",
           "RL Zoo's hyperparameters (100k buffer, 128 gradient steps of 64 every 256 steps), seed 0, CPU; "
           "the model is built before the clock starts.", ""]
    rows = []
    for arm, name in (("sb3", "SB3 ReplayBuffer"), ("reprise", "RepriseReplayBuffer")):
        s = d.get(arm)
        if s:
            rows.append([name, f"{s['steps_per_s']:,.0f}", ", ".join(f"{v:,.0f}" for v in s["runs"]),
                         f"{s['steps']:,}", f"{s['mean_return_last20']:.1f}" if s["mean_return_last20"] else "—"])
    out += md_table(["buffer", "env steps/s (median)", "runs", "steps", "mean return, last 20 episodes"], rows)
    if "ratio" in d:
        out += ["", f"Reprise / SB3: **{d['ratio']:.2f}x**."]
    return out + [""]


def torchrl_lines(report: dict) -> list[str]:
    t = report["summary"]["torchrl"]
    if not any("ratio" in row or "torchrl" in row for row in t.values()):
        return []
    passes = report["config"].get("torchrl_passes", 1)
    out = ["## 3. TorchRL ReplayBuffer: LazyTensorStorage vs RepriseStorage (core workloads)", "",
           f"The core suite's TorchRL workloads (`peers/torchrl_core.py`) and the same with RepriseStorage "
           f"(`integrations/torchrl_reprise.py`), {passes} pass(es) each, alternating; median over every round.", ""]
    rows = []
    for key, row in t.items():
        unit = row.get("unit", "")
        rows.append([key, f"{unit}/s", si(row["torchrl"]) if "torchrl" in row else "n/a",
                     si(row["torchrl-reprise"]) if "torchrl-reprise" in row else "n/a", _x(row.get("ratio"))])
    out += md_table(["workload", "unit", "LazyTensorStorage", "RepriseStorage", "Reprise / Lazy"], rows)
    return out + [""]


def goal_lines(report: dict) -> list[str]:
    if not report["goals"]:
        return []
    rows = [[g["goal"], g["check"], f"{g['value']:.2f}x", "met" if g["met"] else "**missed**"]
            for g in report["goals"]]
    return ["## Goals (issue 33)", "", *md_table(["goal", "check", "measured", "met?"], rows), ""]


def load_lines(report: dict) -> list[str]:
    loads = [s["loadavg_1m_before"] for s in report["systems"].values() if "loadavg_1m_before" in s]
    failed = [f"{n}: {s.get('error')}" for n, s in report["systems"].items() if "error" in s]
    failed += [f"{n} {k}: {e['error']}" for n, s in report["systems"].items()
               for k, e in s.get("results", {}).items() if isinstance(e, dict) and "error" in e]
    out = []
    if loads:
        out.append(f"1-minute load average before each of the {len(loads)} runs: min {min(loads):.2f}, "
                   f"median {statistics.median(loads):.2f}, max {max(loads):.2f} "
                   f"(on {report['host']['cpus']} cores).")
    out += [f"- FAILED {f}" for f in failed]
    return out


def build_markdown(report: dict) -> str:
    vers = {}
    for s in report["systems"].values():
        vers.update(s.get("versions", {}))
    out = [f"# Integrations comparison, {report['date']}" + (" (QUICK: tiny buffers, noisy)" if report["quick"]
                                                             else ""),
           "", f"`{report['command']}`", "", *machine_lines(report),
           "Versions: " + ", ".join(f"{k} {v}" for k, v in sorted(vers.items())) + ".",
           f"torch intra-op threads: {report['config']['torch_threads']} in every process.",
           *load_lines(report), "",
           *goal_lines(report), *replay_lines(report), *dqn_lines(report), *torchrl_lines(report)]
    return "\n".join(out) + "\n"
