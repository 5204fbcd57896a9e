"""Cluster-mode benchmark (issue 13): ``rp.distributed.ShardedTable.sample`` on N gloo
ranks of this machine against bare ``torch.distributed`` collectives, in the same run, on
the same ranks and the same gloo group.

    python -m benchmarks.cluster.compare            # world sizes 1, 2 and 4, ~1.5 minutes on 2 cores
    python -m benchmarks.cluster.compare --quick    # world size 2, few steps: a smoke test (~15 s)
    python -m benchmarks.cluster.compare --worlds 2,4 --links 10gbit,25gbit   # also over shaped links (root)

Run it from the repository root with the Python that has ``reprise`` and torch installed.
World size 1 is a reference (no peer: the collectives are local, so the step is the table's
own work); the goals are judged at 2 and more. Each world size is one job of spawned ranks
(``reprise.distributed.local_ranks``: TCPStore on a free loopback port, gloo, ``OMP_NUM_THREADS=1``); every rank
runs ``measure.rank_main``:

1. Collected bytes/s: ``sample(B)`` of rows of one float32[1024] field (4 KB; each shard
   prefilled with 4,096 one-step items; ``shards="rank"``, ``Uniform``, ``assignment="iid"``,
   so (1 - 1/world) of the rows cross ranks), B = 256 and 1024, with and without the
   per-row CRC check (``verify_rows``), against a bare ``all_to_all_single`` that replays
   the split sizes of the table's own exchange step for step (same bytes and pattern);
   plus ``assignment="local"`` with one emulated host per rank (``REPRISE_HOST_ID``), where
   only the imbalance crosses (measured against the model's 0.4·h·sqrt(B/h·(1-1/h)) rows).
2. Control latency: ``sample(world)`` of one int64 scalar per row against a bare 64-byte
   ``all_gather``, the 128-byte one (the header's size) and the two-collective floor
   (128-byte ``all_gather`` + a tiny ``all_to_all_single``); the share of the sample
   that is the all_to_all (and the all_gather) is timed inside the call.
3. Control bytes per call: every ``sample`` call's ``all_gather`` sizes as seen by the
   table's group (16 int64 words = 128 bytes sent per rank, world x 128 gathered),
   checked to be the same for every batch and table size.

Each step is also cut into its parts (header + all_gather + gate, plan, draw + pack,
all_to_all, unpack + CRC) and counts the rank's minor page faults.

Medians over ``rounds x steps_per_round`` steps after a warm-up (per step: the slowest
rank); table and baseline blocks alternate. Writes ``benchmarks/out/cluster-<date>.json``
and ``.md`` (``--out-dir`` elsewhere); the tables go to stdout, with the multi-host model's
predictions (``model.py``; predictions, not measurements).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

from benchmarks.cluster import model
from benchmarks.cluster.links import run_ranks_on_links
from benchmarks.cluster.measure import rank_main
from reprise.distributed.local_ranks import run_ranks
from benchmarks.common.config import Config
from benchmarks.common.driver import OUT, command_line, start_report, write_outputs
from benchmarks.common.report import busy_lines, machine_lines, md_row, md_table

FULL = dict(worlds=[1, 2, 4], row_floats=1024, items_per_shard=4096, batches=[256, 1024], local_batches=[1024],
            warmup_steps=20, rounds=5, steps_per_round=40, tiny_items=1024, tiny_steps_per_round=60,
            deadline_s=900.0)
QUICK = dict(worlds=[2], items_per_shard=1024, tiny_items=256, warmup_steps=3, rounds=2, steps_per_round=6,
             tiny_steps_per_round=10, deadline_s=90.0)
GOAL_BANDWIDTH = 0.70  # sample bytes/s >= 70% of the bare all_to_all's
GOAL_LINK_BANDWIDTH = 0.80  # the same on shaped links (--links): the link, not host work, is the limit
GOAL_LATENCY = 3.0  # sample latency <= 3x a bare 64-byte all_gather
BUSY_LOAD = 1.0  # 1-minute load average above which a world's numbers are flagged


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# --- summaries ------------------------------------------------------------------------------
def per_step(ranks: list[dict], field: str) -> np.ndarray:
    """``[ranks, steps]`` of one recorded list."""
    return np.array([r[field] for r in ranks], dtype=np.float64)


def slowest(ranks: list[dict], field: str) -> np.ndarray:
    return per_step(ranks, field).max(axis=0)


def pct(a: np.ndarray, q: float) -> float:
    return float(np.percentile(a, q))


def share(ranks: list[dict], part: str) -> float:
    """Median over (rank, step) of the part's time / the sample's time on that rank."""
    return float(np.median(per_step(ranks, part) / per_step(ranks, "sample_s")))


PARTS = [("begin_s", "header + all_gather + gate"), ("plan_s", "plan"), ("pack_s", "draw + pack"),
         ("a2a_s", "all_to_all"), ("receive_s", "unpack (+ CRC)"), ("sample_s", "whole sample")]


def parts_ms(ranks: list[dict]) -> dict:
    """Median over (rank, step) of each part of sample (ms), and the mean minor page faults
    per rank and step (``faults``: they come in bursts, the median is often 0)."""
    out = {k: float(np.median(per_step(ranks, k))) * 1e3 for k, _ in PARTS}
    out["faults"] = float(np.mean(per_step(ranks, "faults")))
    return out


def summarize_bandwidth(ranks: list[dict], world: int) -> dict:
    r0 = ranks[0]
    batch, payload = r0["batch"], r0["payload_bytes_per_row"]
    step, bare = slowest(ranks, "sample_s"), slowest(ranks, "bare_s")
    step_bytes = batch * payload
    exchange = per_step(ranks, "exchange_bytes").sum(axis=0)
    remote = per_step(ranks, "remote_rows").sum(axis=0)
    outside = per_step(ranks, "sample_s") - per_step(ranks, "gather_s") - per_step(ranks, "a2a_s")
    received = batch // world * payload  # payload bytes each rank (a consumer) receives
    hosts = world if r0["own_host"] else 1
    expected = model.remote_rows(batch, world, "iid") if r0["assignment"] == "iid" else \
        model.remote_rows(batch, hosts, "local")
    return {
        "batch": batch, "assignment": r0["assignment"], "verify_rows": r0["verify_rows"],
        "shards": r0.get("shards", "rank"), "reads": r0.get("reads", True),
        "one_host_per_rank": r0["own_host"], "steps": int(step.size),
        "payload_bytes_per_step": step_bytes, "exchange_bytes_per_step": float(np.median(exchange)),
        "row_stride_bytes": r0["stride"],
        "sample_ms": {"p50": pct(step, 50) * 1e3, "p10": pct(step, 10) * 1e3, "p90": pct(step, 90) * 1e3},
        "bare_ms": {"p50": pct(bare, 50) * 1e3, "p10": pct(bare, 10) * 1e3, "p90": pct(bare, 90) * 1e3},
        "sample_gb_per_s": step_bytes / pct(step, 50) / 1e9,
        "bare_gb_per_s_same_payload": step_bytes / pct(bare, 50) / 1e9,
        "bare_gb_per_s_exchange_bytes": float(np.median(exchange / bare)) / 1e9,
        "ratio": pct(bare, 50) / pct(step, 50),
        "a2a_share": share(ranks, "a2a_s"), "gather_share": share(ranks, "gather_s"),
        "a2a_in_sample_ms": pct(slowest(ranks, "a2a_s"), 50) * 1e3,
        "host_work_ms": float(np.median(outside)) * 1e3,
        "host_ns_per_received_byte": float(np.median(outside)) / received * 1e9,
        "parts_ms": parts_ms(ranks),
        "remote_rows_per_step": {"mean": float(remote.mean()), "p50": pct(remote, 50), "expected": expected},
    }


def summarize_latency(ranks: list[dict]) -> dict:
    step = slowest(ranks, "sample_s")
    g64, g128, pair = slowest(ranks, "gather64_s"), slowest(ranks, "gather128_s"), slowest(ranks, "pair_s")
    us = lambda a: {"p50": pct(a, 50) * 1e6, "p10": pct(a, 10) * 1e6, "p90": pct(a, 90) * 1e6}  # noqa: E731
    return {"batch": ranks[0]["batch"], "steps": int(step.size), "items_per_shard": ranks[0]["items_per_shard"],
            "sample_us": us(step), "gather64_us": us(g64), "gather128_us": us(g128), "pair_us": us(pair),
            "parts_ms": parts_ms(ranks),
            "a2a_in_sample_us": pct(slowest(ranks, "a2a_s"), 50) * 1e6,
            "gather_in_sample_us": pct(slowest(ranks, "gather_s"), 50) * 1e6,
            "ratio_vs_gather64": pct(step, 50) / pct(g64, 50), "ratio_vs_pair": pct(step, 50) / pct(pair, 50),
            "a2a_share": share(ranks, "a2a_s"), "gather_share": share(ranks, "gather_s")}


def summarize_control(ranks: list[dict], world: int) -> dict:
    """Every sample call's control all_gather sizes, over every table of the run."""
    seen = set()
    calls = 0
    tables = [("latency", r["latency"]) for r in ranks] + \
             [(k, v) for r in ranks for k, v in r["bandwidth"].items()]
    batches = set()
    for key, rec in tables:
        batches.add(rec["batch"])
        for n, sent, recv in zip(rec["gathers"], rec["control_sent_bytes"], rec["control_recv_bytes"]):
            seen.add((int(n), int(sent), int(recv)))
            calls += 1
    words = ranks[0]["header_words"]
    return {"header_words": words, "sent_bytes_per_rank": words * 8, "gathered_bytes_per_rank": words * 8 * world,
            "logical_bytes_per_call": words * 8 * world * world,
            "observed": sorted(seen), "calls": calls, "batches": sorted(batches),
            "constant": seen == {(1, words * 8, words * 8 * world)}}


