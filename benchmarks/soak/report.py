"""What a soak run measured: the ledger over every checkpoint, throughput per second, the
stalled reader's effect, the server's RSS and descriptors, call waits against their
timeouts; the pass/fail of each criterion; the JSON, the markdown summary and the plot."""

from __future__ import annotations

import glob
import os
import statistics

import numpy as np

from benchmarks.soak.ledger import Ledger, read_checkpoint, read_records, request_of

GRACE_S = 1.0   # scheduling slack over a call's timeout on a busy machine (2 shared cores)


def thresholds(seconds: float) -> dict:
    """The full soak's thresholds (the issue's), and the loose ones of a short run: on 2 cores
    shared with other tests, a 60 s run has warm-up and windows of a few seconds."""
    if seconds >= 180:
        return {"rss_growth": 0.10, "stall_ratio": 0.80, "fd_slack": 0}
    return {"rss_growth": 0.25, "stall_ratio": 0.50, "fd_slack": 0}


# --- the ledger -------------------------------------------------------------------------------
def check_ledger(rp, soak, result: dict, records: dict) -> dict:
    plan, crash, final = soak.plan, result["crash"], result["final"]
    ledger = Ledger(records, plan.write_batch, crash and crash["t_kill"], crash and crash["t_dead"])
    requests = records["requests"] + [{"t_begin": final["t_begin"], "t_end": final["t_end"],
                                       "wall_ns": final["wall_ns"], "path": final["path"]}]
    checked, by_epoch = [], {1: [], 2: []}
    for path in sorted(glob.glob(os.path.join(soak.ckpt_dir, "ckpt-*"))):
        req = request_of(os.path.basename(path), requests)
        if req is None:
            ledger.errors.append(f"{os.path.basename(path)}: no checkpoint request made it")
            continue
        epoch = 1 if crash is None or req["t_begin"] < crash["t_kill"] else 2
        by_epoch[epoch].append((path, req))
    restored = None
    for epoch in (1, 2):
        if epoch == 2 and crash is not None and plan.durable:
            # The store as the killed server left it: every item whose flush returned before
            # the kill is in it, or was evicted by the FIFO rule (checks 1-5 at the kill).
            c_ck = read_checkpoint(rp, crash["durable_state"], "replay")
            r = ledger.check(dict(c_ck, name="crash-state"), 1, crash["t_kill"], crash["t_dead"])
            ledger.set_restored(c_ck)
            restored = {"name": "crash-state (the durable store at the kill)", "items": len(c_ck["ids"]),
                        "errors": r["errors"], **ledger.crash_losses(c_ck, crash["t_kill"])}
        elif epoch == 2 and crash is not None:
            c_path = by_epoch[1][-1][0] if by_epoch[1] else None
            if c_path is None or crash["restored_from"] != c_path or crash["newest_checkpoint"] != c_path:
                ledger.errors.append(f"restart restored {crash['restored_from']}, newest before the crash "
                                     f"{crash['newest_checkpoint']}, last of epoch 1 {c_path}")
            if c_path is not None:
                c_ck = read_checkpoint(rp, c_path, "replay")
                ledger.set_restored(c_ck)
                restored = {"name": os.path.basename(c_path), "items": len(c_ck["ids"]),
                            **ledger.crash_losses(c_ck, by_epoch[1][-1][1]["t_begin"])}
        for path, req in by_epoch[epoch]:
            try:
                ck = read_checkpoint(rp, path, "replay")
            except Exception as e:   # Corrupt, or not the layout the soak wrote
                ledger.errors.append(f"{os.path.basename(path)}: unreadable: {e}")
                continue
            r = ledger.check(ck, epoch, req["t_begin"], req["t_end"])
            r["t"] = round(req["t_begin"] - soak.t0, 2)
            checked.append(r)
    f = checked[-1] if checked else {}
    corrupt = records["corrupt_samples"]
    if corrupt:
        ledger.errors.append(f"{len(corrupt)} sampled items whose payload differs from their id")
    return {"errors": ledger.errors, "error_count": len(ledger.errors), "totals": ledger.totals(),
            "checkpoints": checked, "restored": restored, "final": f, "corrupt_samples": len(corrupt)}


