"""In-network gradient aggregation (issue 15): the aggregation daemon (``reprise.aggregate``, in
the hub's namespace like a switch) against a TCP parameter server and gloo's ring all-reduce, in
the same run on the same namespaces.

    python -m benchmarks.innetwork.aggregation                  # ~9 minutes on 2 busy cores (root)
    python -m benchmarks.innetwork.aggregation --quick          # smoke test, ~15-30 s
    python -m benchmarks.innetwork.aggregation --workers 4 --sizes 40K,158K --rate 10gbit --delay-us 50

Topology (``netns.Network``): worker namespaces ``w0..w7`` and a parameter-server namespace
``ps`` are leaves of a star around the hub ``sw``; each leaf has its own veth pair to the hub.

* **daemon** (``float32`` and ``int32`` fixed-point jobs): one ``Daemon`` in the hub's namespace
  (``agg_daemon.py``); each worker sends to the hub's address on its own link: 1 link each way
  (2 link crossings per round trip, iSwitch's path).
* **ps**: ``param_server.py`` in the ``ps`` leaf: worker -> hub -> ps -> hub -> worker, 4 link
  crossings (the path iSwitch compares against).
* **gloo**: ``torch.distributed.all_reduce`` (SUM, gloo's ring) across the worker namespaces;
  each ring step crosses 2 links (leaf -> hub -> leaf); the TCPStore rendezvous is on ``w0``.

Links: ``tc tbf`` on both ends of every leaf's veth (``Network.shape``), rate 1 and 10 Gbit/s,
burst max(64 KB, 100 us at the rate) (``netns``'s default, 10 ms at the rate, would let a whole
gradient of up to 12.5 MB pass unshaped). This VM's veth, with 2 cores, does not reach 10
Gbit/s: that rate is close to unshaped.

Per-hop delay (``--delay-us D``, default 100; 0 skips it): netem is missing from this kernel, so
a user-space relay (``relay.py``, one per worker namespace) holds traffic D (+- ``--jitter-us``)
per link crossed, in each direction: the daemon's UDP goes through the relay's UDP rule
(hub = 1 hop: D each way); the worker's TCP (PS, gloo, the store) is sent to the relay by an
nftables ``redirect`` (transparent, ``SO_ORIGINAL_DST``) and held 2 hops (another leaf, through
the hub: 2D each way). So a daemon round trip gets 2D, a PS round trip 4D and every ring step 2D,
as D per link would. The relay is Python (its timers are ~20-30 us late on an idle machine, much
more when its CPU is shared with the workers, and it costs CPU per datagram), so the delay section
runs only the latency-bound sizes (``--delay-sizes``, default 40K,158K) at ``--delay-workers``
(default 4) and 10 Gbit/s, and first runs the same point with the relays in place holding 0 us
(the control: what the relays themselves cost each system), then holding D.

Every worker (``agg_rank.py``) opens every system and runs them interleaved (blocks of rounds,
system order rotating each block). A round's latency is from the moment the last worker called
all-reduce to the moment the last worker had the sum (``max end - max start`` over workers; one
monotonic clock for every namespace). Goodput = gradient bytes / median latency.

Loopback (no namespaces, no shaping): the daemon alone, int32 jobs: (1) goodput: aggregated
input bytes (workers x gradient bytes per round) per CPU-second of the daemon's process (from
``/proc/<pid>/stat``; the issue's goal is >= 1 GB/s per core) and per wall second; (2) loss:
``Daemon(drop_rate=0.01)`` against a lossless daemon, interleaved: p99 with 1% loss against the
lossless median (goal <= 3x).

Without namespaces (not root) the matrix runs on loopback addresses, unshaped, without the delay
section, and says so. Writes ``benchmarks/out/innetwork-aggregation-<date>.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

from benchmarks.common.config import Config
from benchmarks.common.driver import OUT, command_line, start_report, write_outputs
from benchmarks.common.processes import ROOT, free_port, kill, stop_all
from benchmarks.innetwork import agg_daemon
from benchmarks.innetwork.agg_report import build_markdown, parse_size, summarize_config
from benchmarks.innetwork.relay import redirect_rules

FULL = dict(workers=[2, 4, 8], sizes=["40K", "158K", "3M", "6M"], rates=["1gbit", "10gbit"],
            delay_us=100.0, jitter_us=10.0, delay_workers=[4], delay_sizes=["40K", "158K"],
            delay_rate="10gbit", relay_control=True, rounds_small=40, rounds_large=6, warmup=2, blocks=2,
            loop_workers=4, loop_sizes=["158K", "3M", "6M"], loop_rounds_small=100, loop_rounds_large=20,
            loss_sizes=["40K", "158K", "3M"], loss_rounds_small=200, loss_rounds_large=20,
            loss_rate=0.01, loss_fast_rto_ms=2.0, int32_scale=65536.0, loop_segments=[256, 8192], call_timeout_s=60.0, set_timeout_s=240.0)
QUICK = dict(workers=[], sizes=["40K", "158K"], rates=["1gbit"], delay_workers=[2], delay_sizes=["40K", "158K"],
             relay_control=False, jitter_us=0.0,  # the daemon mishandles reordering (RESULTS.md, issue 15)
             rounds_small=5, rounds_large=2, warmup=1, blocks=1, loop_workers=2, loop_sizes=["158K"],
             loop_rounds_small=10, loop_rounds_large=2, loss_sizes=["40K"], loss_rounds_small=20,
             loss_rounds_large=4, loop_segments=[256], call_timeout_s=30.0, set_timeout_s=60.0)
# --quick runs one configuration: with namespaces the delay one (the same code path as the matrix's,
# plus the relays), without them the matrix's on loopback.
LARGE = 1_000_000               # sizes from here on use the "large" round counts
SYSTEMS = ["daemon-f32", "daemon-i32", "ps", "gloo"]
GLOO_PORT = 29611               # the TCPStore's port on w0 (a fresh namespace: always free)
RELAY_TCP_PORT = 15011          # the transparent relay's port in each worker namespace
HUB, PS_HOST = "sw", "ps"
TOKEN = "agg-bench"             # the daemon's token (required beyond loopback); sent in each Join
DRAIN = 0.5                     # seconds between configurations, so one's stragglers end first


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def python() -> str:
    return sys.executable


def child_env() -> dict:
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = "1"
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


# --- child processes ------------------------------------------------------------------------
class Child:
    """A process started in a host (``net.popen``) that prints ``READY <what>`` first and one
    JSON line last; its stderr goes to ``log_path``."""

    def __init__(self, net, host: str | None, argv: list[str], log_path: str):
        self.log = open(log_path, "ab")
        kw = dict(stdout=subprocess.PIPE, stdin=subprocess.PIPE, stderr=self.log, cwd=ROOT,
                  env=child_env(), text=True)
        if net is None:
            self.proc = subprocess.Popen(argv, start_new_session=True, **kw)
        else:
            self.proc = net.popen(host, argv, **kw)
        self.lines: queue.Queue = queue.Queue()
        self.last = ""
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def ready(self, timeout: float = 60.0) -> str:
        end = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.01, end - time.monotonic()))
            except queue.Empty:
                raise TimeoutError(f"{self.proc.args}: no READY line within {timeout:.0f} s") from None
            if line is None:
                raise RuntimeError(f"{self.proc.args} exited {self.proc.wait()} before READY "
                                   f"(see {self.log.name})")
            if line.startswith("READY "):
                return line[6:]

    def stop(self, timeout: float = 10.0, signal_first: bool = True) -> dict:
        """SIGTERM (unless ``signal_first`` is False: wait for it to end by itself), then the last
        JSON line it printed."""
        stop_all([self.proc], timeout, signal.SIGTERM if signal_first else None)
        out = {}
        end = time.monotonic() + 2.0
        while time.monotonic() < end:
            try:
                line = self.lines.get(timeout=0.2)
            except queue.Empty:
                continue
            if line is None:
                break
            if line.startswith("{"):
                try:
                    out = json.loads(line)
                except ValueError:
                    pass
        self.log.close()
        return out


# --- one configuration --------------------------------------------------------------------
def rounds_for(cfg, sizes: list[int], small: int, large: int) -> dict:
    return {str(s): (large if s >= LARGE else small) for s in sizes}


def run_ranks(net, hosts: list[str | None], systems_for_rank, sizes: list[int], rounds: dict,
              cfg, workdir: str, label: str) -> tuple[list[dict], dict]:
    """Start one ``agg_rank`` per host, wait (with a deadline), return their outputs and what the
    driver saw (exit codes, wall time)."""
    world = len(hosts)
    procs = []
    t0 = time.monotonic()
    for r, host in enumerate(hosts):
        spec = {"rank": r, "world": world, "systems": systems_for_rank(r), "sizes": sizes,
                "rounds": rounds, "warmup": cfg.warmup, "blocks": cfg.blocks, "dir": workdir,
                "call_timeout_s": cfg.call_timeout_s, "set_timeout_s": cfg.set_timeout_s}
        path = os.path.join(workdir, f"spec{r}.json")
        with open(path, "w") as f:
            json.dump(spec, f)
        argv = [python(), "-m", "benchmarks.innetwork.agg_rank", path]
        logf = open(os.path.join(workdir, f"rank{r}.log"), "ab")
        kw = dict(stdout=subprocess.DEVNULL, stderr=logf, stdin=subprocess.DEVNULL, cwd=ROOT, env=child_env())
        p = net.popen(host, argv, **kw) if host is not None else \
            subprocess.Popen(argv, start_new_session=True, **kw)
        procs.append((p, logf))
    n_systems = len(systems_for_rank(0))
    budget = 60 + n_systems * cfg.blocks * 2 * cfg.set_timeout_s / max(1, cfg.blocks)
    killed = stop_all([p for p, _ in procs], t0 + budget - time.monotonic(), sig=None)
    seen = {"wall_s": round(time.monotonic() - t0, 1), "exit": [p.returncode for p, _ in procs]}
    if killed:
        seen["killed"] = True
    for _, logf in procs:
        logf.close()
    outs = []
    for r in range(world):
        path = os.path.join(workdir, f"rank{r}.json")
        try:
            with open(path) as f:
                outs.append(json.load(f))
        except (OSError, ValueError):
            with open(os.path.join(workdir, f"rank{r}.log"), errors="replace") as f:
                tail = f.read()[-3000:]
            outs.append({"rank": r, "errors": {"*": f"no result (exit {seen['exit'][r]}): {tail}"},
                         "results": {}, "checks": {}})
    if seen.get("killed"):
        log(f"  {label}: WARNING: workers killed after {budget:.0f} s")
    return outs, seen


def network_config(net, n: int, rate: str, delay_us: float, sizes: list[int], systems: list[str],
                   cfg, logdir: str, stem: str, relay: bool = False) -> dict:
    """One (rate, workers, delay) point: the daemon in the hub, the PS in ``ps``, N workers; with
    ``relay`` (or a delay) every worker's traffic goes through its relay, held ``delay_us`` per hop."""
    relay = relay or delay_us > 0
    label = f"rate {rate}, {n} workers" + (f", relays holding {delay_us:g} us/hop" if relay else "")
    log(f"== {label}: sizes {sizes}, systems {systems}")
    hosts = [f"w{i}" for i in range(n)]
    workdir = tempfile.mkdtemp(prefix="agg-")
    tag = f"{stem}-{rate}-{n}w" + (f"-relay{delay_us:g}" if relay else "")
    entry = {"rate": rate, "workers": n, "delay_us": delay_us, "relay": relay, "sizes": sizes, "systems": {},
             "namespaced": net.namespaced}
    children, relays = [], []
    try:
        endpoints: dict[str, dict] = {}
        daemon = ps = None
        if any(s.startswith("daemon") for s in systems):
            bind = "0.0.0.0:0" if net.namespaced else f"{net.address(HUB)}:0"
            daemon = Child(net, HUB, [python(), "-m", "benchmarks.innetwork.agg_daemon", "--address", bind,
                                      "--token", TOKEN],
                           os.path.join(logdir, f"{tag}-daemon.log"))
            children.append(daemon)
            port = int(daemon.ready().rpartition(":")[2])
        if "ps" in systems:
            bind = "0.0.0.0:0" if net.namespaced else f"{net.address(PS_HOST)}:0"
            ps = Child(net, PS_HOST, [python(), "-m", "benchmarks.innetwork.param_server", "--address", bind,
                                      "--workers", str(n), "--accept-timeout", str(cfg.call_timeout_s * 2)],
                       os.path.join(logdir, f"{tag}-ps.log"))
            children.append(ps)
            ps_port = int(ps.ready().rpartition(":")[2])
            endpoints["ps"] = {"kind": "ps", "address": f"{net.address(PS_HOST)}:{ps_port}"}
        gloo_port = GLOO_PORT if net.namespaced else free_port(net.address(hosts[0]))
        daemon_addr = {}
        for i, h in enumerate(hosts):
            if daemon is None:
                break
            target = f"{net.address(HUB, facing=h) if net.namespaced else net.address(HUB)}:{port}"
            daemon_addr[i] = target
            if relay:
                hub_ips = [net.address(HUB, facing=x) for x in hosts + [PS_HOST]]
                argv = [python(), "-m", "benchmarks.innetwork.relay", "--delay-us", str(delay_us),
                        "--jitter-us", str(cfg.jitter_us if delay_us else 0.0), "--seed", str(1000 + i),
                        "--udp", f"127.0.0.1:0={target}@1",
                        "--tcp", f"127.0.0.1:{RELAY_TCP_PORT}=transparent@2"]
                for ip in hub_ips:
                    argv += ["--hops", f"{ip}=1"]
                relay = Child(net, h, argv, os.path.join(logdir, f"{tag}-relay{i}.log"))
                relays.append(relay)
                bound = json.loads(relay.ready())
                daemon_addr[i] = bound["udp"][0]
        if relay and ("ps" in systems or "gloo" in systems):
            for h in hosts:
                net.run(h, ["nft", "-f", "-"], input=redirect_rules(RELAY_TCP_PORT), text=True,
                        check=True, capture_output=True, timeout=15)

        def systems_for_rank(r: int) -> dict:
            out = {}
            for s in systems:
                if s == "daemon-f32":
                    out[s] = {"kind": "daemon", "address": daemon_addr[r], "job": 1, "dtype": "float32",
                              "token": TOKEN}
                elif s == "daemon-i32":
                    out[s] = {"kind": "daemon", "address": daemon_addr[r], "job": 2, "dtype": "int32",
                              "scale": cfg.int32_scale, "token": TOKEN}
                elif s == "ps":
                    out[s] = endpoints["ps"]
                elif s == "gloo":
                    out[s] = {"kind": "gloo", "master": f"{net.address(hosts[0])}:{gloo_port}",
                              "iface": net.interface(hosts[r]) if net.namespaced else "lo"}
            return out

        rounds = rounds_for(cfg, sizes, cfg.rounds_small, cfg.rounds_large)
        ranks, seen = run_ranks(net, hosts, systems_for_rank, sizes, rounds, cfg, workdir, label)
        entry["workers_seen"] = seen
        if daemon is not None:
            entry["daemon_process"] = daemon.stop()
        if ps is not None:
            entry["ps_process"] = ps.stop(timeout=10.0, signal_first=False)
        entry["relays"] = [r.stop() for r in relays]
        entry["systems"] = summarize_config(ranks, systems, sizes)
    except Exception as e:  # noqa: BLE001 - recorded; the other points still run
        log(f"  {label}: ERROR {type(e).__name__}: {e}")
        entry["error"] = f"{type(e).__name__}: {e}"
    finally:
        for c in children + relays:
            if c.proc.poll() is None:
                kill(c.proc)
        if relay and net.namespaced:
            for h in hosts:
                net.run(h, ["nft", "delete", "table", "ip", "aggrelay"], capture_output=True, timeout=15)
        for r in range(n):
            src = os.path.join(workdir, f"rank{r}.log")
            if os.path.exists(src):
                shutil.copy(src, os.path.join(logdir, f"{tag}-rank{r}.log"))
        shutil.rmtree(workdir, ignore_errors=True)
    print_point(entry)
    time.sleep(DRAIN)
    return entry