def wait_idle(seconds: float) -> None:
    """Waits (up to ``seconds``) until the 1-minute load average is below 0.5."""
    end = time.monotonic() + seconds
    if seconds > 0 and os.getloadavg()[0] >= 0.5:
        log(f"waiting up to {seconds:.0f} s for the load average ({os.getloadavg()[0]:.2f}) to fall below 0.5 ...")
    while os.getloadavg()[0] >= 0.5 and time.monotonic() < end:
        time.sleep(5)


def run_world(world: int, cfg: Config, idle_wait: float = 0.0, link: str | None = None) -> dict:
    """One world size's results: ranks spawned on loopback, or with ``link`` (a tc rate) each
    rank in a network namespace of its own behind a link shaped to it (``links.py``)."""
    wait_idle(idle_wait)
    load = os.getloadavg()[0]
    if load > BUSY_LOAD:
        log(f"WARNING: 1-minute load average {load:.2f} before world size {world}: the machine is busy")
    where = f"namespaced links at {link}" if link else "loopback"
    log(f"world size {world}: {world} gloo ranks over {where} ...")
    t0 = time.perf_counter()
    entry = {"loadavg_1m_before": round(load, 2), "link": link}
    try:
        if link:
            ranks, entry["link_bytes"] = run_ranks_on_links(world, cfg.as_dict(), link, cfg.deadline_s)
        else:
            ranks = run_ranks(world, rank_main, cfg.as_dict(), deadline=cfg.deadline_s, timeout=60.0)
    except Exception as e:  # noqa: BLE001 - recorded, the other world sizes still run
        log(f"world size {world}: ERROR: {e}")
        entry.update(error=str(e)[-6000:], wall_s=round(time.perf_counter() - t0, 1))
        return entry
    entry["wall_s"] = round(time.perf_counter() - t0, 1)
    entry["versions"] = ranks[0]["versions"]
    entry["loadavg_1m_after"] = round(os.getloadavg()[0], 2)
    results = {"bandwidth": {}, "latency": summarize_latency([r["latency"] for r in ranks])}
    for key in ranks[0]["bandwidth"]:  # the variants the ranks ran (fewer on namespaced links)
        results["bandwidth"][key] = summarize_bandwidth([r["bandwidth"][key] for r in ranks], world)
    results["control"] = summarize_control(ranks, world)
    entry["results"] = results
    lat = results["latency"]
    log(f"world size {world}: done in {entry['wall_s']} s; tiny sample {lat['sample_us']['p50']:.0f} us "
        f"vs all_gather {lat['gather64_us']['p50']:.0f} us")
    return entry