# --- series -----------------------------------------------------------------------------------
def per_second(times, counts, seconds: float) -> list[float]:
    bins = np.zeros(int(np.ceil(seconds)) + 1)
    t = np.asarray(times, float)
    m = (t >= 0) & (t < len(bins))
    np.add.at(bins, t[m].astype(int), np.asarray(counts, float)[m])
    return bins.tolist()


def throughput(soak, records: dict) -> dict:
    t0, secs = soak.t0, soak.plan.seconds
    b = records["batches"]
    commits = [(x["t_end"] - t0, x["n"]) for x in b if x["status"] == 1]
    draws = [(c["start"] + c["wait"] - t0, c["n"]) for c in records["calls"]
             if c["kind"] == "sample" and c["ok"]]
    updates = [(c["start"] + c["wait"] - t0, c["n"]) for c in records["calls"] if c["kind"] == "update" and c["ok"]]
    out = {}
    for name, pts in (("inserts", commits), ("samples", draws), ("updates", updates)):
        out[name] = per_second([p[0] for p in pts], [p[1] for p in pts], secs) if pts else [0.0] * (int(secs) + 1)
    out["_events"] = {"inserts": commits, "samples": draws}
    return out


def rate_in(points, spans) -> float:
    length = sum(b - a for a, b in spans)
    return sum(n for t, n in points if any(a <= t < b for a, b in spans)) / length


def stall_effect(soak, result: dict, tp: dict) -> dict:
    """Rates per window, from ``settle`` s after it starts (and, with the stalled reader, from
    when it was stopped) to its end, leaving out the crash (1 s before the SIGKILL to 3 s
    after the restarted server is up); a window needs 40% of its time left to count."""
    plan, crash = soak.plan, result["crash"]
    hole = None
    if crash is not None:
        hole = (crash["t_kill"] - soak.t0 - 1.0, crash["t_dead"] - soak.t0 + crash["restart_s"] + 3.0)
    windows = []
    for w in result["windows"]:
        a = w["start"] + plan.settle
        if w["on"]:
            a = max(a, w.get("stalled_from", np.inf))
        spans = [(a, w["end"])] if a < w["end"] else []
        if hole is not None and spans:
            spans = [s for s in ((a, min(w["end"], hole[0])), (max(a, hole[1]), w["end"])) if s[1] > s[0]]
        measured = sum(b - x for x, b in spans)
        valid = measured >= 0.4 * (w["end"] - w["start"])
        windows.append({**w, "from": round(a, 2) if a < np.inf else None, "measured_s": round(measured, 2),
                        "valid": bool(valid),
                        "inserts_per_s": rate_in(tp["_events"]["inserts"], spans) if valid else None,
                        "samples_per_s": rate_in(tp["_events"]["samples"], spans) if valid else None})
    pairs = []
    for i, w in enumerate(windows):
        if not (w["on"] and w["valid"]):
            continue
        offs = [windows[j] for j in (i - 1, i + 1) if 0 <= j < len(windows) and windows[j]["valid"]]
        if not offs:
            continue
        pairs.append({"on_start": w["start"], **{
            k: w[f"{k}_per_s"] / statistics.mean(o[f"{k}_per_s"] for o in offs) for k in ("inserts", "samples")}})
    ratio = {k: (statistics.median(p[k] for p in pairs) if pairs else None) for k in ("inserts", "samples")}
    worst = {k: (min(p[k] for p in pairs) if pairs else None) for k in ("inserts", "samples")}
    # The noise floor: each window without the stalled reader against the next one without it.
    offs = [w for w in windows if w["valid"] and not w["on"]]
    noise = [{k: b[f"{k}_per_s"] / a[f"{k}_per_s"] for k in ("inserts", "samples")} for a, b in zip(offs, offs[1:])]
    return {"windows": windows, "pairs": pairs, "median_ratio": ratio, "min_ratio": worst, "excluded": hole,
            "off_to_off": noise}