def print_point(entry: dict) -> None:
    for name, s in entry.get("systems", {}).items():
        if "error" in s:
            log(f"  {name}: ERROR {s['error'].splitlines()[0][:300]}")
        for size, st in s.get("sizes", {}).items():
            if "p50_us" in st:
                log(f"  {name:11s} {size:>9s}: p50 {st['p50_us']:9.0f} us  p99 {st['p99_us']:9.0f} us  "
                    f"{st['goodput_gbit_s']:.3f} Gbit/s")


# --- loopback: goodput per daemon core, and loss ----------------------------------------------
def loopback_goodput(cfg, logdir: str, stem: str) -> dict:
    """The daemon alone on 127.0.0.1, N workers, int32 jobs, once per segment size: aggregated
    input bytes per CPU-second of the daemon's process."""
    out = {"workers": cfg.loop_workers, "sizes": [parse_size(s) for s in cfg.loop_sizes], "dtype": "int32",
           "by_segment": {}}
    for seg in cfg.loop_segments:
        out["by_segment"][str(seg)] = _goodput_one(cfg, seg, logdir, stem)
    return out


def _goodput_one(cfg, seg: int, logdir: str, stem: str) -> dict:
    n, sizes = cfg.loop_workers, [parse_size(s) for s in cfg.loop_sizes]
    log(f"== loopback goodput: {n} workers, daemon int32, {seg} values per packet, sizes {cfg.loop_sizes}")
    workdir = tempfile.mkdtemp(prefix="agg-")
    entry = {"workers": n, "sizes": sizes, "dtype": "int32", "segment_values": seg}
    daemon = Child(None, None, [python(), "-m", "benchmarks.innetwork.agg_daemon", "--address", "127.0.0.1:0"],
                   os.path.join(logdir, f"{stem}-goodput-seg{seg}-daemon.log"))
    try:
        addr = daemon.ready()
        pid = daemon.proc.pid
        rounds = rounds_for(cfg, sizes, cfg.loop_rounds_small, cfg.loop_rounds_large)
        ep = {"daemon-i32": {"kind": "daemon", "address": addr, "job": 7, "dtype": "int32",
                             "scale": cfg.int32_scale, "segment_values": seg}}
        sampler = agg_daemon.CpuSampler(pid)
        cpu0, t0 = agg_daemon.cpu_seconds(pid), time.monotonic()
        ranks, seen = run_ranks(None, [None] * n, lambda r: ep, sizes, rounds, cfg, workdir, "loopback goodput")
        cpu1, t1 = agg_daemon.cpu_seconds(pid), time.monotonic()
        sampler.stop()
        entry["workers_seen"] = seen
        entry["systems"] = summarize_config(ranks, list(ep), sizes)
        calls = {str(s): len(ranks[0].get("results", {}).get("daemon-i32", {}).get(str(s), {}).get("t", []))
                 + max(1, cfg.warmup) for s in sizes}
        nbytes = sum(int(s) * c * n for s, c in calls.items())
        cpu = cpu1 - cpu0
        entry.update(input_bytes=nbytes, daemon_cpu_s=cpu, wall_s=t1 - t0,
                     gb_per_cpu_s=nbytes / cpu / 1e9 if cpu > 0 else None)
        per_size = {}
        for s in sizes:
            st = entry["systems"]["daemon-i32"].get("sizes", {}).get(str(s), {})
            if "p50_us" not in st:
                continue
            ts = [r["results"]["daemon-i32"][str(s)]["t"] for r in ranks]
            w0, w1 = min(t[0][0] for t in ts), max(t[-1][1] for t in ts)
            window_bytes = int(s) * n * min(len(t) for t in ts)
            cpu_w = sampler.between(w0, w1)
            per_size[str(s)] = {"input_gb_per_wall_s": int(s) * n / (st["p50_us"] * 1e-6) / 1e9,
                                "window_s": w1 - w0, "window_daemon_cpu_s": cpu_w,
                                "window_gb_per_cpu_s": window_bytes / cpu_w / 1e9 if cpu_w else None,
                                "window_daemon_cores": cpu_w / (w1 - w0) if cpu_w else None}
        entry["per_size"] = per_size
        entry["daemon_process"] = proc = daemon.stop()
        stats = proc.get("stats", {})
        if stats.get("busy_ns") and stats.get("values_aggregated"):
            entry["stats_gb_per_busy_s"] = stats["values_aggregated"] * 4 / stats["busy_ns"]
    except Exception as e:  # noqa: BLE001
        log(f"  loopback goodput: ERROR {type(e).__name__}: {e}")
        entry["error"] = f"{type(e).__name__}: {e}"
    finally:
        if daemon.proc.poll() is None:
            kill(daemon.proc)
        shutil.rmtree(workdir, ignore_errors=True)
    print_point(entry)
    if entry.get("gb_per_cpu_s"):
        log(f"  {entry['input_bytes'] / 1e9:.3g} GB aggregated in {entry['daemon_cpu_s']:.2f} daemon CPU-s: "
            f"{entry['gb_per_cpu_s']:.2f} GB/s per core")
    return entry