# --- markdown -------------------------------------------------------------------------------
def world_label(name: str) -> str:
    w, _, link = name.removeprefix("world").partition("@")
    label = f"{w} (no peer)" if w == "1" else w
    return f"{label}, links at {link}" if link else label


def met(ok: bool) -> str:
    return "met" if ok else "**missed**"


def goal_cell(name: str, ok: bool) -> str:
    return "(reference)" if name == "world1" else met(ok)


def variant_label(e: dict) -> str:
    if e.get("shards") == "host":
        return "one shard on the host (rank 0's), " + ("others read its memory" if e["reads"] else
                                                      "every row through the exchange")
    return (("iid" if e["assignment"] == "iid" else "local, 1 host/rank") +
            ("" if e["verify_rows"] else ", no CRC") + ("" if e.get("reads", True) else
                                                       ", every row through the exchange"))


def bandwidth_table(report: dict) -> list[str]:
    head = ["world", "variant", "batch", "sample p50 ms", "sample GB/s", "bare all_to_all p50 ms",
            "bare GB/s (same bytes)", "sample / bare", "goal >= 70% (links: 80%)", "all_to_all share of sample",
            "host work ms", "rows crossing ranks / step (expected)"]
    lines = md_table(head)
    for name, s in report["systems"].items():
        for key, e in s.get("results", {}).get("bandwidth", {}).items():
            lines.append(md_row([
                world_label(name), variant_label(e), str(e["batch"]), f"{e['sample_ms']['p50']:.2f}",
                f"{e['sample_gb_per_s']:.2f}", f"{e['bare_ms']['p50']:.2f}",
                f"{e['bare_gb_per_s_same_payload']:.2f}", f"**{e['ratio']:.0%}**",
                goal_cell(name, e["ratio"] >= (GOAL_LINK_BANDWIDTH if s.get("link") else GOAL_BANDWIDTH)),
                f"{e['a2a_share']:.0%}", f"{e['host_work_ms']:.2f}",
                f"{e['remote_rows_per_step']['mean']:.1f} ({e['remote_rows_per_step']['expected']:.1f})"]))
    return lines