def memory(soak, result: dict) -> dict:
    """Per server incarnation: the median RSS over the first ``span`` seconds after its
    warm-up against the median over its last ``span`` seconds of load (``span``: 15% of that
    time, at least 5 s), for VmRSS (the criterion) and RssAnon (the heap alone: VmRSS also
    counts the store's shared memory, a constant that dilutes the heap's growth)."""
    plan = soak.plan
    servers = soak.events["servers"]
    ends = [(result["crash"]["t_kill"] - soak.t0) if result["crash"] else plan.seconds, plan.seconds]
    out = []
    for i, srv in enumerate(servers[:2]):
        start, end = srv["t_ready"] - soak.t0, ends[i] if i < len(ends) else plan.seconds
        warm = start + plan.warmup
        span = max(5.0, 0.15 * (end - warm))
        r = {"pid": srv["pid"], "ready_s": round(start, 2), "warm_s": round(warm, 2), "end_s": round(end, 2)}
        for key, name in (("VmRSS", ""), ("RssAnon", "heap_")):
            pts = [(s["t"], s[key]) for s in soak.samples if s.get("pid") == srv["pid"] and key in s]
            base = [v for t, v in pts if warm <= t < warm + span]
            last = [v for t, v in pts if end - span <= t < end]
            if base and last and end - warm >= 2 * span:
                r.update({f"{name}baseline_kib": statistics.median(base), f"{name}final_kib": statistics.median(last),
                          f"{name}peak_kib": max(v for t, v in pts if warm <= t < end),
                          f"{name}growth": statistics.median(last) / statistics.median(base) - 1.0})
        out.append(r)
    return {"incarnations": out,
            "growth": max((r["growth"] for r in out if "growth" in r), default=None),
            "heap_growth": max((r["heap_growth"] for r in out if "heap_growth" in r), default=None)}


def descriptors(soak, result: dict) -> dict:
    servers = soak.events["servers"]
    base = servers[0]["status_at_ready"]["fds"]
    after_restart = servers[1]["status_at_ready"]["fds"] if len(servers) > 1 else None
    fds = [s["fds"] for s in soak.samples if "fds" in s]
    return {"baseline": base, "at_restart": after_restart, "peak": max(fds, default=None),
            "final": result["fds_settled"]["fds"], "settled_after_s": result["fds_settled"]["after_s"]}


def waits(soak, result: dict, records: dict) -> dict:
    """Each kind of call: how many, how many failed (and of those, how many away from the
    server's crash: from 1 s before the SIGKILL to ``retry_after`` + 2 s after the restart),
    the longest wait against the call's timeout or budget."""
    crash = result["crash"]
    lo, hi = (crash["t_kill"] - 1.0, crash["t_dead"] + crash["restart_s"] + soak.plan.retry_after + 2.0) \
        if crash else (np.inf, -np.inf)
    calls = records["calls"] + [{"kind": "wrong_token", "wait": t["seconds"], "limit": t["limit"], "ok": True}
                                for t in soak.events["tokens"]]
    by = {}
    for c in calls:
        k = by.setdefault(c["kind"], {"calls": 0, "failed": 0, "failed_away_from_crash": 0, "limit_s": c["limit"],
                                       "max_wait_s": 0.0, "over_limit": 0, "over_limit_plus_grace": 0})
        k["calls"] += 1
        k["failed"] += not c["ok"]
        k["failed_away_from_crash"] += not c["ok"] and not (lo <= c.get("start", lo) + c["wait"] <= hi)
        k["max_wait_s"] = max(k["max_wait_s"], c["wait"])
        k["over_limit"] += c["wait"] > c["limit"]
        k["over_limit_plus_grace"] += c["wait"] > c["limit"] + GRACE_S
    for k in by.values():
        k["max_wait_s"] = round(k["max_wait_s"], 3)
    return {"by_kind": by, "violations": sum(k["over_limit_plus_grace"] for k in by.values()),
            "strictly_over": sum(k["over_limit"] for k in by.values()), "hangs": soak.events["hangs"],
            "grace_s": GRACE_S, "failed_away_from_crash": sum(k["failed_away_from_crash"] for k in by.values())}


