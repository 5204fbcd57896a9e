"""In-network replay placement (issue 15): Reprise on the middle node vs the paper's Redis baseline.

    python -m benchmarks.innetwork.placement                  # actors 1,2,4,8, 3 rounds; ~8 minutes
    python -m benchmarks.innetwork.placement --quick          # smoke test, ~20 s
    python -m benchmarks.innetwork.placement --actors 8 --seconds 20 --rate none

The topology (``benchmarks/innetwork/netns.py``): network namespaces ``actor0..actorN-1`` and
``learner``, each linked by its own veth pair to the middle namespace ``replay`` (the hub,
which forwards), every link shaped with ``tc tbf`` to ``--rate`` (1 Gbit/s by default, both
ways) so that, as in the paper's cluster, a link (the learner's) can be the bottleneck::

    actor0 ──┐
    actor1 ──┼── replay (middle node) ── learner
    actorN ──┘

Two deployments run on the same network, one after the other, for each actor count:

* ``reprise`` -- **Reprise in the network**: ``reprise serve --config`` (a generated TOML:
  one Prioritized table, alpha 0.6, ``max_size`` 65,536, FIFO remover, MinSize limiter, no
  extensions) runs in the middle namespace. Each actor (its own process in its namespace)
  pushes a batch of 200 transitions with ``rp.Client(address, token=...)``:
  ``writer.extend(200 steps) + create_items(1, 200 priorities) + flush()`` (the call returns
  once the items are in the table). The learner, in its namespace, draws
  ``client.sample("replay", 512)`` and sends ``client.update_priorities`` for the 512 keys.
  Pushes end on the middle node: only sampled batches and priority updates cross the
  learner's link.
* ``redis`` -- **the paper's baseline**: ``redis-server`` runs on the learner; actors
  ``RPUSH`` one ``pickle.dumps(batch of 200, protocol 5)`` each across the network; a drain
  thread in the learner process (as ``benchmarks/peers/redis_serving.py``: the paper's
  replay process on the learner, as a thread) ``BLPOP``/``LPOP``\\ s them into numpy arrays +
  a numpy sum tree (priority ** 0.6, capacity 65,536, FIFO overwrite); the learner samples
  512 proportionally from it locally and sets 512 new priorities. Every pushed byte crosses
  the learner's link.

Transitions are Ape-X's (state and next_state uint8 frames, int64 action, float32 reward)
with a smaller frame by default, ``--frame 4,42,42`` (14,124 B per transition, 2.8 MB per
push of 200, 7.2 MB per sampled batch of 512) instead of Atari's 4x84x84 (56 KB, 11.3 MB per
push), so that 8 actors fit in 2 cores' memory bandwidth; ``--frame 4,84,84`` runs the real
size. Frames are random bytes (compression cannot help either side; Reprise's clients use
``compression="none"``).

Load: each actor pushes one batch every ``--actor-period`` seconds (staggered, and half a
period off the window's edges, where the link counters are read; 0.1 s:
2,000 transitions/s per actor, 28 MB/s at 4x42x42; a push that takes longer than the period
is followed at once by the next), the learner starts a round every ``--learner-period``
seconds (0.2 s: at most 5 rounds, 2,560 samples/s). So the offered insert load grows with
the actors while the learner's is fixed, as in Ape-X (many actors, one learner: 50K
transitions/s inserted, 19 x 512 sampled). At the defaults the actors offer 28 MB/s each:
at 8 actors 226 MB/s, 1.8x what a 1 Gbit/s learner link carries (the regime the paper
addresses); ``--actor-period 0.2`` halves it (8 actors: 90% of the link).

Each deployment runs ``--rounds`` times per actor count (3; the order of the deployments
alternates round by round) and the tables report medians over the rounds. Measured in each
round's window (``--warmup`` s after a common start, then ``--seconds`` s):
bytes that cross the learner's link (its veth's rx+tx counters read at the window's edges:
headers included), per sampled batch and against the bytes the actors pushed; actor push
latency (one push call) and learner sample latency (one ``sample`` call / one draw from the
local sum tree with the gather) p50/p99; items inserted per second (Reprise: acknowledged by
``flush``; Redis: pushed, and stored in the sum tree by the drain thread). After the window
each side checks what it holds: Reprise's table ``num_inserts`` equals the actors' pushes x
200, Redis's drained items equal them too, and every sampled batch had 512 items of the
right shape.

Without namespaces (not root) it runs on loopback addresses (``127.b.k.1``): link bytes are
not measurable (``n/a``) and ``--rate`` does nothing, the latencies are still measured.

Writes ``benchmarks/out/placement-<date>.json`` and ``.md`` (``--out-dir`` elsewhere).
Child processes: ``python -m benchmarks.innetwork.placement --role ROLE SPEC_JSON``.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

from benchmarks.common.bench import package_versions
from benchmarks.common.driver import OUT, start_report, write_outputs
from benchmarks.common.processes import free_port, stop_all
from benchmarks.common.report import machine_lines
from benchmarks.common.timing import latency_stats, now
from benchmarks.innetwork.netns import Network, can_namespace, rate_bits

TOKEN = "placement-benchmark-token"
PORT_REDIS = 6379              # inside the learner's namespace (its own port space)
TABLE = "replay"
PRIORITY_EXPONENT = 0.6

FULL = dict(actors=[1, 2, 4, 8], seconds=10.0, warmup=3.0, frame=(4, 42, 42), push=200,
            sample=512, max_size=65_536, min_size=1_024, pool=1_024, actor_period=0.1,
            learner_period=0.2, rate="1gbit", rounds=3)
QUICK = dict(actors=[1, 2], seconds=1.5, warmup=1.0, frame=(4, 21, 21), push=200,
             sample=512, max_size=8_192, min_size=512, pool=400, actor_period=0.05,
             learner_period=0.2, rate="1gbit", rounds=1)
BLOCK_STEPS = 64
REDIS_MAX_QUEUED = 64          # batches in the Redis list before an actor waits (memory guard)
CHILD_READY_S = 60.0           # a child must be ready within this
COOLDOWN_S = 30.0              # ... and done within window end + this


def transition_bytes(frame) -> int:
    n = 1
    for d in frame:
        n *= d
    return 2 * n + 8 + 4


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# --- children --------------------------------------------------------------------------------
def make_pool(frame, n: int, seed: int) -> dict:
    import numpy as np
    rng = np.random.default_rng(seed)
    return {"state": rng.integers(0, 256, (n, *frame), dtype=np.uint8),
            "next_state": rng.integers(0, 256, (n, *frame), dtype=np.uint8),
            "action": rng.integers(0, 18, n, dtype=np.int64),
            "reward": rng.standard_normal(n).astype(np.float32)}


def batches(pool: dict, push: int, seed: int):
    """Endless (columns, priorities) batches of ``push`` transitions cut from ``pool``."""
    import numpy as np
    rng = np.random.default_rng(seed + 1000)
    n = len(pool["action"])
    i = 0
    while True:
        start = (i * push) % (n - push + 1)
        yield ({k: v[start:start + push] for k, v in pool.items()},
               rng.uniform(0.1, 10.0, push))
        i += 1


class Pacer:
    """Calls at ``start + phase + k * period`` (back to back when a call overruns)."""

    def __init__(self, start: float, period: float, phase: float) -> None:
        self.next = start + phase
        self.period = period

    def wait(self) -> None:
        d = self.next - now()
        if d > 0:
            time.sleep(d)
        self.next = max(self.next + self.period, now())


def wait_go(spec: dict) -> float:
    """Announce READY, then wait for the orchestrator's start time (CLOCK_MONOTONIC)."""
    d = spec["dir"]
    with open(os.path.join(d, f"{spec['name']}.ready"), "w") as f:
        f.write(str(os.getpid()))
    deadline = now() + CHILD_READY_S + 30
    path = os.path.join(d, "go")
    while now() < deadline:
        if os.path.exists(path):
            with open(path) as f:
                text = f.read().strip()
            if text:
                start = float(text)
                # a child stuck past its window dumps its threads' stacks into its log, every 15 s
                import faulthandler
                end = start + spec["warmup"] + spec["seconds"]
                faulthandler.dump_traceback_later(max(1.0, end - now()) + 15, repeat=True)
                return start
        time.sleep(0.01)
    raise TimeoutError("no start signal")