def parts_table(report: dict) -> list[str]:
    head = ["world", "variant", "batch"] + [label + " ms" for _, label in PARTS] + ["minor page faults / step (mean)"]
    lines = md_table(head)
    for name, s in report["systems"].items():
        res = s.get("results", {})
        rows = [(variant_label(e), e) for e in res.get("bandwidth", {}).values()]
        if "latency" in res:
            rows.append(("int64 scalars", res["latency"]))
        for what, e in rows:
            lines.append(md_row([world_label(name), what, str(e["batch"])] +
                                [f"{e['parts_ms'][k]:.3f}" for k, _ in PARTS] +
                                [f"{e['parts_ms']['faults']:.0f}"]))
    return lines


def latency_table(report: dict) -> list[str]:
    head = ["world", "batch", "sample p50 us", "bare all_gather 64 B p50 us", "sample / all_gather",
            "goal <= 3x", "all_gather 128 B us", "all_gather 128 B + tiny all_to_all us",
            "sample / two collectives", "all_to_all share", "all_gather share"]
    lines = md_table(head)
    for name, s in report["systems"].items():
        e = s.get("results", {}).get("latency")
        if not e:
            continue
        lines.append(md_row([
            world_label(name), str(e["batch"]), f"{e['sample_us']['p50']:.0f}",
            f"{e['gather64_us']['p50']:.0f}", f"**{e['ratio_vs_gather64']:.2f}x**",
            goal_cell(name, e["ratio_vs_gather64"] <= GOAL_LATENCY), f"{e['gather128_us']['p50']:.0f}",
            f"{e['pair_us']['p50']:.0f}", f"{e['ratio_vs_pair']:.2f}x", f"{e['a2a_share']:.0%}",
            f"{e['gather_share']:.0%}"]))
    return lines


def control_lines(report: dict) -> list[str]:
    out = []
    for name, s in report["systems"].items():
        c = s.get("results", {}).get("control")
        if not c:
            continue
        w = world_label(name)
        same = "the same every call" if c["constant"] else "NOT constant: " + str(c["observed"])
        out.append(f"- world {w}: each `sample` call makes one control `all_gather` of a {c['header_words']}-word "
                   f"int64 header: **{c['sent_bytes_per_rank']} B sent and {c['gathered_bytes_per_rank']} B "
                   f"gathered per rank per call** ({c['logical_bytes_per_call']} B over all ranks), whatever the "
                   f"batch or table size; observed on all {c['calls']} timed calls (batches {c['batches']}, "
                   f"tables of {report['config']['tiny_items']:,} and {report['config']['items_per_shard']:,} "
                   f"items per shard): {same}.")
    return out


