"""End to end: synchronous data-parallel A2C on CartPole-v1 with 4 learners, DDP's gradients
aggregated (a) by gloo's all-reduce (DDP's default) and (b) through the aggregation daemon
(``model.register_comm_hook(worker, reprise.aggregate.ddp_hook)``); wall time to the same target.

    python -m benchmarks.innetwork.ddp_cartpole                 # 4 learners, ABBA, ~3 minutes on 2 cores
    python -m benchmarks.innetwork.ddp_cartpole --quick         # 2 learners, a few seconds per arm
    python -m benchmarks.innetwork.ddp_cartpole --learners 4 --target 195 --budget-s 150 --repeats 1

Each arm is one job of spawned learners (``reprise.distributed.local_ranks.run_ranks``: a TCPStore
and a gloo process group on loopback, ``OMP_NUM_THREADS=1``, one torch thread, a timeout on every
collective and a deadline on the job, so nothing hangs). Every learner runs its own
``--envs`` CartPole-v1 environments seeded ``seed * 1000 + rank * envs + i``; the model (an MLP
trunk of two ``--hidden`` tanh layers, policy and value heads) starts from ``torch.manual_seed(seed)``
in both arms, and DDP broadcasts rank 0's weights. One update: ``--steps`` steps of every env
(n-step returns bootstrapped from the value), loss = policy gradient + 0.5 value MSE - 0.01
entropy, ``backward()`` (DDP all-reduces and averages the gradients: gloo, or the daemon through
the comm hook), Adam step. Every 10 updates one gloo all-reduce (same in both arms) averages the
mean return of each learner's last 20 finished episodes; at ``--target`` (195 by default, v0's
"solved") or after ``--budget-s`` seconds every learner stops at the same update.

Arms run ABBA (``--repeats`` times each, alternating order) against the shared machine's drift.
The two arms' learning curves are not identical (float32 sums in a different order make the
weights diverge after the first updates), so the cleaner number is the median time per update;
time to target also carries the learning's own variance. iSwitch reports up to 3.66x faster
training (sync) on a NetFPGA testbed with 3 MB (A2C-Atari) gradients over real links; here the
gradient is ~70 KB and everything runs on 2 shared cores over loopback (backward, where DDP
aggregates and waits for the slowest learner, was ~70% of a gloo update in RESULTS.md's run).

Writes ``benchmarks/out/innetwork-ddp-cartpole-<date>.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

from benchmarks.common.config import Config
from benchmarks.common.driver import OUT, command_line, start_report, write_outputs
from benchmarks.common.report import md_table
from benchmarks.innetwork.agg_daemon import aggregate_module, build_info, module_name, unavailable

FULL = dict(learners=4, envs=8, steps=5, hidden=128, lr=1e-3, target=195.0, budget_s=150.0, seed=1,
            repeats=2, window=20, check_every=10, timeout_s=60.0)
QUICK = dict(learners=2, envs=2, budget_s=2.0, target=40.0, repeats=1, timeout_s=30.0)
ISWITCH_SPEEDUP = 3.66


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def learner(rank: int, world: int, cfg: dict, arm: str, daemon_address: str | None, job: int) -> dict:
    """One learner (runs in a spawned process with the gloo group already initialised)."""
    import gymnasium as gym
    import numpy as np
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(cfg["seed"])
    h = cfg["hidden"]

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.trunk = nn.Sequential(nn.Linear(4, h), nn.Tanh(), nn.Linear(h, h), nn.Tanh())
            self.pi = nn.Linear(h, 2)
            self.v = nn.Linear(h, 1)

        def forward(self, x):
            z = self.trunk(x)
            return self.pi(z), self.v(z).squeeze(-1)

    net = Net()
    n_params = sum(p.numel() for p in net.parameters())
    model = DDP(net)
    worker = None
    if arm == "daemon":
        agg = aggregate_module()
        worker = agg.Worker(daemon_address, job=job, rank=rank, size=world, mode="sync", dtype="float32")
        model.register_comm_hook(worker, agg.ddp_hook)
    opt = torch.optim.Adam(model.parameters(), lr=cfg["lr"])
    gen = torch.Generator().manual_seed(cfg["seed"] * 7919 + rank)
    E, T, gamma = cfg["envs"], cfg["steps"], 0.99
    envs = [gym.make("CartPole-v1") for _ in range(E)]
    obs = np.stack([e.reset(seed=cfg["seed"] * 1000 + rank * E + i)[0] for i, e in enumerate(envs)])
    ep_ret = np.zeros(E)
    finished: list[float] = []
    stats = {"rollout_s": [], "backward_s": [], "update_s": []}
    updates = env_steps = 0
    reached = False
    mean_recent = 0.0
    dist.barrier()
    t_start = time.monotonic()
    while True:
        t0 = time.monotonic()
        act_buf, rew_buf, done_buf = [], [], []
        logits_l, v_l = [], []
        for _ in range(T):
            x = torch.as_tensor(obs, dtype=torch.float32)
            logits, v = model(x)
            a = torch.multinomial(torch.softmax(logits.detach(), -1), 1, generator=gen).squeeze(-1)
            acts = a.numpy()
            nxt = np.empty_like(obs)
            rews = np.empty(E, dtype=np.float32)
            terms = np.zeros(E, dtype=np.float32)
            for i, e in enumerate(envs):
                o, r, term, trunc, _ = e.step(int(acts[i]))
                ep_ret[i] += r
                rews[i] = r
                terms[i] = float(term)
                if term or trunc:
                    finished.append(ep_ret[i])
                    ep_ret[i] = 0.0
                    o, _ = e.reset()
                nxt[i] = o
            logits_l.append(logits)
            v_l.append(v)
            act_buf.append(a)
            rew_buf.append(torch.from_numpy(rews))
            done_buf.append(torch.from_numpy(terms))
            obs = nxt
            env_steps += E
        with torch.no_grad():
            _, boot = model.module(torch.as_tensor(obs, dtype=torch.float32))
        ret = boot
        rets = []
        for k in reversed(range(T)):
            ret = rew_buf[k] + gamma * ret * (1.0 - done_buf[k])
            rets.append(ret)
        rets.reverse()
        logits = torch.cat(logits_l)
        v = torch.cat(v_l)
        R = torch.cat(rets)
        acts = torch.cat(act_buf)
        logp_all = torch.log_softmax(logits, -1)
        logp = logp_all.gather(1, acts.unsqueeze(1)).squeeze(1)
        adv = (R - v).detach()
        entropy = -(logp_all.exp() * logp_all).sum(-1).mean()
        loss = -(logp * adv).mean() + 0.5 * ((R - v) ** 2).mean() - 0.01 * entropy
        t1 = time.monotonic()
        opt.zero_grad(set_to_none=True)
        loss.backward()          # DDP aggregates the gradients here (gloo or the daemon)
        t2 = time.monotonic()
        opt.step()
        t3 = time.monotonic()
        stats["rollout_s"].append(t1 - t0)
        stats["backward_s"].append(t2 - t1)
        stats["update_s"].append(t3 - t0)
        updates += 1
        if updates % cfg["check_every"] == 0:
            recent = finished[-cfg["window"]:]
            m = torch.tensor([float(np.mean(recent)) if recent else 0.0, 1.0 if recent else 0.0])
            dist.all_reduce(m)
            mean_recent = float(m[0] / m[1]) if m[1] > 0 else 0.0
            elapsed = time.monotonic() - t_start
            flag = torch.tensor([1.0 if mean_recent >= cfg["target"] else 0.0,
                                 1.0 if elapsed >= cfg["budget_s"] else 0.0])
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)   # rank clocks differ a little: agree
            if flag[0] > 0:
                reached = True
                break
            if flag[1] > 0:
                break
    wall = time.monotonic() - t_start
    out = {"rank": rank, "arm": arm, "reached": reached, "wall_s": wall, "updates": updates,
           "env_steps": env_steps * world, "episodes": len(finished), "mean_recent": mean_recent,
           "params": n_params, "grad_bytes": n_params * 4,
           "median_update_ms": statistics.median(stats["update_s"]) * 1e3,
           "median_rollout_ms": statistics.median(stats["rollout_s"]) * 1e3,
           "median_backward_ms": statistics.median(stats["backward_s"]) * 1e3,
           "p99_backward_ms": sorted(stats["backward_s"])[int(0.99 * (len(stats["backward_s"]) - 1))] * 1e3}
    if worker is not None:
        try:
            worker.close()
        except Exception:  # noqa: BLE001
            pass
    return out


def run_arm(arm: str, cfg: Config, job: int) -> dict:
    from reprise.distributed.local_ranks import run_ranks

    daemon = None
    address = None
    if arm == "daemon":
        daemon = aggregate_module().Daemon(address="127.0.0.1:0")
        address = daemon.address
    t0 = time.monotonic()
    try:
        ranks = run_ranks(cfg.learners, learner, cfg.as_dict(), arm, address, job,
                          deadline=cfg.budget_s * 2 + 120, timeout=cfg.timeout_s)
    except Exception as e:  # noqa: BLE001 - recorded
        return {"arm": arm, "error": f"{type(e).__name__}: {e}"[-4000:], "job_wall_s": time.monotonic() - t0}
    finally:
        stats = None
        if daemon is not None:
            try:
                stats = daemon.stats()
            except Exception:  # noqa: BLE001
                pass
            daemon.stop()
    r0 = ranks[0]
    out = {k: r0[k] for k in ("arm", "reached", "wall_s", "updates", "env_steps", "episodes", "mean_recent",
                              "params", "grad_bytes")}
    for k in ("median_update_ms", "median_rollout_ms", "median_backward_ms", "p99_backward_ms"):
        out[k] = statistics.median(r[k] for r in ranks)
    out["job_wall_s"] = time.monotonic() - t0
    if stats is not None:
        out["daemon_stats"] = stats
    return out


def summarize(runs: list[dict]) -> dict:
    by_arm: dict[str, list[dict]] = {}
    for r in runs:
        by_arm.setdefault(r["arm"], []).append(r)
    out = {}
    for arm, rs in by_arm.items():
        ok = [r for r in rs if "error" not in r]
        if not ok:
            out[arm] = {"error": rs[0]["error"]}
            continue
        reached = [r for r in ok if r["reached"]]
        out[arm] = {"runs": len(ok), "reached": len(reached),
                    "time_to_target_s": statistics.median(r["wall_s"] for r in reached) if reached else None,
                    "updates_to_target": statistics.median(r["updates"] for r in reached) if reached else None,
                    "median_update_ms": statistics.median(r["median_update_ms"] for r in ok),
                    "median_backward_ms": statistics.median(r["median_backward_ms"] for r in ok),
                    "median_rollout_ms": statistics.median(r["median_rollout_ms"] for r in ok)}
    g, d = out.get("gloo", {}), out.get("daemon", {})
    if g.get("median_update_ms") and d.get("median_update_ms"):
        out["speedup_per_update"] = g["median_update_ms"] / d["median_update_ms"]
        out["speedup_backward"] = g["median_backward_ms"] / d["median_backward_ms"]
    if g.get("time_to_target_s") and d.get("time_to_target_s"):
        out["speedup_time_to_target"] = g["time_to_target_s"] / d["time_to_target_s"]
    return out


def build_markdown(report: dict) -> str:
    cfg, s = report["config"], report["summary"]
    grad = next((r["grad_bytes"] for r in report["runs"] if "grad_bytes" in r), None)
    out = [f"# DDP A2C on CartPole-v1: gloo all-reduce vs the aggregation daemon, {report['date']}"
           + (" (QUICK: numbers are noise)" if report["quick"] else ""), "",
           f"Command: `{report['command']}`. {cfg['learners']} learners (spawned, gloo group on loopback, "
           f"`OMP_NUM_THREADS=1`), {cfg['envs']} envs x {cfg['steps']} steps per learner per update, MLP "
           f"2 x {cfg['hidden']} ({grad if grad else '?'} bytes of gradient), Adam {cfg['lr']}, seed {cfg['seed']}; "
           f"target: mean return of the last {cfg['window']} episodes (averaged over learners) >= "
           f"{cfg['target']:g}, budget {cfg['budget_s']:g} s per run. Daemon build: "
           f"{report.get('build', {}).get('git_head', '?')}, native {report.get('build', {}).get('native_sha256', '?')}.",
           ""]
    if report.get("skipped"):
        out += [f"- daemon arm SKIPPED: {report['skipped']}", ""]
    head = ["run", "arm", "reached", "seconds", "updates", "env steps", "update ms (median)",
            "backward incl. all-reduce ms", "rollout ms"]
    out += md_table(head)
    for i, r in enumerate(report["runs"]):
        if "error" in r:
            out.append(f"| {i} | {r['arm']} | error: {r['error'].splitlines()[-1][:200]} |" + " |" * 6)
            continue
        out.append(f"| {i} | {r['arm']} | {'yes' if r['reached'] else 'no'} | {r['wall_s']:.1f} | {r['updates']} | "
                   f"{r['env_steps']:,} | {r['median_update_ms']:.2f} | {r['median_backward_ms']:.2f} | "
                   f"{r['median_rollout_ms']:.2f} |")
    out.append("")
    lines = []
    if "speedup_time_to_target" in s:
        lines.append(f"- time to target, gloo / daemon: **{s['speedup_time_to_target']:.2f}x**")
    else:
        lines.append("- time to target: not reached by both arms (see the table)")
    if "speedup_per_update" in s:
        lines.append(f"- median update time, gloo / daemon: **{s['speedup_per_update']:.2f}x**; backward "
                     f"(where DDP all-reduces), gloo / daemon: {s['speedup_backward']:.2f}x")
    g = s.get("gloo", {})
    share = (f"with gloo, backward including the all-reduce took {g['median_backward_ms'] / g['median_update_ms']:.0%} "
             "of a median update here" if g.get("median_update_ms") else "")
    lines.append(f"- iSwitch reports up to {ISWITCH_SPEEDUP}x (sync) faster training end to end on a NetFPGA "
                 "testbed (3 MB A2C-Atari gradients over real links, where aggregation was 50-83% of an "
                 f"iteration); here the gradient is {grad or '?'} bytes, the links are loopback and every learner "
                 f"shares 2 cores{'; ' + share if share else ''}. The backward time includes waiting for the "
                 "slowest learner, which on shared cores is most of it.")
    return "\n".join(out + lines + [""])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    for k in ("learners", "envs", "steps", "hidden", "repeats", "seed"):
        ap.add_argument("--" + k, type=int)
    for k in ("target", "budget_s", "lr"):
        ap.add_argument("--" + k.replace("_", "-"), type=float, dest=k)
    ap.add_argument("--arms", default="gloo,daemon")
    ap.add_argument("--out-dir", default=OUT)
    args = ap.parse_args(argv)
    cfg = Config.choose(args.quick, None, FULL, QUICK).override(
        args, "learners", "envs", "steps", "hidden", "repeats", "seed", "target", "budget_s", "lr")
    os.environ["OMP_NUM_THREADS"] = "1"
    stem, report = start_report("innetwork-ddp-cartpole", args.quick, args.out_dir,
                                command=command_line(__spec__.name))
    report["config"] = cfg.as_dict()
    report["module"] = module_name()
    report["build"] = build_info() if unavailable() is None else {}
    arms = [a for a in args.arms.split(",") if a]
    if "daemon" in arms:
        why = unavailable()
        if why is None and not hasattr(aggregate_module(), "ddp_hook"):
            why = f"{module_name()} has no ddp_hook"
        if why:
            report["skipped"] = why
            log(f"== daemon: SKIPPED: {report['skipped']}")
            arms.remove("daemon")
    order = []
    for i in range(cfg.repeats):
        order += arms if i % 2 == 0 else arms[::-1]
    runs = []
    for i, arm in enumerate(order):
        log(f"== run {i}: {arm}, {cfg.learners} learners ...")
        r = run_arm(arm, cfg, job=100 + i)
        runs.append(r)
        if "error" in r:
            log(f"   ERROR: {r['error'].splitlines()[-1][:300]}")
        else:
            log(f"   reached={r['reached']} in {r['wall_s']:.1f} s, {r['updates']} updates, "
                f"update {r['median_update_ms']:.2f} ms, backward {r['median_backward_ms']:.2f} ms")
    report["runs"] = runs
    report["summary"] = summarize(runs)
    write_outputs(args.out_dir, stem, report, build_markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