def in_window(t0: float, t1: float, begin: float, end: float) -> bool:
    return t0 >= begin and t1 <= end


def actor_loop(spec: dict, push) -> dict:
    """Push until the window ends; latencies of the pushes inside the window."""
    start = wait_go(spec)
    begin, end = start + spec["warmup"], start + spec["warmup"] + spec["seconds"]
    pacer = Pacer(start, spec["actor_period"], spec["phase"])
    lat, pushes, pushes_in_window, extra_s = [], 0, 0, 0.0
    while True:
        pacer.wait()
        t0 = now()
        if t0 >= end:
            break
        waited = push() or 0.0  # the baseline's memory guard: not part of the latency
        t1 = now()
        extra_s += waited
        pushes += 1
        if in_window(t0, t1, begin, end):
            lat.append(t1 - t0 - waited)
            pushes_in_window += 1
    return {"lat": lat, "pushes": pushes, "pushes_in_window": pushes_in_window,
            "throttled_s": extra_s}


def learner_loop(spec: dict, draw, update) -> dict:
    """Rounds (draw 512 + update their priorities) until the window ends."""
    start = wait_go(spec)
    begin, end = start + spec["warmup"], start + spec["warmup"] + spec["seconds"]
    pacer = Pacer(start, spec["learner_period"], 0.5 * spec["learner_period"])
    sample_lat, update_lat, rounds, rounds_in_window, sampled = [], [], 0, 0, 0
    while True:
        pacer.wait()
        t0 = now()
        if t0 >= end:
            break
        keys, n = draw()
        t1 = now()
        if n is None:  # nothing to sample yet (the baseline's memory below min_size)
            time.sleep(0.005)
            continue
        update(keys)
        t2 = now()
        rounds += 1
        sampled += n
        if in_window(t0, t2, begin, end):
            sample_lat.append(t1 - t0)
            update_lat.append(t2 - t1)
            rounds_in_window += 1
    return {"sample_lat": sample_lat, "update_lat": update_lat, "rounds": rounds,
            "rounds_in_window": rounds_in_window, "sampled": sampled, "start": start}


def role_reprise_actor(spec: dict) -> dict:
    import numpy as np
    import reprise as rp
    client = connect_retry(lambda: rp.Client(spec["address"], token=TOKEN, compression="none"))
    w = client.writer(TABLE, max_sequence_length=spec["push"])
    gen = batches(make_pool(spec["frame"], spec["pool"], spec["seed"]), spec["push"], spec["seed"])

    def push() -> None:
        cols, prios = next(gen)
        w.extend(cols)
        w.create_items(TABLE, 1, np.asarray(prios, np.float64))
        w.flush()

    push()  # warm: connection, stream, first blocks (counted in "pushes_before")
    out = actor_loop(spec, push)
    out["pushes_before"] = 1
    out["bytes_per_push"] = spec["push"] * (transition_bytes(spec["frame"]) + 8)
    w.close()
    client.close()
    return out