def faults_summary(soak, ledger_totals: dict, records: dict) -> dict:
    ev = soak.events
    mal = {}
    for m in ev["malformed"]:
        k = mal.setdefault(m["kind"], {"count": 0, "closed_by_server": 0, "errors": 0})
        k["count"] += 1
        k["closed_by_server"] += m["closed_by_server"]
        k["errors"] += m["error"] is not None
    tokens = {}
    for t in ev["tokens"]:
        tokens[t["outcome"]] = tokens.get(t["outcome"], 0) + 1
    # A writer killed mid-batch leaves a begin record without an outcome: the kill landed mid-work.
    open_ends = {(b["slot"], b["inc"]) for b in records["batches"] if b["status"] == 0}
    writer_kills = [k for k in ev["kills"] if k["role"] == "writer"]
    panics = []
    for srv in ev["servers"]:
        with open(srv["log"]) as f:
            text = f.read()
        if "panicked" in text or "Traceback" in text:
            panics.append(srv["log"])
    refused = sum(c["error"] == "Unauthenticated" for c in records["calls"])
    return {"client_kills": len(ev["kills"]), "own_calls_refused": refused, "writer_kills": len(writer_kills),
            "writer_kills_mid_batch": sum((k["slot"], k["inc"]) in open_ends for k in writer_kills),
            "malformed": mal, "server_deaths": ev["server_deaths"],
            "tokens": tokens, "hangs": len(ev["hangs"]), "stragglers": ev["stragglers"],
            "leftovers": ev["leftovers"], "server_logs_with_panics": panics}


# --- criteria ---------------------------------------------------------------------------------
def criteria(rep: dict) -> dict:
    th = rep["thresholds"]
    led, mem, fds, w, st, fa = (rep["ledger"], rep["rss"], rep["fds"], rep["waits"], rep["stall"], rep["faults"])
    c = {}
    c["ledger"] = {"pass": led["error_count"] == 0 and not fa["server_logs_with_panics"] and not fa["server_deaths"],
                   "value": f"{led['error_count']} ledger errors, {len(fa['server_logs_with_panics'])} server panics, "
                            f"{len(fa['server_deaths'])} server deaths but the planned one"}
    c["auth"] = {"pass": fa["tokens"].get("accepted", 0) == 0 and fa["own_calls_refused"] == 0,
                 "value": f"{fa['tokens'].get('refused', 0)} wrong tokens refused, {fa['tokens'].get('accepted', 0)} "
                          f"accepted; {fa['own_calls_refused']} calls with the right token refused"}
    g = mem["growth"]
    c["rss"] = {"pass": g is not None and g < th["rss_growth"],
                "value": "n/a" if g is None else f"{100 * g:+.1f}% (limit {100 * th['rss_growth']:.0f}%)"}
    c["fds"] = {"pass": fds["final"] is not None and fds["final"] <= fds["baseline"] + th["fd_slack"],
                "value": f"final {fds['final']} vs baseline {fds['baseline']} (peak {fds['peak']})"}
    c["timeouts"] = {"pass": w["violations"] == 0 and not w["hangs"],
                     "value": f"{w['violations']} calls past timeout + {w['grace_s']} s, "
                              f"{w['strictly_over']} past it at all, {len(w['hangs'])} hangs"}
    c["calls_fail_only_in_the_crash"] = {"pass": w["failed_away_from_crash"] == 0,
                                         "value": f"{w['failed_away_from_crash']} failed calls away from the crash"}
    r = st["median_ratio"]
    ok = all(v is not None and v >= th["stall_ratio"] for v in r.values())
    lo = st["min_ratio"]
    c["stalled_reader"] = {"pass": ok, "value": "n/a" if r["inserts"] is None else
                           f"inserts x{r['inserts']:.2f}, samples x{r['samples']:.2f} with it (median of "
                           f"{len(st['pairs'])} windows, each against its neighbours without; lowest x{lo['inserts']:.2f}"
                           f", x{lo['samples']:.2f}; limit x{th['stall_ratio']:.2f})"}
    if rep["plan"].get("durable"):
        r = led["restored"] or {}
        lost = r.get("lost_in_crash_allowed", 0)
        c["durable_no_flushed_item_lost"] = {
            "pass": bool(r) and r.get("errors", 1) == 0 and lost == 0,
            "value": f"{r.get('committed_epoch1', 0):,} items flushed before the server SIGKILL: "
                     f"{r.get('in_restored', 0):,} in the reopened store, {r.get('evicted_before_request', 0):,} evicted "
                     f"by FIFO, {lost} lost; {r.get('errors', 'no')} ledger errors at the kill"}
    c["clean_exit"] = {"pass": not fa["leftovers"] and not fa["stragglers"],
                       "value": f"{len(fa['leftovers'])} leftover files, {len(fa['stragglers'])} processes "
                                "that did not stop on SIGTERM"}
    return c