def link_lines(report: dict) -> list[str]:
    """What the namespaced runs (``--links``) were, and what crossed each rank's link."""
    linked = {n: s for n, s in report["systems"].items() if s.get("link")}
    if not linked:
        return []
    out = ["Runs marked \"links at R\" put each rank in a network namespace of its own, joined to a switch "
           "namespace by a veth pair shaped with `tc tbf` to R both ways (`benchmarks/cluster/links.py`): gloo "
           "runs over TCP between the namespaces (`GLOO_SOCKET_IFNAME` = the rank's veth), and a byte from one "
           "rank to another crosses two shaped links. Each rank names its own host (`REPRISE_HOST_ID`). Bytes "
           "each rank's link carried over the whole run (both directions, every variant and baseline):"]
    for n, s in linked.items():
        carried = s.get("link_bytes") or {}
        parts = ", ".join(f"{h}: {(b['tx_bytes'] + b['rx_bytes']) / 1e9:.2f} GB" for h, b in carried.items() if b)
        out.append(f"- {world_label(n)}: {parts or 'not read'}.")
    return out + [""]


def goal_lines(report: dict) -> list[str]:
    out = []
    for name, s in report["systems"].items():
        res = s.get("results")
        if not res or name == "world1":
            continue
        w = world_label(name)
        goal = GOAL_LINK_BANDWIDTH if s.get("link") else GOAL_BANDWIDTH
        main = [e for e in res["bandwidth"].values()
                if e["assignment"] == "iid" and e["verify_rows"] and e["shards"] == "rank" and e["reads"]]
        ratios = ", ".join(f"B={e['batch']}: {e['ratio']:.0%}" for e in main)
        nocrc = ", ".join(f"B={e['batch']}: {e['ratio']:.0%}" for e in res["bandwidth"].values()
                          if not e["verify_rows"])
        ok = all(e["ratio"] >= goal for e in main)
        out.append(f"- world {w}, bytes/s >= {goal:.0%} of a bare all_to_all: {ratios} ({met(ok)}); "
                   f"without the CRC check: {nocrc}.")
        lat = res["latency"]
        out.append(f"- world {w}, control latency <= 3x a bare 64-byte all_gather: "
                   f"{lat['ratio_vs_gather64']:.2f}x ({met(lat['ratio_vs_gather64'] <= GOAL_LATENCY)}); "
                   f"{lat['ratio_vs_pair']:.2f}x the floor of its two collectives.")
    return out