def role_reprise_learner(spec: dict) -> dict:
    import numpy as np
    import reprise as rp
    client = connect_retry(lambda: rp.Client(spec["address"], token=TOKEN, compression="none"))
    rng = np.random.default_rng(7)
    shape = (spec["sample"], 1, *spec["frame"])
    bad = []

    def draw():
        s = client.sample(TABLE, spec["sample"], timeout=30.0)
        if s.data["state"].shape != shape or len(s.keys) != spec["sample"]:
            bad.append(str(s.data["state"].shape))
        return s.keys, len(s.keys)

    def update(keys) -> None:
        client.update_priorities(TABLE, keys, rng.uniform(0.1, 10.0, len(keys)))

    out = learner_loop(spec, draw, update)
    out["bad_batches"] = bad
    info = client.info()[TABLE]
    out["table"] = {k: info[k] for k in ("size", "num_inserts", "num_samples", "num_evictions")}
    client.close()
    return out


def redis_connect(spec: dict):
    import redis
    r = redis.Redis(host=spec["redis_host"], port=spec["redis_port"], socket_timeout=60)
    connect_retry(r.ping)
    return r


def role_redis_actor(spec: dict) -> dict:
    r = redis_connect(spec)
    gen = batches(make_pool(spec["frame"], spec["pool"], spec["seed"]), spec["push"], spec["seed"])
    sizes = []

    def push() -> float:
        cols, prios = next(gen)
        blob = pickle.dumps({"cols": cols, "prios": prios, "t": now()}, protocol=5)
        sizes.append(len(blob))
        length = r.rpush(b"exp", blob)
        if length > REDIS_MAX_QUEUED:  # the memory guard (not part of the latency)
            t = now()
            while r.llen(b"exp") > REDIS_MAX_QUEUED // 2 and now() - t < 30:
                time.sleep(0.001)
            return now() - t
        return 0.0

    push()
    out = actor_loop(spec, push)
    out["pushes_before"] = 1
    out["bytes_per_push"] = int(sum(sizes) / len(sizes))
    return out


def Memory(frame, capacity: int):
    """The baseline's replay memory: the serving suite's Redis-side replay (numpy columns and
    a numpy sum tree, FIFO overwrite) with this benchmark's frame."""
    from benchmarks.peers.redis_serving import ApexMemory
    return ApexMemory(capacity, tuple(frame))


def role_redis_learner(spec: dict) -> dict:
    import numpy as np
    r = redis_connect(spec)
    mem = Memory(spec["frame"], spec["max_size"])
    stop = threading.Event()
    lags, stored_at = [], []

    def drain() -> None:
        while not stop.is_set():
            got = r.lpop(b"exp", 16)
            if not got:
                b = r.blpop([b"exp"], timeout=0.05)
                if b is None:
                    continue
                got = [b[1]]
            for raw in got:
                obj = pickle.loads(raw)
                mem.put(obj["cols"], obj["prios"])
                t_stored = now()
                lags.append(t_stored - obj["t"])
                stored_at.append((t_stored, len(obj["prios"])))

    t = threading.Thread(target=drain, daemon=True)
    t.start()
    rng = np.random.default_rng(7)
    shape = (spec["sample"], *spec["frame"])
    bad = []

    def draw():
        if mem.size < spec["min_size"]:
            return None, None
        idx, data = mem.sample(spec["sample"], rng)
        if data["state"].shape != shape:
            bad.append(str(data["state"].shape))
        return idx, len(idx)

    def update(idx) -> None:
        mem.update(idx, rng.uniform(0.1, 10.0, len(idx)))

    out = learner_loop(spec, draw, update)
    # the actors have stopped: drain what is left, then report what the memory holds
    deadline = now() + 20
    quiet_since = now()
    last = mem.stored
    while now() < deadline:
        time.sleep(0.05)
        if mem.stored != last or r.llen(b"exp"):
            last, quiet_since = mem.stored, now()
        elif now() - quiet_since > 0.5:
            break
    stop.set()
    t.join(timeout=5)
    out["bad_batches"] = bad
    out["stored"] = mem.stored
    begin = out["start"] + spec["warmup"]
    out["stored_in_window"] = sum(n for t_, n in stored_at if begin <= t_ <= begin + spec["seconds"])
    out["commit_lag"] = latency_stats(lags)
    return out


ROLES = {"reprise-actor": role_reprise_actor, "reprise-learner": role_reprise_learner,
         "redis-actor": role_redis_actor, "redis-learner": role_redis_learner}


def connect_retry(fn, seconds: float = 20.0):
    deadline = now() + seconds
    while True:
        try:
            return fn()
        except Exception:
            if now() > deadline:
                raise
            time.sleep(0.1)


def role_main(role: str, spec_json: str) -> None:
    spec = json.loads(spec_json)
    spec["frame"] = tuple(spec["frame"])
    path = os.path.join(spec["dir"], f"{spec['name']}.json")
    try:
        out = ROLES[role](spec)
    except BaseException as e:  # recorded: the orchestrator reports it
        import traceback
        out = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
    with open(path + ".tmp", "w") as f:
        json.dump(out, f)
    os.replace(path + ".tmp", path)


