"""Wire compression (issue 18), Reprise only: what ``rp.Client(address, compression=...)``
saves on the wire and what it costs, on Atari-like frames and on float vectors.

    python3.11 -m benchmarks.remote.compression            # ~3 minutes on 2 cores
    python3.11 -m benchmarks.remote.compression --quick    # smoke test, seconds; numbers are noise
    python3.11 -m benchmarks.remote.compression --host 10.0.0.5   # a non-loopback address of
                                                                  # this host: "auto" compresses
                                                                  # (a random token, as required)

A server process (this module with ``--serve``, ``rp.Server(tables, address=HOST:0)``)
holds two tables (Uniform sampler, Fifo remover, MinSize(1)), filled before timing:

* ``atari``: ``obs: uint8[4, 84, 84]`` (28,224 bytes), Atari-like observations: a
  Breakout-like game (walls, a score, rows of bricks that disappear, a paddle that follows
  a bouncing ball, a sprite drifting across the top) drawn at 168 x 168 and averaged 2 x 2
  down to 84 x 84 (soft edges, as the usual grey-scale resize gives), 4 consecutive frames
  stacked per step as frame-stacking agents store them.
* ``vectors``: ``obs: float32[1024]`` (4,096 bytes), observations of a random walk (every
  dimension ``x += 0.05 * N(0, 1)`` per step): full-entropy mantissas, as real float
  observations have.

This process is the one client: for each dataset, the calls ``insert`` (a writer's
``extend`` of 256 consecutive steps + ``create_items(table, 1, ...)`` + ``flush()``) and
``sample`` (``client.sample(table, 256)``), each with three clients made with
``compression="none"``, ``"zstd"`` and ``"auto"`` (on 127.0.0.1 "auto" should not
compress), interleaved round by round.

What is counted, per (dataset, call, compression), over each round's window:

* bytes on the wire: the kernel's per-connection TCP counters of the server's sockets
  (``ss -tin``, sockets with the server's port: ``bytes_received``, what clients sent, for
  inserts; ``bytes_acked``, what the server sent, for samples), so compressed bytes are
  what is counted, with gRPC and HTTP/2 framing; checked against the payload (items x item
  bytes), the server's own count of step data (``client.snapshot()["bytes"]``, which
  counts uncompressed step bytes) and the loopback interface's received bytes
  (``/proc/net/dev``, headers and every other loopback user included);
* ratio = payload / bytes on the wire in the call's direction;
* items/s, and CPU seconds per GB of payload of this process (``time.process_time``, every
  thread) and of the server process (``/proc/PID/stat``), so the cost shows on both sides.

With ``zstandard`` importable, the same batches compressed in this process
(``zstandard`` levels 1 and 3, one thread, best of 3) give a reference ratio and speed (the
sample batch is one uniform draw, with replacement, from the table).

Writes ``benchmarks/out/compression-<date>.json`` and ``.md`` (``--out-dir`` elsewhere).
Needs a reprise whose ``rp.Client`` takes ``compression=``: otherwise it stops with a
message saying so, before measuring anything.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import statistics
import subprocess
import sys
import time

import numpy as np

from benchmarks.common.config import Config
from benchmarks.common.driver import OUT, start_report, write_outputs
from benchmarks.common.processes import ServerProcess, ready_until_stdin_closes, serve_if_asked
from benchmarks.common.report import machine_lines, si
from benchmarks.common.timing import latency_stats, now

ARMS = ["none", "zstd", "auto"]
# Off loopback the server requires a token: a random one, handed to the server process in
# its environment (not on its command line).
TOKEN_VARIABLE = "REPRISE_BENCH_TOKEN"
BATCH = 256
DATASETS = {"atari": {"shape": (4, 84, 84), "dtype": "uint8"},
            "vectors": {"shape": (1024,), "dtype": "float32"}}
FULL = dict(rounds=3, seconds=2.0, warmup_calls=2, budget_seconds=600.0,
            table_items={"atari": 4_096, "vectors": 16_384})
QUICK = dict(rounds=1, seconds=0.3, warmup_calls=1, budget_seconds=120.0,
             table_items={"atari": 512, "vectors": 1_024})


# --- the data --------------------------------------------------------------------------
DIGITS = ["111101101101111", "010110010010111", "111001111100111", "111001111001111",
          "101101111001001", "111100111001111", "111100111101111", "111001001001001",
          "111101111101111", "111101111001111"]   # 3 x 5 glyphs, row by row
BRICK_GREYS = [142, 132, 120, 108, 96, 84]


class AtariLike:
    """A Breakout-like game drawn as the Atari preprocessing leaves it (84 x 84 grey
    scale): mostly constant background, walls, a score, bricks, a paddle, a ball and a
    drifting sprite. ``frames(n)`` returns uint8[n, 84, 84] of consecutive frames."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.edges = np.linspace(8, 160, 15).astype(int)   # 14 brick columns
        self.new_episode()

    def new_episode(self) -> None:
        self.bricks = np.ones((6, 14), bool)
        self.score = 0
        self.steps = 0
        self.ufo = float(self.rng.uniform(8, 150))
        self.new_ball()
        self.paddle = 84.0

    def new_ball(self) -> None:
        r = self.rng
        self.ball = np.array([r.uniform(30, 130), r.uniform(90, 120)])
        self.vel = np.array([r.choice([-1.0, 1.0]) * r.uniform(1.5, 3.0), -r.uniform(2.0, 3.0)])

    def advance(self) -> None:
        b, v = self.ball, self.vel
        b += v
        if b[0] < 8 or b[0] > 156:
            v[0] = -v[0]
            b[0] = min(max(b[0], 8), 156)
        if b[1] < 24:
            v[1] = abs(v[1])
        row = int((b[1] - 40) // 4)
        if 0 <= row < 6:
            col = int(np.searchsorted(self.edges, b[0], side="right")) - 1
            if 0 <= col < 14 and self.bricks[row, col]:
                self.bricks[row, col] = False
                self.score += 6 - row
                v[1] = -v[1]
        if 146 <= b[1] <= 150 and abs(b[0] + 2 - self.paddle) < 14 and v[1] > 0:
            v[1] = -v[1]
            v[0] += 0.1 * (b[0] + 2 - self.paddle)
        if b[1] > 166:
            self.new_ball()
        self.paddle += float(np.clip(self.ball[0] + 2 - self.paddle, -3, 3))
        self.paddle = min(max(self.paddle, 20), 148)
        self.ufo = (self.ufo + 1.3 - 8) % 144 + 8
        self.steps += 1
        if self.steps >= 2000 or not self.bricks.any():
            self.new_episode()

    def draw(self) -> np.ndarray:
        c = np.zeros((168, 168), np.uint8)
        c[16:24, :] = 142
        c[16:, :8] = 142
        c[16:, 160:] = 142
        for i, ch in enumerate(f"{self.score:03d}"):
            glyph = np.array([int(x) for x in DIGITS[int(ch)]], bool).reshape(5, 3)
            x0 = 40 + 16 * i
            c[3:13, x0:x0 + 9][np.kron(glyph, np.ones((2, 3), bool))] = 142
        for r in range(6):
            for col in np.flatnonzero(self.bricks[r]):
                c[40 + 4 * r:44 + 4 * r, self.edges[col]:self.edges[col + 1]] = BRICK_GREYS[r]
        p = int(self.paddle)
        c[148:152, p - 12:p + 12] = 200
        x, y = int(self.ball[0]), int(self.ball[1])
        c[y:y + 4, x:x + 4] = 200
        u = int(self.ufo)
        c[28:34, u:u + 10] = 170
        return c.reshape(84, 2, 84, 2).mean(axis=(1, 3)).astype(np.uint8)

    def frames(self, n: int) -> np.ndarray:
        out = np.empty((n, 84, 84), np.uint8)
        for i in range(n):
            self.advance()
            out[i] = self.draw()
        return out


def atari_steps(n: int, seed: int) -> np.ndarray:
    """uint8[n, 4, 84, 84]: n consecutive steps, each the last 4 frames."""
    f = AtariLike(seed).frames(n + 3)
    return np.ascontiguousarray(np.lib.stride_tricks.sliding_window_view(f, 4, axis=0)
                                .transpose(0, 3, 1, 2))


def vector_steps(n: int, seed: int) -> np.ndarray:
    """float32[n, 1024]: n consecutive observations of a random walk."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(1024, dtype=np.float32)
    walk = np.cumsum(0.05 * rng.standard_normal((n, 1024), dtype=np.float32), axis=0)
    return (x + walk).astype(np.float32)


def steps(dataset: str, n: int, seed: int) -> np.ndarray:
    return atari_steps(n, seed) if dataset == "atari" else vector_steps(n, seed)


def item_bytes(dataset: str) -> int:
    d = DATASETS[dataset]
    return int(np.prod(d["shape"])) * np.dtype(d["dtype"]).itemsize


# --- the server process ----------------------------------------------------------------
def serve(spec_json: str) -> None:
    import reprise as rp

    spec = json.loads(spec_json)
    stores, tables = [], []
    for name, items in spec["items"].items():
        d = DATASETS[name]
        store = rp.Store({"obs": rp.Field(d["shape"], d["dtype"])}, capacity=items + 4 * BATCH,
                         block_steps=64)
        table = rp.Table(name, store, sampler=rp.selectors.Uniform(), remover=rp.selectors.Fifo(),
                         max_size=items, rate_limiter=rp.rate_limiters.MinSize(1))
        for start in range(0, items, 1024):
            n = min(1024, items - start)
            table.insert({"obs": steps(name, n, seed=start)[:, None]}, np.ones(n))
        stores.append(store)
        tables.append(table)
    server = rp.Server(tables, address=f"{spec['host']}:0",
                       token=os.environ.get(TOKEN_VARIABLE) or None)
    ready_until_stdin_closes(server.address)
    server.stop()
    for store in stores:
        store.close()


# --- counters ----------------------------------------------------------------------------
def tcp_counters(port: int) -> dict:
    """Sums over the server's established TCP sockets (local port ``port``): bytes it has
    received and bytes of it the clients acknowledged."""
    out = subprocess.run(["ss", "-tinH", "state", "established", f"( sport = :{port} )"],
                         capture_output=True, text=True, check=True).stdout
    return {"acked": sum(int(x) for x in re.findall(r"bytes_acked:(\d+)", out)),
            "received": sum(int(x) for x in re.findall(r"bytes_received:(\d+)", out)),
            "sockets": sum(1 for ln in out.splitlines() if ln and not ln[0].isspace())}


def lo_received() -> int | None:
    """Bytes the loopback interface has received (every loopback user, headers included)."""
    try:
        with open("/proc/net/dev") as f:
            for line in f:
                name, _, rest = line.partition(":")
                if name.strip() == "lo":
                    return int(rest.split()[0])
    except OSError:
        return None
    return None


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def readings(port: int, server_pid: int) -> dict:
    """Every counter, in an order that keeps the snapshot's own bytes out of the TCP ones:
    the caller brackets its calls with ``readings`` before and after."""
    return {"tcp": tcp_counters(port), "lo": lo_received(),
            "cpu_client": time.process_time(), "cpu_server": cpu_seconds(server_pid)}


def step_bytes(client) -> dict:
    return client.snapshot()["bytes"]


# --- one measurement ---------------------------------------------------------------------
def calls_for(client, dataset: str, rows: np.ndarray):
    """{"insert": call, "sample": call} of one client, and a close for its writer."""
    w = client.writer(dataset, max_sequence_length=BATCH)
    priorities = np.ones(BATCH)
    data = {"obs": rows}

    def insert() -> None:
        w.extend(data)
        w.create_items(dataset, 1, priorities)
        w.flush()

    def sample() -> None:
        x = client.sample(dataset, BATCH).data["obs"]
        assert x.shape == (BATCH, 1, *DATASETS[dataset]["shape"]), x.shape
    return {"insert": insert, "sample": sample}, w.close


def window(client, call, seconds: float, port: int, server_pid: int) -> dict:
    """Calls back to back for ``seconds``; counters before and after."""
    b0 = step_bytes(client)
    r0 = readings(port, server_pid)
    lat = []
    t0 = now()
    while now() - t0 < seconds or not lat:
        t = now()
        call()
        lat.append(now() - t)
    elapsed = now() - t0
    r1 = readings(port, server_pid)
    b1 = step_bytes(client)
    return {"calls": len(lat), "seconds": elapsed, "lat": lat,
            "tcp_received": r1["tcp"]["received"] - r0["tcp"]["received"],
            "tcp_acked": r1["tcp"]["acked"] - r0["tcp"]["acked"],
            "lo": None if r0["lo"] is None else r1["lo"] - r0["lo"],
            "cpu_client": r1["cpu_client"] - r0["cpu_client"],
            "cpu_server": r1["cpu_server"] - r0["cpu_server"],
            "step_bytes_received": b1["received"] - b0["received"],
            "step_bytes_sent": b1["sent"] - b0["sent"]}


def summarize(windows: list[dict], dataset: str, op: str) -> dict:
    """One (dataset, op, arm): medians of rates, sums of bytes and CPU over rounds."""
    ib = item_bytes(dataset)
    total = {k: sum(w[k] or 0 for w in windows) for k in
             ("calls", "seconds", "tcp_received", "tcp_acked", "lo", "cpu_client", "cpu_server",
              "step_bytes_received", "step_bytes_sent")}
    payload = total["calls"] * BATCH * ib
    wire = total["tcp_received"] if op == "insert" else total["tcp_acked"]
    back = total["tcp_acked"] if op == "insert" else total["tcp_received"]
    rates = [w["calls"] * BATCH / w["seconds"] for w in windows]
    gb = payload / 1e9
    return {"items_per_s": statistics.median(rates), "rounds": rates,
            "gb_per_s": statistics.median(rates) * ib / 1e9,
            "payload_bytes": payload, "wire_bytes": wire, "wire_bytes_other_way": back,
            "ratio": payload / wire if wire else None,
            "server_step_bytes": total["step_bytes_received" if op == "insert"
                                       else "step_bytes_sent"],
            "lo_bytes": total["lo"], "lo_over_wire": total["lo"] / (wire + back)
            if total["lo"] and wire + back else None,
            "cpu_client_s_per_gb": total["cpu_client"] / gb,
            "cpu_server_s_per_gb": total["cpu_server"] / gb,
            "latency": latency_stats([x for w in windows for x in w["lat"]]),
            "calls": total["calls"]}


def reference(batches: dict) -> dict:
    """zstandard (one thread) on the same bytes, levels 1 and 3: ratio and MB/s."""
    try:
        import zstandard
    except ImportError:
        return {"skipped": "zstandard is not importable"}
    out = {"zstandard": zstandard.__version__}
    for name, data in batches.items():
        raw = np.ascontiguousarray(data).tobytes()
        for level in (1, 3):
            cctx, dctx = zstandard.ZstdCompressor(level=level), zstandard.ZstdDecompressor()
            tc = td = float("inf")
            for _ in range(3):   # best of 3
                t = time.perf_counter()
                packed = cctx.compress(raw)
                tc = min(tc, time.perf_counter() - t)
                t = time.perf_counter()
                dctx.decompress(packed)
                td = min(td, time.perf_counter() - t)
            out[f"{name}/level{level}"] = {"ratio": len(raw) / len(packed),
                                           "compress_mb_per_s": len(raw) / tc / 1e6,
                                           "decompress_mb_per_s": len(raw) / td / 1e6,
                                           "bytes": len(raw)}
    return out


def is_loopback(host: str) -> bool:
    return host.startswith("127.") or host in ("localhost", "::1", "[::1]")


def check_compression_option(rp, address: str, token: str | None) -> None:
    """Stop with a clear message when this reprise has no wire compression."""
    try:
        rp.Client(address, token=token, compression="zstd").close()
    except TypeError as exc:
        raise SystemExit(f"rp.Client(..., compression='zstd') is not supported by the reprise at "
                         f"{os.path.dirname(rp.__file__)} ({exc}): this build has no wire "
                         "compression (issue 18); nothing measured") from None


# --- the run -----------------------------------------------------------------------------
def run(cfg: Config, host: str, log) -> dict:
    import reprise as rp

    spec = {"host": host, "items": cfg.table_items}
    token = None if is_loopback(host) else secrets.token_hex(16)
    os.environ[TOKEN_VARIABLE] = token or ""
    log(f"starting the server on {host} (filling {cfg.table_items}) ...")
    server = ServerProcess(__spec__.name, spec)
    port = int(server.address.rsplit(":", 1)[1])
    out = {"server_address": server.address, "reprise": rp.__version__,
           "reprise_path": os.path.dirname(rp.__file__), "results": {}}
    clients, closers = {}, []
    try:
        check_compression_option(rp, server.address, token)
        batches = {d: steps(d, BATCH, seed=10_000 + i) for i, d in enumerate(DATASETS)}
        for arm in ARMS:
            client = rp.Client(server.address, token=token, compression=arm)
            calls = {}
            for d in DATASETS:
                calls[d], close = calls_for(client, d, batches[d])
                closers.append(close)
            clients[arm] = (client, calls)
        sampled = {}
        for arm, (client, calls) in clients.items():   # warm-up: every stream open
            for d in DATASETS:
                for op in ("insert", "sample"):
                    for _ in range(cfg.warmup_calls):
                        calls[d][op]()
                sampled[d] = client.sample(d, BATCH).data["obs"]
        windows = {}
        for r in range(cfg.rounds):
            for d in DATASETS:
                for op in ("insert", "sample"):
                    for arm in (ARMS if r % 2 == 0 else ARMS[::-1]):
                        client, calls = clients[arm]
                        w = window(client, calls[d][op], cfg.seconds, port, server.proc.pid)
                        windows.setdefault((d, op, arm), []).append(w)
            log(f"round {r + 1}/{cfg.rounds} done")
        for (d, op, arm), ws in windows.items():
            e = summarize(ws, d, op)
            out["results"][f"{d}/{op}/{arm}"] = e
            log(f"{d}/{op}/{arm}: {e['items_per_s']:,.0f} items/s, ratio "
                f"{e['ratio']:.2f}, CPU s/GB client {e['cpu_client_s_per_gb']:.2f} server "
                f"{e['cpu_server_s_per_gb']:.2f}")
        out["reference"] = reference({**{f"{d}/insert": b for d, b in batches.items()},
                                      **{f"{d}/sample": s for d, s in sampled.items()}})
    finally:
        for close in closers:
            try:
                close()
            except Exception:   # a writer of a client that failed: nothing left to save
                pass
        for client, _ in clients.values():
            client.close()
        server.stop()
    return out


def build_markdown(report: dict) -> str:
    res, cfg = report["results"], report["config"]
    lines = [f"# Wire compression, {report['date']}"
             + (" (QUICK: short windows, noisy)" if report["quick"] else ""), "",
             *machine_lines(report), "",
             f"Reprise {report.get('reprise', '?')} (`{report.get('reprise_path', '?')}`), server "
             f"at {report.get('server_address', '?')} in its own process, one client process. "
             f"Calls of {BATCH} items: insert = `extend` + `create_items` + `flush()`, sample = "
             f"`client.sample(table, {BATCH})`. {cfg['rounds']} rounds of {cfg['seconds']} s per "
             "arm, arms interleaved. Wire bytes: the server sockets' TCP counters (`ss -tin`) "
             "in the call's direction; ratio = payload / wire. CPU: seconds per GB of payload, "
             "whole process.", "",
             "| data | call | compression | items/s (GB/s) | p50 ms | wire bytes / call | ratio "
             "| client CPU s/GB | server CPU s/GB | server's step bytes / payload |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for k, e in res.items():
        d, op, arm = k.split("/")
        lat = e["latency"]
        per_call = e["wire_bytes"] / e["calls"] if e["calls"] else 0
        step = e["server_step_bytes"] / e["payload_bytes"] if e["payload_bytes"] else 0
        lines.append(f"| {d} ({item_bytes(d):,} B/item) | {op} | {arm} | {si(e['items_per_s'])} "
                     f"({e['gb_per_s']:.2f}) | {lat.get('p50_ms', 0):.3g} | {si(per_call)} | "
                     f"{e['ratio']:.2f} | {e['cpu_client_s_per_gb']:.2f} | "
                     f"{e['cpu_server_s_per_gb']:.2f} | {step:.3f} |")
    lines.append("")
    lines.append("## On/off")
    lines.append("")
    for d in DATASETS:
        for op in ("insert", "sample"):
            off, on, auto = (res.get(f"{d}/{op}/{a}") for a in ARMS)
            if not (off and on):
                continue
            text = (f"- {d} {op}: payload / wire bytes {on['ratio']:.2f} with zstd, "
                    f"{off['ratio']:.2f} with none; items/s zstd / none = "
                    f"{on['items_per_s'] / off['items_per_s']:.2f}; CPU s/GB client "
                    f"{off['cpu_client_s_per_gb']:.2f} -> {on['cpu_client_s_per_gb']:.2f}, server "
                    f"{off['cpu_server_s_per_gb']:.2f} -> {on['cpu_server_s_per_gb']:.2f}")
            if auto:
                text += f"; auto: ratio {auto['ratio']:.2f}"
            lines.append(text + ".")
    lo = [e["lo_over_wire"] for e in res.values() if e.get("lo_over_wire")]
    if lo:
        lines.append(f"- Check of the wire counts: the loopback interface received "
                     f"{min(lo):.3f}x to {max(lo):.3f}x the bytes the server's sockets moved both "
                     "ways (above 1: TCP/IP headers, ACKs and any other loopback traffic).")
    host = report.get("host_arg", "127.0.0.1")
    loop = is_loopback(host)
    ratios = {a: [res[f"{d}/{op}/{a}"]["ratio"] for d in DATASETS for op in ("insert", "sample")
                  if res.get(f"{d}/{op}/{a}", {}).get("ratio")] for a in ARMS}
    if all(len(ratios[a]) == len(ratios["auto"]) > 0 for a in ARMS):
        def near(a: str) -> bool:
            return all(abs(x / y - 1) < 0.05 for x, y in zip(ratios["auto"], ratios[a]))
        like = "none" if near("none") else "zstd" if near("zstd") else "neither none nor zstd"
        lines.append(f"- \"auto\" on {host} ({'loopback' if loop else 'not loopback'}): behaves "
                     f"like {like} (ratios {', '.join(f'{a:.2f}' for a in ratios['auto'])}); "
                     f"expected {'none' if loop else 'zstd'}.")
    ref = report.get("reference", {})
    if "skipped" not in ref:
        lines += ["", f"## Reference: zstandard {ref.get('zstandard', '?')} in this process "
                      "(one thread) on the same batches", "",
                  "| batch | bytes | level | ratio | compress MB/s | decompress MB/s |",
                  "|---|---|---|---|---|---|"]
        for k, e in ref.items():
            if isinstance(e, dict):
                name, level = k.rsplit("/", 1)
                lines.append(f"| {name} | {si(e['bytes'])} | {level[5:]} | {e['ratio']:.2f} | "
                             f"{e['compress_mb_per_s']:.0f} | {e['decompress_mb_per_s']:.0f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    if serve_if_asked(serve):
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="small tables, short windows: a smoke test")
    ap.add_argument("--host", default="127.0.0.1",
                    help="address the server binds (default 127.0.0.1; a non-loopback address "
                         "of this host checks that 'auto' compresses there)")
    ap.add_argument("--out-dir", default=None, help="where the .json and .md go (default "
                                                    "benchmarks/out)")
    args = ap.parse_args()
    cfg = Config.choose(args.quick, None, FULL, QUICK)
    out_dir = args.out_dir or OUT
    t0 = time.perf_counter()

    def log(msg: str) -> None:
        print(f"[compression {time.perf_counter() - t0:6.1f}s] {msg}", file=sys.stderr, flush=True)

    measured = run(cfg, args.host, log)
    stem, report = start_report("compression", args.quick, out_dir)   # + memcpy, after the run
    report.update(measured, config=cfg.as_dict(), host_arg=args.host)
    write_outputs(out_dir, stem, report, build_markdown(report))


if __name__ == "__main__":
    main()