def analyze(rp, soak, result: dict) -> dict:
    records = read_records(soak.records)
    led = check_ledger(rp, soak, result, records)
    tp = throughput(soak, records)
    rep = {"plan": dict(vars(soak.plan)), "server_env": soak.server_env, "thresholds": thresholds(soak.plan.seconds), "ledger": led,
           "stall": stall_effect(soak, result, tp), "rss": memory(soak, result), "fds": descriptors(soak, result),
           "waits": waits(soak, result, records), "faults": faults_summary(soak, led["totals"], records),
           "crash": {k: (round(v - soak.t0, 3) if k.startswith("t_") else v)
                     for k, v in (result["crash"] or {}).items()},
           "final_info": result["final"]["info"],
           "series": {"t": list(range(len(tp["inserts"]))), "inserts": tp["inserts"], "samples": tp["samples"],
                      "updates": tp["updates"], "server": soak.samples},
           "kills": soak.events["kills"], "malformed": soak.events["malformed"], "tokens": soak.events["tokens"],
           "servers": [{k: (round(v - soak.t0, 3) if k.startswith("t_") else v) for k, v in s.items()}
                       for s in soak.events["servers"]]}
    rep["criteria"] = criteria(rep)
    rep["pass"] = all(c["pass"] for c in rep["criteria"].values())
    return rep