# --- the orchestrator -------------------------------------------------------------------------
def server_toml(cfg: dict, actors: int, bind: str) -> str:
    frame = list(cfg["frame"])
    margin = actors * (cfg["push"] + 2 * BLOCK_STEPS) + 2 * cfg["sample"] + 4 * BLOCK_STEPS
    return f"""# generated by benchmarks/innetwork/placement.py
address = "{bind}"
token = "{TOKEN}"
max_connections_per_peer = 128

[[stores]]
name = "{TABLE}"
capacity = {cfg['max_size'] + margin}
block_steps = {BLOCK_STEPS}
fields = {{ state = {{ shape = {frame}, dtype = "uint8" }}, next_state = {{ shape = {frame}, dtype = "uint8" }}, action = {{ dtype = "int64" }}, reward = {{ dtype = "float32" }} }}

[[tables]]
name = "{TABLE}"
store = "{TABLE}"
sampler = {{ kind = "Prioritized", priority_exponent = {PRIORITY_EXPONENT} }}
remover = "Fifo"
max_size = {cfg['max_size']}
rate_limiter = {{ kind = "MinSize", min_size_to_sample = {cfg['min_size']} }}
extensions = []
"""


def wait_for(pred, seconds: float, what: str, procs=()) -> None:
    deadline = now() + seconds
    while not pred():
        for p in procs:
            if p.poll() is not None:
                raise RuntimeError(f"{what}: a process exited early ({p.args[-3:]} -> {p.returncode})")
        if now() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.02)


def tail(path: str, n: int = 1500) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()[-n:]
    except OSError:
        return ""


class ChildrenTimeout(TimeoutError):
    def __init__(self, msg: str, logs: dict) -> None:
        super().__init__(msg)
        self.logs = logs


class Run:
    """One deployment's run: its children, files and the measurement window."""

    def __init__(self, net: Network, cfg: dict, actors: int) -> None:
        self.net, self.cfg, self.actors = net, cfg, actors
        self.dir = tempfile.mkdtemp(prefix="rp-placement-")
        os.chmod(self.dir, 0o777)
        self.children: dict[str, subprocess.Popen] = {}
        self.daemons: list[subprocess.Popen] = []

    def spec(self, name: str, **kw) -> dict:
        c = self.cfg
        return {"name": name, "dir": self.dir, "frame": list(c["frame"]), "push": c["push"],
                "sample": c["sample"], "pool": c["pool"], "warmup": c["warmup"],
                "seconds": c["seconds"], "actor_period": c["actor_period"],
                "learner_period": c["learner_period"], "max_size": c["max_size"],
                "min_size": c["min_size"], **kw}

    def child(self, host: str, role: str, spec: dict) -> None:
        logf = open(os.path.join(self.dir, f"{spec['name']}.log"), "w")
        self.children[spec["name"]] = self.net.popen(
            host, [sys.executable, "-m", "benchmarks.innetwork.placement", "--role", role,
                   json.dumps(spec)], stdout=logf, stderr=subprocess.STDOUT, cwd=ROOT_DIR)
        logf.close()

    def daemon(self, host: str, argv: list[str], name: str) -> subprocess.Popen:
        logf = open(os.path.join(self.dir, f"{name}.log"), "w")
        p = self.net.popen(host, argv, stdout=logf, stderr=subprocess.STDOUT, cwd=self.dir)
        logf.close()
        self.daemons.append(p)
        return p

    def measure(self) -> dict:
        """Wait for every child to be READY, start them together, read the learner's and
        the actors' link counters at the window's edges, collect every child's result."""
        names = list(self.children)
        wait_for(lambda: all(os.path.exists(os.path.join(self.dir, f"{n}.ready")) for n in names),
                 CHILD_READY_S, "the children to be ready", self.children.values())
        start = now() + 0.3
        with open(os.path.join(self.dir, "go.tmp"), "w") as f:
            f.write(repr(start))
        os.replace(os.path.join(self.dir, "go.tmp"), os.path.join(self.dir, "go"))
        c = self.cfg
        begin, end = start + c["warmup"], start + c["warmup"] + c["seconds"]
        time.sleep(max(0.0, begin - now()))
        links0 = self.links()
        t0 = now()
        time.sleep(max(0.0, end - now()))
        links1 = self.links()
        t1 = now()
        try:
            wait_for(lambda: all(os.path.exists(os.path.join(self.dir, f"{n}.json")) for n in names),
                     COOLDOWN_S + 30, "the children's results")
        except TimeoutError:
            missing = [n for n in names if not os.path.exists(os.path.join(self.dir, f"{n}.json"))]
            logs = {n: tail(os.path.join(self.dir, f"{n}.log"), 6000) for n in missing}
            for d in ("server", "redis"):
                if os.path.exists(os.path.join(self.dir, f"{d}.log")):
                    logs[d] = tail(os.path.join(self.dir, f"{d}.log"), 3000)
            raise ChildrenTimeout(f"no result from {missing} {COOLDOWN_S + 30:.0f} s after the "
                                  "window", logs) from None
        results = {}
        for n in names:
            with open(os.path.join(self.dir, f"{n}.json")) as f:
                results[n] = json.load(f)
            if "error" in results[n]:
                results[n]["log"] = tail(os.path.join(self.dir, f"{n}.log"))
        links = None
        if links0 is not None:
            links = {k: {f: links1[k][f] - links0[k][f] for f in links0[k]} for k in links0}
            links["seconds"] = t1 - t0
        return {"results": results, "links": links}

    def links(self) -> dict | None:
        if not self.net.namespaced:
            return None
        out = {"learner": self.net.link_bytes("learner")}
        total = dict.fromkeys(out["learner"], 0)
        for i in range(self.actors):
            for k, v in self.net.link_bytes(f"actor{i}").items():
                total[k] += v
        out["actors"] = total
        return out

    def close(self) -> None:
        stop_all(list(self.children.values()) + self.daemons, 15)
        shutil.rmtree(self.dir, ignore_errors=True)


