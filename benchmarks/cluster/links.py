"""The cluster benchmark's ranks on real links: each rank in a network namespace of its own,
joined to a switch namespace by a veth pair shaped with ``tc tbf`` (``benchmarks.innetwork.netns``),
so gloo runs over TCP between "hosts" as it would across machines, and every byte of the
exchange crosses two shaped links (rank -> switch -> rank).

``run_ranks_on_links(world, cfg, rate)`` starts ``python -m benchmarks.cluster.links`` once
per rank inside its namespace: ``GLOO_SOCKET_IFNAME`` is the rank's veth, rank 0 holds the
TCPStore on its own address, ``REPRISE_HOST_ID`` names the rank's namespace (each rank is a
host: ``shards="rank"`` and ``assignment="iid"`` send every other rank's rows over the links),
and each rank runs ``measure.rank_main`` and writes its result to a file the parent reads.
Every rank has a deadline; the namespaces go when the run ends (or at exit)."""

from __future__ import annotations

import argparse
import json
import os
import pickle
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

PORT = 29500  # on rank 0's address, inside namespaces of this run only: nothing else listens there
ROOT = Path(__file__).resolve().parents[2]


class LinkError(RuntimeError):
    """The ranks could not run on namespaced links (not root, no iproute2, a rank failed)."""


def run_ranks_on_links(world: int, cfg: dict, rate: str, deadline: float) -> tuple[list[dict], dict]:
    """Each rank's ``rank_main`` result, with the ranks on links shaped to ``rate`` (a ``tc``
    rate such as ``10gbit``); and what the links carried (bytes per rank's link)."""
    from benchmarks.innetwork.netns import Network, NamespaceError
    hosts = [f"r{i}" for i in range(world)]
    try:
        net = Network(hosts, hub="sw", namespaces=True)
    except NamespaceError as e:
        raise LinkError(f"no namespaced links here: {e}") from e
    with net, tempfile.TemporaryDirectory(prefix="rp-links-") as tmp:
        for h in hosts:
            net.shape(h, rate)
        cfg_path = Path(tmp) / "cfg.json"
        cfg_path.write_text(json.dumps(dict(cfg, links=True)))
        before = {h: net.link_bytes(h) for h in hosts}
        procs = []
        for r, h in enumerate(hosts):
            env = dict(os.environ, GLOO_SOCKET_IFNAME=net.interface(h), REPRISE_HOST_ID=f"links-{h}",
                       OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(
                           filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
            argv = [sys.executable, "-m", "benchmarks.cluster.links", "--rank", str(r), "--world", str(world),
                    "--master", net.address("r0"), "--config", str(cfg_path), "--out", f"{tmp}/rank{r}.pkl"]
            log = open(f"{tmp}/rank{r}.log", "w")
            procs.append((net.popen(h, argv, env=env, cwd=ROOT, stdout=log, stderr=log), log))
        end = time.monotonic() + deadline
        while any(p.poll() is None for p, _ in procs) and time.monotonic() < end:
            time.sleep(0.2)
        carried = {h: _delta(before[h], net.link_bytes(h)) for h in hosts}
        failed = []
        for r, (p, log) in enumerate(procs):
            log.close()
            if p.poll() is None:
                p.kill()
                failed.append(f"rank {r}: still running after {deadline:.0f} s")
            elif p.returncode != 0 or not Path(f"{tmp}/rank{r}.pkl").exists():
                failed.append(f"rank {r}: exit {p.returncode}\n" + Path(f"{tmp}/rank{r}.log").read_text()[-3000:])
        if failed:
            raise LinkError("ranks failed on namespaced links:\n" + "\n".join(failed))
        return [pickle.loads(Path(f"{tmp}/rank{r}.pkl").read_bytes()) for r in range(world)], carried


def _delta(before: dict | None, after: dict | None) -> dict | None:
    if before is None or after is None:
        return None
    return {k: after[k] - before[k] for k in after}


def _rank(rank: int, world: int, master: str, config: str, out: str) -> None:
    import torch
    import torch.distributed as dist
    from benchmarks.cluster.measure import rank_main
    torch.set_num_threads(1)
    limit = timedelta(seconds=60)
    store = dist.TCPStore(master, PORT, world, is_master=rank == 0, timeout=limit)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=limit)
    result = rank_main(rank, world, json.loads(Path(config).read_text()))
    Path(out).write_bytes(pickle.dumps(result))
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)  # gloo's threads may abort the interpreter's teardown; the result is written


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description="one rank of the cluster benchmark on namespaced links")
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--master", required=True)
    ap.add_argument("--config", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    _rank(a.rank, a.world, a.master, a.config, a.out)