# --- outputs ----------------------------------------------------------------------------------
def plot(rep: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = rep["series"]
    fig, ax = plt.subplots(3, 1, figsize=(11, 8.5), sharex=True)
    ax[0].plot(s["t"], np.asarray(s["inserts"]) / 1e3, label="inserts (committed items)/s", lw=1)
    ax[0].plot(s["t"], np.asarray(s["samples"]) / 1e3, label="sampled items/s", lw=1)
    ax[0].set_ylabel("thousand items / s")
    srv = [x for x in s["server"] if "VmRSS" in x]
    t = [x["t"] for x in srv]
    ax[1].plot(t, [x["VmRSS"] / 1024 for x in srv], ".", ms=2, label="VmRSS")
    ax[1].plot(t, [x["RssAnon"] / 1024 for x in srv], ".", ms=2, label="RssAnon (heap)")
    ax[1].plot(t, [x["RssShmem"] / 1024 for x in srv], ".", ms=2, label="RssShmem (store)")
    ax[1].set_ylabel("server MiB")
    ax[2].plot(t, [x["fds"] for x in srv], ".", ms=2, label="open descriptors")
    ax[2].axhline(rep["fds"]["baseline"], color="grey", ls=":", lw=1, label="baseline (no client)")
    ax[2].set_ylabel("server fds")
    ax[2].set_xlabel("seconds since the server first started")
    for a in ax:
        for w in rep["stall"]["windows"]:
            if w["on"]:
                a.axvspan(w["start"], w["end"], color="orange", alpha=0.12, lw=0)
        if rep["crash"]:
            a.axvline(rep["crash"]["t_kill"], color="red", lw=1)
        for k in rep["kills"]:
            a.axvline(k["t"], color="black", alpha=0.15, lw=0.5)
        a.legend(loc="upper right", fontsize=7)
        a.grid(alpha=0.3)
    ax[0].set_title("Soak: throughput, server RSS and descriptors (orange: stalled reader; red: server SIGKILL; "
                    "grey: client SIGKILLs)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def markdown(rep: dict, stem: str) -> str:
    p, led, st, fa = rep["plan"], rep["ledger"], rep["stall"], rep["faults"]
    h = rep.get("host", {})
    lines = [f"# Soak `{stem}`: {'PASS' if rep['pass'] else 'FAIL'}", "",
             f"{p['seconds']:.0f} s, seed {p['seed']}, {h.get('cpu_model', '?')} x {h.get('cpus', '?')}; "
             f"table max_size {p['max_size']} (FIFO), store {p['max_size'] * p['capacity_factor']} steps of 4 KB, "
             f"a checkpoint every {p['checkpoint_every']:.1f} s, server SIGKILL at {rep['crash'].get('t_kill')} s "
             f"(back in {rep['crash'].get('restart_s')} s)"
             + (f"; server environment {rep['server_env']}" if rep.get("server_env") else "") + ".", "",
             "| criterion | result | |", "|---|---|---|"]
    for name, c in rep["criteria"].items():
        lines.append(f"| {name} | {c['value']} | {'pass' if c['pass'] else '**FAIL**'} |")
    t = led["totals"]
    r = led["restored"] or {}
    lines += ["", f"**Ledger.** {t['items_begun']:,} items begun, {t['items_committed']:,} committed (flush "
              f"returned), {t['items_failed']:,} in failed batches, {t['items_unknown']:,} in batches cut by a "
              f"SIGKILL, {t['items_reported_lost']:,} reported lost by the pool. {len(led['checkpoints'])} "
              f"checkpoints checked. Crash: {r.get('committed_epoch1', 0):,} items committed before it; "
              f"`{r.get('name')}` held {r.get('in_restored', 0):,}, {r.get('evicted_before_request', 0):,} had been "
              f"evicted by FIFO before it was requested, {r.get('lost_in_crash_allowed', 0):,} were committed after "
              f"it was requested (lost with the crash, allowed). Final checkpoint: "
              f"{led['final'].get('size', 0):,} items, {led['final'].get('evicted_by_rule', 0):,} committed items of "
              "its epoch evicted by FIFO.", ""]
    ins = [w["inserts_per_s"] for w in st["windows"] if w["valid"] and not w["on"]]
    smp = [w["samples_per_s"] for w in st["windows"] if w["valid"] and not w["on"]]
    if ins:
        lines += [f"**Throughput** (windows without the stalled reader, median): {statistics.median(ins):,.0f} "
                  f"committed items/s, {statistics.median(smp):,.0f} sampled items/s.", ""]
    if st["off_to_off"]:
        spread = [x["inserts"] for x in st["off_to_off"]]
        lines += [f"Windows without the stalled reader differ from the next such window by x{min(spread):.2f} "
                  f"to x{max(spread):.2f} in inserts/s (the noise floor of the comparison).", ""]
    lines += ["| window (s) | stalled reader | inserts/s | samples/s |", "|---|---|---|---|"]
    for w in st["windows"]:
        if w["valid"]:
            cut = " (less the crash)" if w["measured_s"] < w["end"] - w["from"] - 0.01 else ""
            lines.append(f"| {w['from']:.0f}-{w['end']:.0f}{cut} | {'on' if w['on'] else 'off'} | "
                         f"{w['inserts_per_s']:,.0f} | {w['samples_per_s']:,.0f} |")
        else:
            lines.append(f"| {w['start']:.0f}-{w['end']:.0f} | {'on' if w['on'] else 'off'} | (too little left "
                         "besides the crash) | |")
    lines += ["", "| server | VmRSS after warm-up -> end (MiB) | growth | heap (RssAnon) | heap growth |",
              "|---|---|---|---|---|"]
    for i, m in enumerate(rep["rss"]["incarnations"]):
        if "growth" in m:
            lines.append(f"| {'first' if i == 0 else 'restarted'} ({m['warm_s']:.0f}-{m['end_s']:.0f} s) | "
                         f"{m['baseline_kib'] / 1024:.0f} -> {m['final_kib'] / 1024:.0f} | {100 * m['growth']:+.1f}% | "
                         f"{m.get('heap_baseline_kib', 0) / 1024:.0f} -> {m.get('heap_final_kib', 0) / 1024:.0f} | "
                         f"{100 * m.get('heap_growth', 0):+.1f}% |")
    lines += ["", "| call | calls | failed (away from the crash) | limit (s) | max wait (s) |", "|---|---|---|---|---|"]
    for k, v in rep["waits"]["by_kind"].items():
        lines.append(f"| {k} | {v['calls']:,} | {v['failed']:,} ({v['failed_away_from_crash']:,}) | {v['limit_s']:g} | "
                     f"{v['max_wait_s']:.3f} |")
    mal = ", ".join(f"{k} {v['count']}" for k, v in sorted(fa["malformed"].items()))
    lines += ["", f"**Faults.** {fa['client_kills']} client SIGKILLs ({fa['writer_kills']} writers, "
              f"{fa['writer_kills_mid_batch']} of them mid-batch); malformed connections: {mal}; wrong tokens: "
              f"{fa['tokens']}; one server SIGKILL.", ""]
    if led["errors"]:
        lines += ["Ledger errors:", ""] + [f"- {e}" for e in led["errors"][:20]] + [""]
    return "\n".join(lines) + "\n"