ROOT_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_reprise(net: Network, cfg: dict, actors: int) -> dict:
    run = Run(net, cfg, actors)
    try:
        bind = "0.0.0.0:0" if net.namespaced else f"{net.address('replay')}:0"
        toml = os.path.join(run.dir, "replay.toml")
        with open(toml, "w") as f:
            f.write(server_toml(cfg, actors, bind))
        server = run.daemon("replay", [sys.executable, "-c", "from reprise.cli import main; main()",
                                       "serve", "--config", toml], "server")
        server_log = os.path.join(run.dir, "server.log")
        wait_for(lambda: " at " in tail(server_log), 60, "reprise serve", [server])
        port = tail(server_log).split(" at ", 1)[1].split()[0].rsplit(":", 1)[1]
        for i in range(actors):
            addr = f"{net.address('replay', facing=f'actor{i}')}:{port}"
            run.child(f"actor{i}", "reprise-actor",
                      run.spec(f"actor{i}", address=addr, seed=20 + i,
                               phase=(i + 0.5) * cfg["actor_period"] / actors))
        addr = f"{net.address('replay', facing='learner')}:{port}"
        run.child("learner", "reprise-learner", run.spec("learner", address=addr))
        m = run.measure()
        m["path"] = ("reprise serve (middle node), Prioritized(0.6) table; actors: rp.Client"
                     f"(token, compression='none').writer: extend({cfg['push']}) + create_items + "
                     f"flush; learner: client.sample({cfg['sample']}) + update_priorities")
        return m
    finally:
        run.close()


def run_redis(net: Network, cfg: dict, actors: int) -> dict:
    if shutil.which("redis-server") is None:
        return {"skipped": "redis-server not found (apt-get install redis-server)"}
    try:
        import redis  # noqa: F401
    except ImportError:
        return {"skipped": "python package redis not installed (pip install redis hiredis)"}
    run = Run(net, cfg, actors)
    try:
        host = net.address("learner")
        port = PORT_REDIS if net.namespaced else free_port(host)
        run.daemon("learner", ["redis-server", "--bind", host, "127.0.0.1", "--port", str(port),
                               "--save", "", "--appendonly", "no", "--protected-mode", "no",
                               "--dir", run.dir, "--daemonize", "no", "--loglevel", "notice"],
                   "redis")
        wait_for(lambda: "Ready to accept connections" in tail(os.path.join(run.dir, "redis.log"),
                                                               100_000),
                 30, "redis-server", run.daemons)
        for i in range(actors):
            run.child(f"actor{i}", "redis-actor",
                      run.spec(f"actor{i}", redis_host=host, redis_port=port, seed=20 + i,
                               phase=(i + 0.5) * cfg["actor_period"] / actors))
        run.child("learner", "redis-learner",
                  run.spec("learner", redis_host="127.0.0.1" if net.namespaced else host,
                           redis_port=port))
        m = run.measure()
        m["path"] = (f"redis-server on the learner; actors: pickle.dumps(batch of {cfg['push']}, "
                     "protocol 5) + RPUSH; learner process: drain thread BLPOP/LPOP -> numpy "
                     f"arrays + numpy sum tree, samples {cfg['sample']} locally + sets priorities")
        return m
    finally:
        run.close()


def summarize(m: dict, cfg: dict, actors: int) -> dict:
    """The numbers of one deployment's run (one actor count)."""
    if "skipped" in m:
        return m
    res = m["results"]
    errors = {k: v["error"] for k, v in res.items() if "error" in v}
    if errors:
        return {"error": "; ".join(f"{k}: {v}" for k, v in errors.items()),
                "logs": {k: v.get("log", "") for k, v in res.items() if "error" in v}}
    secs = cfg["seconds"]
    acts = [res[f"actor{i}"] for i in range(actors)]
    learner = res["learner"]
    push_lat = [x for a in acts for x in a["lat"]]
    pushes_in_window = sum(a["pushes_in_window"] for a in acts)
    bytes_per_push = acts[0]["bytes_per_push"]
    pushes_total = sum(a["pushes"] + a["pushes_before"] for a in acts)
    out = {"push": latency_stats(push_lat), "sample": latency_stats(learner["sample_lat"]),
           "update": latency_stats(learner["update_lat"]),
           "inserted_items_per_s": pushes_in_window * cfg["push"] / secs,
           "pushed_bytes_in_window": pushes_in_window * bytes_per_push,
           "bytes_per_push": bytes_per_push,
           "learner_rounds_in_window": learner["rounds_in_window"],
           "sampled_items_per_s": learner["rounds_in_window"] * cfg["sample"] / secs,
           "pushes_total": pushes_total, "items_pushed_total": pushes_total * cfg["push"],
           "sampled_total": learner["sampled"], "rounds_total": learner["rounds"],
           "bad_batches": learner["bad_batches"],
           "throttled_s": sum(a["throttled_s"] for a in acts), "path": m["path"]}
    if "table" in learner:
        out["table"] = learner["table"]
        out["items_stored_total"] = learner["table"]["num_inserts"]
    if "stored" in learner:
        out["items_stored_total"] = learner["stored"]
        out["stored_items_per_s"] = learner["stored_in_window"] / secs
        out["commit_lag"] = learner["commit_lag"]
    links = m["links"]
    if links is not None:
        ll = links["learner"]
        out["learner_link"] = {**ll, "bytes": ll["rx_bytes"] + ll["tx_bytes"],
                               "seconds": links["seconds"]}
        out["actor_links"] = {**links["actors"],
                              "bytes": links["actors"]["rx_bytes"] + links["actors"]["tx_bytes"]}
        rounds = max(1, learner["rounds_in_window"])
        out["learner_link_bytes_per_batch"] = out["learner_link"]["bytes"] / rounds
        out["learner_link_mb_per_s"] = out["learner_link"]["bytes"] / links["seconds"] / 1e6
    return out