def loopback_loss(cfg, logdir: str, stem: str) -> dict:
    """Two daemons on loopback, one dropping ``loss_rate`` of what it receives, workers
    interleaving them: p99 with loss against the lossless median."""
    n, sizes = cfg.loop_workers, [parse_size(s) for s in cfg.loss_sizes]
    log(f"== loopback loss: {n} workers, drop_rate {cfg.loss_rate}, sizes {cfg.loss_sizes}")
    workdir = tempfile.mkdtemp(prefix="agg-")
    entry = {"workers": n, "sizes": sizes, "drop_rate": cfg.loss_rate, "dtype": "int32"}
    daemons = {}
    try:
        for name, rate in (("lossless", 0.0), ("loss", cfg.loss_rate)):
            daemons[name] = Child(None, None, [python(), "-m", "benchmarks.innetwork.agg_daemon", "--address",
                                               "127.0.0.1:0", "--drop-rate", str(rate), "--seed", "15"],
                                  os.path.join(logdir, f"{stem}-loss-{name}.log"))
        addrs = {name: d.ready() for name, d in daemons.items()}
        eps = {name: {"kind": "daemon", "address": addrs[name], "job": 9, "dtype": "int32",
                      "scale": cfg.int32_scale} for name in daemons}
        eps[f"loss-rto{cfg.loss_fast_rto_ms:g}ms"] = {"kind": "daemon", "address": addrs["loss"], "job": 10,
                                                    "dtype": "int32", "scale": cfg.int32_scale,
                                                    "rto": cfg.loss_fast_rto_ms / 1e3}
        rounds = rounds_for(cfg, sizes, cfg.loss_rounds_small, cfg.loss_rounds_large)
        ranks, seen = run_ranks(None, [None] * n, lambda r: eps, sizes, rounds, cfg, workdir, "loopback loss")
        entry["workers_seen"] = seen
        entry["systems"] = summarize_config(ranks, list(eps), sizes)
        entry["daemon_processes"] = {name: d.stop() for name, d in daemons.items()}
    except Exception as e:  # noqa: BLE001
        log(f"  loopback loss: ERROR {type(e).__name__}: {e}")
        entry["error"] = f"{type(e).__name__}: {e}"
    finally:
        for d in daemons.values():
            if d.proc.poll() is None:
                kill(d.proc)
        shutil.rmtree(workdir, ignore_errors=True)
    print_point(entry)
    return entry


