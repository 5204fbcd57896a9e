"""Async-RL comparison (issue 34): asynchronous LLM post-training data, Reprise against
TorchRL's LLM replay composition, on this machine, in one run.

    python -m benchmarks.async_rl.compare            # ~1.5 minutes on 2 cores
    python -m benchmarks.async_rl.compare --quick    # smoke test (~12 s); numbers are noise

Tokens (int32 token, float32 logprob, bool mask) in sequences of 256-16,384 tokens
(log-uniform, seed 0), inserted as GRPO groups of 8 with per-item version, reward and
group attributes (``workloads.py``). Three workloads, tokens/s each, and the Reprise /
TorchRL ratio:

1. ``insert``: ~4M tokens (128 groups; 16 in ``--quick``) into an emptied buffer.
2. ``sample_pack``: draw 65,536 tokens' worth of sequences and pack them into the varlen
   layout (``data[f]`` [total], ``cu_seqlens`` int32[n + 1], ``position_ids``), repeated.
   The issue's goal: Reprise >= 3x TorchRL here.
3. ``staleness``: the same with ``max_staleness`` = 2, the version advancing every 4
   draws and 2 new groups of the new version inserted each time.

Reprise (``reprise_async.py``): ``Table(attributes=..., max_staleness=...)``, a writer's
``extend`` + ``create_item(attributes=...)`` per sequence, ``sample(tokens=65_536)`` +
``packed()``, ``set_version``. TorchRL (``torchrl_async.py``): ``ReplayBuffer`` over
``LazyStackStorage`` as TorchRL's GRPO example builds it, one TensorDict per sequence, a
fixed draw of floor(65,536 / mean length) items (TorchRL has no token budget) packed
with ``torch.cat``; ``StalenessAwareSampler`` for 3. Extra TorchRL rows, each marked:
``insert[prebuilt]`` (TensorDicts built before the clock), ``sample_pack[groups]``
(``PromptGroupSampler``: whole groups, which Reprise cannot do this session: it draws
items), ``staleness[max_size]`` (storage of 100,000 items like Reprise's table instead of
the staleness window). And ``sample_pack[first]`` on both sides: the same draw as the very
first workload of a fresh process, where the C allocator has not yet grown its heap and a
draw's new output buffers page-fault (the other rows run after ``insert``). The README
section "Async RL" says more.

Both sides run in this python (``sys.executable``), each in a fresh process per pass,
passes alternating which goes first; each number is the median over every round of every
pass. torchrl missing: its side is skipped (``== torchrl: SKIPPED``). Writes
``benchmarks/out/async_rl-<date>.json`` and ``.md`` (``--out-dir`` elsewhere).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys

from benchmarks.async_rl import workloads as wl
from benchmarks.common.driver import OUT, command_line, run_system, start_report, write_outputs
from benchmarks.common.report import machine_lines, md_table, si

SYSTEMS = [("reprise", "benchmarks.async_rl.reprise_async"), ("torchrl", "benchmarks.async_rl.torchrl_async")]
# (row key, Reprise's key, TorchRL's key, what the row is)
ROWS = [("insert", "insert", "insert", "insert groups of 8 with attributes"),
        ("sample_pack", "sample_pack", "sample_pack", "draw 65,536 tokens + pack (varlen)"),
        ("staleness", "staleness", "staleness", "draw + pack, max_staleness=2, version moving, inserting"),
        ("sample_pack[first]", "sample_pack[first]", "sample_pack[first]",
         "extra: sample_pack first thing in a fresh process (allocator not yet warm)"),
        ("insert[prebuilt]", "insert", "insert[prebuilt]", "extra: TorchRL's TensorDicts built before the clock"),
        ("sample_pack[groups]", "sample_pack[groups]", "sample_pack[groups]",
         "two whole GRPO groups of 8 per draw (group_size=8; TorchRL PromptGroupSampler)"),
        ("staleness[max_size]", "staleness", "staleness[max_size]",
         "extra: TorchRL storage of 100,000 items (stale items pile up)")]
GOAL = ("sample_pack", 3.0)  # the goal: Reprise >= 3x TorchRL tokens/s on sample + pack
BUSY_LOAD = 1.5


def _echo(line: str) -> bool:
    return line.startswith(("[reprise", "[torchrl")) and ("FAILED" in line or "skipped" in line) \
        or "Traceback" in line or "Error" in line


def _rotated(items: list, r: int) -> list:
    return items[r % len(items):] + items[:r % len(items)]


def torchrl_missing(python: str) -> str | None:
    for mod in ("torch", "tensordict", "torchrl"):
        if importlib.util.find_spec(mod) is None:
            return f"{mod} is not installed in {python} (pip install torchrl)"
    return None


def run_all(report: dict, stem: str, args, cfg, systems: list[str]) -> None:
    why_not = {"torchrl": torchrl_missing(sys.executable)}
    for name in systems:
        if why_not.get(name):
            print(f"\n== {name}: SKIPPED: {why_not[name]}", file=sys.stderr, flush=True)
            report["systems"][name] = {"skipped": why_not[name]}
    todo = [(n, m) for n, m in SYSTEMS if n in systems and not why_not.get(n)]
    for p in range(cfg.passes):
        for name, module in _rotated(todo, p):
            sys_args = ["--budget", str(cfg.budget_seconds)] + (["--quick"] if args.quick else [])
            if args.only:
                sys_args += ["--only", args.only]
            load = os.getloadavg()[0]
            result = run_system(f"{name}#{p + 1}", sys.executable, module, sys_args,
                                timeout=cfg.budget_seconds + 120,
                                log_path=os.path.join(args.out_dir, f"{stem}-{name}#{p + 1}.log"), echo=_echo)
            result["loadavg_1m_before"] = round(load, 2)
            report["systems"][f"{name}#{p + 1}"] = result


# --- summaries -------------------------------------------------------------------------------------
def _entries(report: dict, system: str, key: str) -> list[dict]:
    return [s["results"][key] for n, s in report["systems"].items()
            if n.split("#")[0] == system and key in s.get("results", {})]


def summarize_entry(entries: list[dict]) -> dict | None:
    good = [e for e in entries if "tokens_per_s" in e]
    if not good:
        bad = next((e for e in entries), None)
        return None if bad is None else {k: v for k, v in bad.items() if k in ("error", "skipped", "unsupported")}
    rounds = [r for e in good for r in e["rounds"]]
    out = {"tokens_per_s": statistics.median(rounds), "passes": len(good), "rounds": len(rounds),
           "path": good[0]["path"]}
    for k in ("tokens_per_call", "items_per_call", "us_per_call", "cold_tokens_per_s", "minor_faults_per_call"):
        if k in good[0]:
            out[k] = statistics.median([e[k] for e in good])
    for k in ("stored_items_at_end", "final_version", "stale_removed", "stale_dropped", "items_per_draw"):
        if k in good[0]:
            out[k] = [e.get(k) for e in good]
    return out


def summarize(report: dict) -> dict:
    out = {}
    for row, rkey, tkey, what in ROWS:
        r = summarize_entry(_entries(report, "reprise", rkey)) if rkey else None
        t = summarize_entry(_entries(report, "torchrl", tkey))
        s = {"what": what, "reprise_key": rkey, "torchrl_key": tkey, "reprise": r, "torchrl": t}
        if r and t and "tokens_per_s" in r and "tokens_per_s" in t:
            s["ratio"] = r["tokens_per_s"] / t["tokens_per_s"]
        out[row] = s
    return out


def goals(summary: dict) -> list[dict]:
    row, target = GOAL
    s = summary.get(row, {})
    if "ratio" not in s:
        return []
    return [dict(goal=f">= {target:g}x TorchRL tokens/s", check=f"{row}: Reprise / TorchRL", value=s["ratio"],
                 met=s["ratio"] >= target)]


# --- markdown --------------------------------------------------------------------------------------
def _rate(e: dict | None) -> str:
    if e is None:
        return "n/a"
    if "tokens_per_s" not in e:
        return "cannot" if "unsupported" in e else ("skipped" if "skipped" in e else "error")
    return si(e["tokens_per_s"])


def _per_draw(e: dict | None) -> str:
    if not e or "tokens_per_call" not in e:
        return "—"
    return (f"{e['tokens_per_call']:,.0f} / {e['items_per_call']:.1f} / {e['us_per_call']:,.0f}"
            f" / {e['minor_faults_per_call']:,.0f}")


def build_markdown(report: dict) -> str:
    cfg = report["config"]
    summ = report["summary"]
    vers = {}
    for s in report["systems"].values():
        vers.update({k: v for k, v in s.get("versions", {}).items() if k != "reprise_module"})
    loads = [s["loadavg_1m_before"] for s in report["systems"].values() if "loadavg_1m_before" in s]
    seq = report.get("sequences", {})
    out = [f"# Async RL comparison (issue 34), {report['date']}"
           + (" (QUICK: small buffer, short rounds, noisy)" if report["quick"] else ""), "",
           f"`{report['command']}`", "", *machine_lines(report),
           "Versions: " + ", ".join(f"{k} {v}" for k, v in sorted(vers.items())) + ".",
           f"torch intra-op threads: {cfg['torch_threads']}.",
           f"Sequences: {seq.get('sequences', '?')} in {seq.get('groups', '?')} groups of {cfg['group_size']}, "
           f"{seq.get('tokens', 0):,} tokens, lengths {seq.get('min_length', '?')}-{seq.get('max_length', '?')} "
           f"(mean {seq.get('mean_length', '?')}); token budget {cfg['token_budget']:,}; "
           f"{cfg['passes']} pass(es) per system, {cfg['rounds']} rounds of {cfg['round_seconds']} s per sample "
           f"workload, {cfg['insert_repeats']} insert passes; medians over every round of every pass."]
    if loads:
        out.append(f"1-minute load average before each of the {len(loads)} runs: min {min(loads):.2f}, "
                   f"median {statistics.median(loads):.2f}, max {max(loads):.2f} (on {report['host']['cpus']} cores)"
                   + (" — **busy machine: numbers unreliable**" if max(loads) > BUSY_LOAD else "") + ".")
    for n, s in report["systems"].items():
        if "results" not in s:
            out.append(f"- {n}: not run: {s.get('skipped') or s.get('error')}")
        for k, e in s.get("results", {}).items():
            if isinstance(e, dict) and "error" in e:
                out.append(f"- FAILED {n} {k}: {e['error']}")
    out += ["", "`sample_pack[groups]` draws two whole GRPO groups of 8 on both sides (Reprise: a table with "
            "`group_size=8`; TorchRL: `PromptGroupSampler(num_groups=2)`); the other rows draw items.", ""]
    gl = report.get("goals", [])
    if gl:
        out += ["## Goal", "", *md_table(["goal", "check", "measured", "met?"],
                                         [[g["goal"], g["check"], f"{g['value']:.2f}x",
                                           "met" if g["met"] else "**missed**"] for g in gl]), ""]
    out += ["## Tokens/s", ""]
    rows = []
    for row, s in summ.items():
        ratio = f"{s['ratio']:.2f}x" if "ratio" in s else "—"
        rows.append([row, s["what"], _rate(s["reprise"]), _rate(s["torchrl"]), ratio,
                     _per_draw(s["reprise"]), _per_draw(s["torchrl"])])
    out += md_table(["workload", "what", "Reprise tokens/s", "TorchRL tokens/s", "Reprise / TorchRL",
                     "Reprise per draw: tokens / items / us / page faults",
                     "TorchRL per draw: tokens / items / us / page faults"], rows)
    out += ["", "`sample_pack[first]` runs before anything else in each side's process: a draw's new output "
            "buffers then page-fault (glibc maps and trims them until a block of several MB has been freed once); "
            "every other row runs after `insert` in both processes."]
    out += ["", "## Paths", ""]
    for row, s in summ.items():
        for side in ("reprise", "torchrl"):
            e = s[side]
            if e and "path" in e and (side == "torchrl" or row == s["reprise_key"]):
                extra = ""
                if "cold_tokens_per_s" in e:
                    extra = f" (first pass into a new buffer: {si(e['cold_tokens_per_s'])} tokens/s)"
                if "stored_items_at_end" in e:
                    extra = f" (items stored at the end of each pass: {e['stored_items_at_end']}"
                    if e.get("stale_removed") is not None:
                        extra += f"; stale_removed {e['stale_removed']}, stale_dropped {e['stale_dropped']}"
                    extra += f"; final version {e['final_version']})"
                out.append(f"- `{row}` {side}: `{e['path']}`{extra}")
    return "\n".join(out) + "\n"


# --- main -------------------------------------------------------------------------------------------
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small buffer, short rounds: a smoke test, numbers are noise")
    ap.add_argument("--systems", default=",".join(n for n, _ in SYSTEMS),
                    help="comma-separated subset of " + ",".join(n for n, _ in SYSTEMS))
    ap.add_argument("--only", default=None, help="comma-separated substrings of workload keys (passed to each side)")
    ap.add_argument("--passes", type=int, default=None, help="processes per system (default 2; --quick 1)")
    ap.add_argument("--out-dir", default=OUT, help="where the .json, .md and .log files go (default benchmarks/out)")
    args = ap.parse_args()
    systems = [s for s in args.systems.split(",") if s]
    if set(systems) - {n for n, _ in SYSTEMS}:
        ap.error(f"unknown systems {sorted(set(systems) - {n for n, _ in SYSTEMS})}")
    args.out_dir = os.path.abspath(args.out_dir)
    cfg = wl.make_config(args.quick, None).override(args, "passes")
    stem, report = start_report("async_rl", args.quick, args.out_dir,
                                command=command_line("benchmarks.async_rl.compare"))
    report["config"] = cfg.as_dict()
    report["sequences"] = wl.Sequences(cfg, cfg.insert_groups).describe()
    run_all(report, stem, args, cfg, systems)
    report["summary"] = summarize(report)
    report["goals"] = goals(report["summary"])
    write_outputs(args.out_dir, stem, report, build_markdown(report))


if __name__ == "__main__":
    main()