def run_all(cfg: dict, namespaces: bool | None, order=("reprise", "redis")) -> dict:
    """Every actor count: one network, ``rounds`` rounds of every deployment (the order
    alternating round by round), each deployment's rounds combined by ``combine``."""
    points = {}
    k = 0
    for n in cfg["actors"]:
        hosts = [f"actor{i}" for i in range(n)] + ["learner"]
        with Network(hosts, hub="replay", namespaces=namespaces) as net:
            shaped = None
            if net.namespaced and cfg["rate"] not in ("none", ""):
                for h in hosts:
                    net.shape(h, cfg["rate"])
                shaped = cfg["rate"]
            point = {"namespaced": net.namespaced, "fallback_reason": net.reason,
                     "rate": shaped, "deployments": {}, "rounds": {d: [] for d in order},
                     "loadavg_1m": []}
            for r in range(cfg["rounds"]):
                seq = list(order) if k % 2 == 0 else list(reversed(order))
                k += 1
                for d in seq:
                    point["loadavg_1m"].append(round(os.getloadavg()[0], 2))
                    log(f"== {n} actor(s), round {r + 1}/{cfg['rounds']}: {d} "
                        f"({'namespaces' if net.namespaced else 'loopback'}"
                        f"{', links ' + shaped if shaped else ''}) ...")
                    try:
                        m = (run_reprise if d == "reprise" else run_redis)(net, cfg, n)
                        s = summarize(m, cfg, n)
                    except Exception as e:
                        import traceback
                        s = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc(),
                             "logs": getattr(e, "logs", None)}
                    if "skipped" in s:
                        log(f"== {d}: SKIPPED: {s['skipped']}")
                    elif "error" in s:
                        log(f"== {d}: ERROR: {s['error']}")
                    else:
                        log(f"   push p50 {s['push'].get('p50_ms', float('nan')):.2f} ms, sample p50 "
                            f"{s['sample'].get('p50_ms', float('nan')):.2f} ms, "
                            f"{s['inserted_items_per_s']:.0f} items/s, learner link "
                            f"{fmt_mb(s.get('learner_link', {}).get('bytes'))} MB")
                    point["rounds"][d].append(s)
            point["deployments"] = {d: combine(point["rounds"][d]) for d in order}
            points[str(n)] = point
    return points


MEDIAN_KEYS = [("push", "p50_ms"), ("push", "p90_ms"), ("push", "p99_ms"), ("push", "mean_ms"),
               ("sample", "p50_ms"), ("sample", "p90_ms"), ("sample", "p99_ms"),
               ("sample", "mean_ms"), ("update", "p50_ms"), ("update", "p99_ms"),
               ("commit_lag", "p50_ms"), ("commit_lag", "p99_ms"),
               ("inserted_items_per_s",), ("sampled_items_per_s",), ("stored_items_per_s",),
               ("pushed_bytes_in_window",), ("learner_rounds_in_window",), ("throttled_s",),
               ("learner_link", "bytes"), ("learner_link", "rx_bytes"), ("learner_link", "tx_bytes"),
               ("actor_links", "bytes"), ("learner_link_bytes_per_batch",),
               ("learner_link_mb_per_s",)]
SUM_KEYS = ["pushes_total", "items_pushed_total", "items_stored_total", "sampled_total",
            "rounds_total"]


def combine(rounds: list[dict]) -> dict:
    """One deployment's rounds as one entry: the median of every measured number over the
    rounds, the sums of the totals each side checked, the first round's description."""
    import statistics
    if not rounds:
        return {"skipped": "no rounds"}
    for s in rounds:
        if "skipped" in s:
            return s
    failed = [s for s in rounds if "error" in s]
    rounds = [s for s in rounds if "error" not in s]
    if not rounds:
        return failed[0]
    out = json.loads(json.dumps(rounds[0]))
    out["rounds"] = len(rounds)
    if failed:  # said in the table; their errors and logs are in the point's "rounds"
        out["failed_rounds"] = [f["error"] for f in failed]
    for path in MEDIAN_KEYS:
        values = []
        for s in rounds:
            v = s
            for key in path:
                v = v.get(key) if isinstance(v, dict) else None
            if v is not None:
                values.append(v)
        if len(values) == len(rounds):
            target = out
            for key in path[:-1]:
                target = target[key]
            target[path[-1]] = statistics.median(values)
    for key in SUM_KEYS:
        if all(key in s for s in rounds):
            out[key] = sum(s[key] for s in rounds)
    out["bad_batches"] = [b for s in rounds for b in s["bad_batches"]]
    if "table" in out:
        out["table"]["num_samples"] = sum(s["table"]["num_samples"] for s in rounds)
    out["push"]["n"] = sum(s["push"]["n"] for s in rounds)
    out["sample"]["n"] = sum(s["sample"]["n"] for s in rounds)
    return out