def build_markdown(report: dict) -> str:
    cfg = report["config"]
    out = [f"# Cluster mode: ShardedTable.sample vs bare gloo collectives, {report['date']}"
           + (" (QUICK: few steps, noisy)" if report["quick"] else ""), "",
           *machine_lines(report), "",
           f"Command: `{report['command']}`. Every world size is one job of spawned ranks on this machine "
           "(gloo over loopback, `OMP_NUM_THREADS=1`, one torch thread); the bare collectives run on the "
           "table's own gloo group. "
           f"Medians over {cfg['rounds']} x {cfg['steps_per_round']} steps (latency: {cfg['rounds']} x "
           f"{cfg['tiny_steps_per_round']}) after {cfg['warmup_steps']} warm-up steps; per step the "
           "slowest rank; table and baseline blocks alternate.", ""]
    loads = "; ".join(f"world {n.removeprefix('world')}: {s.get('loadavg_1m_before', '?')} / "
                      f"{s.get('loadavg_1m_after', '?')}" for n, s in report["systems"].items())
    out += [f"1-minute load average before / after each world size: {loads}.", ""]
    out += busy_lines(report, BUSY_LOAD, {k: k.replace("world", "world size ") for k in report["systems"]},
                      "; with more ranks than cores the ranks share cores")
    out += link_lines(report)
    errors = [f"- {n}: {s['error'].splitlines()[-1] if s['error'].strip() else s['error']}"
              for n, s in report["systems"].items() if "error" in s]
    if errors:
        out += ["**Errors:**", *errors, ""]
    out += ["## 1. Collected bytes/s: sample(B) of 4 KB rows vs a bare all_to_all_single of the same splits", "",
            f"Rows: one float32[{cfg['row_floats']}] field ({cfg['row_floats'] * 4} B payload; a packed row is "
            "payload + 48 B header, plus 16 B of status per rank pair); shards prefilled with "
            f"{cfg['items_per_shard']:,} one-step items; `Uniform`; `shards=\"rank\"`. GB/s = payload bytes "
            "collected per step (batch x 4 KB, over all consumers) / median step; the bare all_to_all moves the "
            "same bytes with the same per-pair split sizes, replayed step for step. sample / bare = bare time / "
            "sample time. Host work = sample time outside its two collectives (plan, draw, pack, unpack, CRC) "
            "per rank. `iid` on one host: (1 - 1/world) of the rows cross ranks; `local, 1 host/rank`: each "
            "rank emulates a host, rows cross only for the imbalance (expected: the model's "
            "0.4·h·sqrt(B/h·(1-1/h))).", "",
            *bandwidth_table(report), "",
            "### Where a sample step's time goes", "",
            "Median per rank and step (ms) of each part, timed inside `sample`; the parts' medians need "
            "not add up to the whole's. The collectives' times include waiting for the slowest rank. Minor "
            "page faults: the rank's first touches of freshly allocated pages during the step (the bare "
            "baselines reuse their buffers: none).", "",
            *parts_table(report), "",
            "## 2. Control latency: sample(world) of int64 scalars vs a bare 64-byte all_gather", "",
            "One row per consumer per step. The two-collective floor is what one step cannot go below with "
            "this design: the header all_gather (128 B per rank) then an all_to_all.", "",
            *latency_table(report), "",
            "## 3. Control bytes per call", "",
            *control_lines(report),
            "- Ordered selectors (Fifo, Lifo, heaps) add one more all_gather of 1 + 5k int64 words per rank "
            "(k candidates per shard, from the batch): not measured here (Uniform).", "",
            "## Against the issue's goals", "",
            *goal_lines(report), "",
            "## Multi-host GPU model (predictions, not measurements; no GPU was used)", "",
            *model.prediction_lines(report.get("host_ns_per_byte")), ""]
    return "\n".join(out)


# --- main -----------------------------------------------------------------------------------
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="world size 2, few steps: a smoke test, numbers are noise")
    ap.add_argument("--worlds", default=None, help="comma-separated world sizes (default 2,4; --quick 2)")
    ap.add_argument("--out-dir", default=OUT, help="where the .json and .md files go (default benchmarks/out)")
    ap.add_argument("--links", default=None, metavar="RATE[,RATE]",
                    help="also run each world size with every rank in a network namespace of its own behind a "
                         "veth link shaped to RATE (tc rates: 10gbit, 25gbit); needs root and iproute2")
    ap.add_argument("--wait-idle", type=float, default=0.0, metavar="SECONDS",
                    help="before each world size, wait up to SECONDS for the 1-minute load average to fall "
                         "below 0.5 (a shared machine)")
    args = ap.parse_args()
    cfg = Config.choose(args.quick, None, FULL, QUICK)
    if args.worlds:
        cfg.worlds = [int(w) for w in args.worlds.split(",") if w]
    stem, report = start_report("cluster", args.quick, args.out_dir,
                                command=command_line(__spec__.name))
    report["config"] = cfg.as_dict()
    report["goals"] = {"bandwidth_ratio_min": GOAL_BANDWIDTH, "latency_ratio_max": GOAL_LATENCY}
    t0 = time.perf_counter()
    links = [r for r in (args.links or "").split(",") if r]
    for world in cfg.worlds:
        report["systems"][f"world{world}"] = run_world(world, cfg, args.wait_idle)
        for rate in links:
            if world > 1:
                report["systems"][f"world{world}@{rate}"] = run_world(world, cfg, args.wait_idle, rate)
    base = report["systems"].get(f"world{min(cfg.worlds)}", {}).get("results", {}).get("bandwidth", {})
    if "iid/b1024" in base:
        report["host_ns_per_byte"] = base["iid/b1024"]["host_ns_per_received_byte"]
    report["wall_s"] = round(time.perf_counter() - t0, 1)
    write_outputs(args.out_dir, stem, report, build_markdown(report))


if __name__ == "__main__":
    main()