# --- main -----------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="2 workers, 2 sizes, few rounds: a smoke test")
    ap.add_argument("--workers", help="comma-separated worker counts (default 2,4,8)")
    ap.add_argument("--sizes", help="comma-separated gradient sizes, decimal K/M (default 40K,158K,3M,6M)")
    ap.add_argument("--rate", help="comma-separated tc rates (default 1gbit,10gbit)")
    ap.add_argument("--delay-us", type=float, help="per-hop delay of the delay section (default 100; 0: none)")
    ap.add_argument("--jitter-us", type=float, help="+- jitter per hop (default 10)")
    ap.add_argument("--delay-sizes", help="sizes of the delay section (default 40K,158K)")
    ap.add_argument("--delay-workers", help="worker counts of the delay section (default 4)")
    ap.add_argument("--systems", default=",".join(SYSTEMS), help="subset of " + ",".join(SYSTEMS))
    ap.add_argument("--sections", default="matrix,delay,goodput,loss",
                    help="subset of matrix,delay,goodput,loss")
    ap.add_argument("--no-namespaces", action="store_true", help="loopback addresses, no shaping")
    ap.add_argument("--no-offload", action="store_true",
                    help="daemons and workers without UDP segmentation/receive offload (the A/B of it)")
    ap.add_argument("--out-dir", default=OUT)
    args = ap.parse_args(argv)
    cfg = Config.choose(args.quick, None, FULL, QUICK)
    for opt, key, conv in (("workers", "workers", int), ("sizes", "sizes", str), ("rate", "rates", str),
                           ("delay_sizes", "delay_sizes", str), ("delay_workers", "delay_workers", int)):
        if getattr(args, opt):
            setattr(cfg, key, [conv(x) for x in getattr(args, opt).split(",") if x])
    cfg.override(args, "delay_us", "jitter_us")
    sections = set(args.sections.split(","))
    systems = [s for s in args.systems.split(",") if s]
    unknown = set(systems) - set(SYSTEMS)
    if unknown:
        ap.error(f"unknown systems {sorted(unknown)}")
    stem, report = start_report("innetwork-aggregation", args.quick, args.out_dir,
                                command=command_line(__spec__.name))
    report["config"] = cfg.as_dict()
    if args.no_offload:
        os.environ["REPRISE_BENCH_OFFLOAD"] = "0"   # every child's daemon and workers
    report["offload"] = agg_daemon.offload()
    report["module"] = agg_daemon.module_name()
    why = agg_daemon.unavailable()
    report["build"] = agg_daemon.build_info() if not why else {}
    skipped = {}
    if why:
        log(f"== daemon: SKIPPED: {why}")
        for s in systems:
            if s.startswith("daemon"):
                skipped[s] = why
        systems = [s for s in systems if not s.startswith("daemon")]
    try:
        import torch.distributed  # noqa: F401 - gloo needs it
    except Exception as e:  # noqa: BLE001
        if "gloo" in systems:
            log(f"== gloo: SKIPPED: torch.distributed unavailable ({type(e).__name__}: {e})")
            skipped["gloo"] = f"torch.distributed unavailable: {type(e).__name__}: {e}"
            systems.remove("gloo")
    report["skipped"] = skipped
    t_start = time.monotonic()
    logdir = os.path.join(args.out_dir, stem + "-logs")     # every process's stderr
    os.makedirs(logdir, exist_ok=True)
    report["logs"] = logdir
    from benchmarks.innetwork.netns import Network

    nmax = max(cfg.workers + (cfg.delay_workers if "delay" in sections else []))
    hosts = [f"w{i}" for i in range(nmax)] + [PS_HOST]
    report["matrix"], report["delay"] = [], []
    with Network(hosts, hub=HUB, namespaces=False if args.no_namespaces else None) as net:
        report["network"] = {"namespaced": net.namespaced, "reason": net.reason, "prefix": net.prefix}
        if not net.namespaced:
            log(f"== NO NAMESPACES ({net.reason}): loopback addresses, links not shaped, no delay section")
        rates = cfg.rates if net.namespaced else ["unshaped"]
        workers = cfg.workers
        if "matrix" in sections:
            for rate in rates:
                if not workers:
                    break
                shape_all(net, hosts, rate)
                for n in workers:
                    report["matrix"].append(network_config(
                        net, n, rate, 0.0, [parse_size(s) for s in cfg.sizes], systems, cfg, logdir, stem))
        can_delay = net.namespaced and shutil.which("nft") is not None
        delay_runs = "delay" in sections and cfg.delay_us > 0 and can_delay
        if not workers and not delay_runs:  # --quick where the delay configuration does not run
            workers = cfg.delay_workers
            if "matrix" in sections:
                shape_all(net, hosts, rates[0])
                for n in workers:
                    report["matrix"].append(network_config(
                        net, n, rates[0], 0.0, [parse_size(s) for s in cfg.sizes], systems, cfg, logdir, stem))
        if delay_runs:
            shape_all(net, hosts, cfg.delay_rate)
            for n in cfg.delay_workers:
                for d in ([0.0] if cfg.relay_control else []) + [cfg.delay_us]:
                    report["delay"].append(network_config(
                        net, n, cfg.delay_rate, d, [parse_size(s) for s in cfg.delay_sizes], systems,
                        cfg, logdir, stem, relay=True))
        elif "delay" in sections:
            report["delay_skipped"] = ("no namespaces: the transparent relay needs its own nftables table"
                                       if not net.namespaced else "no `nft` command (nftables)"
                                       if not can_delay else "--delay-us 0")
    daemon_ok = not why
    if "goodput" in sections:
        report["goodput"] = loopback_goodput(cfg, logdir, stem) if daemon_ok else {"skipped": why}
    if "loss" in sections:
        report["loss"] = loopback_loss(cfg, logdir, stem) if daemon_ok else {"skipped": why}
    report["wall_s"] = round(time.monotonic() - t_start, 1)
    write_outputs(args.out_dir, stem, report, build_markdown(report))
    return 0


def shape_all(net, hosts: list[str], rate: str) -> None:
    if not net.namespaced:
        return
    from benchmarks.innetwork.netns import rate_bits
    burst = max(64_000, int(rate_bits(rate) / 8 * 100e-6))
    for h in hosts:
        net.shape(h, rate, burst=f"{burst}b")


if __name__ == "__main__":
    sys.exit(main())