def fmt_mb(b) -> str:
    return "n/a" if b is None else f"{b / 1e6:.1f}"


def fmt(x, spec=".2f") -> str:
    return "n/a" if x is None else format(x, spec)


def ratios(points: dict) -> dict:
    out = {}
    for n, p in points.items():
        d = p["deployments"]
        a, b = d.get("reprise", {}), d.get("redis", {})
        if "push" not in a or "push" not in b:
            continue
        r = {"push_p50_redis_over_reprise": _div(b["push"].get("p50_ms"), a["push"].get("p50_ms")),
             "push_p99_redis_over_reprise": _div(b["push"].get("p99_ms"), a["push"].get("p99_ms")),
             "sample_p50_redis_over_reprise": _div(b["sample"].get("p50_ms"), a["sample"].get("p50_ms")),
             "inserted_reprise_over_redis": _div(a["inserted_items_per_s"], b["inserted_items_per_s"])}
        if "learner_link" in a and "learner_link" in b:
            r["learner_link_bytes_redis_over_reprise"] = _div(b["learner_link"]["bytes"],
                                                              a["learner_link"]["bytes"])
        out[n] = r
    return out


def _div(x, y):
    return None if x is None or not y else x / y


def build_markdown(report: dict) -> str:
    cfg = report["config"]
    t = transition_bytes(cfg["frame"])
    lines = ["# In-network replay placement: Reprise on the middle node vs Redis on the learner",
             "", *machine_lines(report), "",
             f"Command: `{report['command']}`. Transitions: 2 x uint8{list(cfg['frame'])} + int64 + "
             f"float32 = {t:,} B; a push is {cfg['push']} of them ({cfg['push'] * t / 1e6:.2f} MB), "
             f"a sampled batch {cfg['sample']} ({cfg['sample'] * t / 1e6:.2f} MB). Each actor pushes "
             f"every {cfg['actor_period']} s, the learner starts a round every "
             f"{cfg['learner_period']} s; window {cfg['warmup']} s warm-up + {cfg['seconds']} s; "
             f"{cfg['rounds']} round(s) per deployment and actor count, the order alternating, "
             "medians over the rounds.", ""]
    offered = cfg["push"] * t / cfg["actor_period"] / 1e6
    lines.append(f"Offered push load: {offered:.1f} MB/s per actor "
                 f"({', '.join(f'{n} actors {n * offered:.0f} MB/s' for n in cfg['actors'])}); "
                 f"learner: at most {cfg['sample'] * t / cfg['learner_period'] / 1e6:.1f} MB/s sampled.")
    lines.append("")
    first = next(iter(report["points"].values()), {})
    if first.get("namespaced"):
        rate = first.get("rate")
        cap = f" = {rate_bits(rate) / 8e6:.0f} MB/s each way" if rate else ""
        lines.append(f"Network namespaces + veth, every link shaped to {rate or 'no limit'}{cap} "
                     "(tc tbf, both ways). Learner link = the learner's veth rx+tx (headers included).")
    else:
        lines.append(f"**Loopback fallback** ({first.get('fallback_reason', '')}): link bytes not "
                     "measurable (n/a), no shaping; latencies only.")
    failures = [(n, d, s["failed_rounds"]) for n, p in report["points"].items()
                for d, s in p["deployments"].items() if s.get("failed_rounds")]
    for n, d, errs in failures:
        lines.append(f"**{n} actors, {d}: {len(errs)} round(s) failed** ({errs[0].splitlines()[0][:160]}); "
                     "its numbers are the medians of the other rounds.")
    lines += ["", "| actors | deployment | push p50 ms | push p99 ms | sample p50 ms | sample p99 ms "
              "| inserted items/s | sampled items/s | pushed MB | learner link MB | link MB / batch |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for n, p in report["points"].items():
        for d, s in p["deployments"].items():
            if "push" not in s:
                why = s.get("skipped") or s.get("error", "?")
                lines.append(f"| {n} | {d} | {why.splitlines()[0][:80]} | | | | | | | | |")
                continue
            ll = s.get("learner_link", {}).get("bytes")
            lines.append(
                f"| {n} | {d} | {fmt(s['push'].get('p50_ms'))} | {fmt(s['push'].get('p99_ms'))} | "
                f"{fmt(s['sample'].get('p50_ms'))} | {fmt(s['sample'].get('p99_ms'))} | "
                f"{s['inserted_items_per_s']:,.0f} | {s['sampled_items_per_s']:,.0f} | "
                f"{s['pushed_bytes_in_window'] / 1e6:.1f} | {fmt_mb(ll)} | "
                f"{fmt_mb(s.get('learner_link_bytes_per_batch'))} |")
    rs = report.get("ratios", {})
    if rs:
        lines += ["", "| actors | push p50 redis/reprise | push p99 redis/reprise | sample p50 "
                  "redis/reprise | learner-link bytes redis/reprise | inserted reprise/redis |",
                  "|---|---|---|---|---|---|"]
        for n, r in rs.items():
            lines.append(f"| {n} | {fmt(r['push_p50_redis_over_reprise'])} | "
                         f"{fmt(r['push_p99_redis_over_reprise'])} | "
                         f"{fmt(r['sample_p50_redis_over_reprise'])} | "
                         f"{fmt(r.get('learner_link_bytes_redis_over_reprise'))} | "
                         f"{fmt(r['inserted_reprise_over_redis'])} |")
    loads = [x for p in report["points"].values() for x in p.get("loadavg_1m", [])]
    if loads:
        lines += ["", f"1-minute load average before each run: {min(loads):.1f} to {max(loads):.1f} "
                  f"(2 cores; anything else running shares them)."]
    drain = [(n, p["deployments"]["redis"]) for n, p in report["points"].items()
             if "push" in p["deployments"].get("redis", {})]
    if drain:
        lines += ["", "The baseline's drain (Redis list -> sum tree, a thread in the learner process):",
                  "", "| actors | pushed items/s | stored in the sum tree items/s | push -> in the sum "
                  "tree p50 ms | p99 ms | actors' waits for the list to shrink (s, all actors) |",
                  "|---|---|---|---|---|---|"]
        for n, s in drain:
            lag = s.get("commit_lag", {})
            lines.append(f"| {n} | {s['inserted_items_per_s']:,.0f} | "
                         f"{s.get('stored_items_per_s', 0):,.0f} | {fmt(lag.get('p50_ms'))} | "
                         f"{fmt(lag.get('p99_ms'))} | {s['throttled_s']:.1f} |")
    lines += ["", "Push: Reprise = extend + create_items + flush (returns once the items are in the "
              "table); Redis = pickle + RPUSH (returns once Redis holds the blob; the drain into "
              "the sum tree follows: push -> in the sum tree above). While the Redis list holds more "
              f"than {REDIS_MAX_QUEUED} batches an actor waits for it to shrink (a memory guard); that "
              "wait is not in its push latency. Sample: Reprise = one "
              "client.sample over the learner's link; Redis = a local draw + gather from the "
              "numpy sum tree. Kernel-bypass stacks (the paper's DPDK Redis and in-network "
              "micro-threads) are not reproducible here: this measures the placement."]
    return "\n".join(lines) + "\n"


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny sizes, 1 and 2 actors: a smoke test")
    ap.add_argument("--actors", help="comma-separated actor counts (default 1,2,4,8; quick 1,2)")
    ap.add_argument("--seconds", type=float, help="measured seconds per run (default 10)")
    ap.add_argument("--warmup", type=float, help="seconds before the window (default 3)")
    ap.add_argument("--frame", help="state/next_state frame shape, e.g. 4,84,84 (default 4,42,42)")
    ap.add_argument("--actor-period", type=float, help="seconds between one actor's pushes (0.1)")
    ap.add_argument("--learner-period", type=float, help="seconds between learner rounds (0.2)")
    ap.add_argument("--max-size", type=int, help="table / sum-tree capacity (65536)")
    ap.add_argument("--rounds", type=int, help="rounds per deployment and actor count, order "
                    "alternating; medians reported (default 3, quick 1)")
    ap.add_argument("--rate", help="tc tbf rate of every link, both ways, or 'none' (1gbit)")
    ap.add_argument("--deployments", default="reprise,redis", help="which of reprise,redis to run")
    ap.add_argument("--namespaces", choices=("auto", "on", "off"), default="auto",
                    help="network namespaces: when possible (auto), required (on), never (off)")
    ap.add_argument("--out-dir", default=OUT, help="where the .json and .md go (default benchmarks/out)")
    return ap.parse_args(argv)


def make_config(args) -> dict:
    cfg = dict(QUICK if args.quick else FULL)
    if args.actors:
        cfg["actors"] = [int(x) for x in args.actors.split(",")]
    for k in ("seconds", "warmup", "actor_period", "learner_period", "max_size", "rate", "rounds"):
        v = getattr(args, k)
        if v is not None:
            cfg[k] = v
    if args.frame:
        cfg["frame"] = tuple(int(x) for x in args.frame.split(","))
    if cfg["rate"] not in ("none", ""):
        rate_bits(cfg["rate"])  # refuse a malformed rate before anything starts
    cfg["frame"] = list(cfg["frame"])
    cfg["transition_bytes"] = transition_bytes(cfg["frame"])
    return cfg


def main(argv=None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) >= 3 and argv[0] == "--role":
        role_main(argv[1], argv[2])
        return {}
    args = parse_args(argv)
    cfg = make_config(args)
    # SIGTERM unwinds like Ctrl-C, so every Network and child is cleaned up on the way out
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    namespaces = {"auto": None, "on": True, "off": False}[args.namespaces]
    ok, why = can_namespace()
    if namespaces is not False and not ok:
        log(f"namespaces unavailable ({why}): loopback fallback, link bytes n/a")
    stem, report = start_report("placement", args.quick, args.out_dir,
                                command=" ".join(["python -m benchmarks.innetwork.placement", *argv]))
    report["config"] = cfg
    report["versions"] = package_versions("reprise", "redis", "numpy")
    r = subprocess.run(["redis-server", "--version"], capture_output=True, text=True, timeout=10) \
        if shutil.which("redis-server") else None
    report["versions"]["redis-server"] = r.stdout.strip() if r else None
    order = tuple(d for d in args.deployments.split(",") if d in ("reprise", "redis"))
    report["points"] = run_all(cfg, namespaces, order)
    report["ratios"] = ratios(report["points"])
    write_outputs(args.out_dir, stem, report, build_markdown(report))
    report["paths"] = {"json": os.path.join(args.out_dir, stem + ".json"),
                       "md": os.path.join(args.out_dir, stem + ".md")}
    return report


if __name__ == "__main__":
    main()
