"""A model of one ``ShardedTable.sample`` step on multi-host GPU clusters: predictions,
not measurements (no such cluster was used; see RESULTS.md, "Cluster mode (issue 13)").

    python -m benchmarks.cluster.model                 # the prediction tables, markdown
    python -m benchmarks.cluster.model --host-ns-per-byte 0.9   # + the current code's host term

One step (global batch ``B`` rows of ``s`` bytes, ``h`` hosts of ``g`` GPUs, one consumer
per GPU, ``R = h·g`` ranks, one shard per host) is::

    step ≈ control + max(local bytes per GPU / PCIe bw, remote bytes per NIC / NIC bw)

- ``control``: the step's two collectives' latency: the header ``all_gather`` (16 int64
  per rank; gloo's allgather is a ring, ``R - 1`` hops of ``hop_us`` each; the "tree"
  column assumes a log-depth gather instead, ``ceil(log2 R)`` hops) plus the row
  ``all_to_all`` (one hop: every pair at once). ``hop_us`` = 25 us per cross-host hop is
  an assumption (TCP or IPoIB between hosts), not a measured figure.
- local rows: each GPU gathers its share of the rows from its own host's memory
  (zero-copy reads over its PCIe link, the design in ../shared/CLUSTER.md), in parallel;
- remote rows: with ``assignment="local"`` about ``0.4·h·sqrt(B/h·(1 - 1/h))`` rows per
  step cross hosts (the expected imbalance between a host's drawn share and its
  consumers' share); they fill the first consumers with room, so, pessimistically, a
  host's share ``remote/h`` goes through one NIC. With ``"iid"``, ``(1 - 1/h)·B`` rows
  cross, spread over every GPU's NIC.

The current implementation does not yet read rows from the GPU: the owner's CPU packs
every row it sends, the consumer's CPU unpacks (and CRC-checks) every row it receives,
and NCCL rows are copied host -> GPU -> host around the exchange. ``--host-ns-per-byte``
(what ``compare.py`` measures on this machine: the sample time outside the collectives
per payload byte a rank receives) adds that serial host term to each rank's step."""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

GB = 1e9


@dataclass(frozen=True)
class Cluster:
    name: str
    hosts: int
    gpus_per_host: int
    pcie_gb_per_s: float = 25.0  # per GPU, host memory -> GPU
    nic_gb_per_s: float = 25.0  # per GPU
    hop_us: float = 25.0  # one cross-host message (assumption)

    @property
    def ranks(self) -> int:
        return self.hosts * self.gpus_per_host


# GEAR's cluster (3 x DGX-A100: 8 A100 each, PCIe Gen4 ~25 GB/s and one 200 Gb/s HDR
# InfiniBand port = 25 GB/s per GPU) and the same nodes at 64 hosts.
GEAR = Cluster("GEAR: 3 x DGX-A100 (24 GPUs)", 3, 8)
ONE_NODE = Cluster("1 x DGX-A100 (8 GPUs)", 1, 8)
BIG = Cluster("64 x DGX-A100-class (512 GPUs)", 64, 8)
GEAR_MEASURED = {"one_node_gb_per_s": 17.1, "two_nodes_gb_per_s": 29.1, "three_nodes_gb_per_s": 33.0,
                 "scaling": 33.0 / (3 * 17.1)}
ROW_BYTES = [4096, 16384, 65536]


def remote_rows(batch: float, hosts: int, assignment: str = "local") -> float:
    """Expected rows per step that cross hosts (../shared/CLUSTER.md, "Locality")."""
    if hosts <= 1:
        return 0.0
    if assignment == "iid":
        return (1 - 1 / hosts) * batch
    return 0.4 * hosts * math.sqrt(batch / hosts * (1 - 1 / hosts))


def control_s(c: Cluster, gather: str = "ring") -> float:
    hops = (c.ranks - 1) if gather == "ring" else max(1, math.ceil(math.log2(c.ranks)))
    if c.ranks == 1:
        hops = 0
    return (hops + (1 if c.ranks > 1 else 0)) * c.hop_us * 1e-6


def step(c: Cluster, batch: float, row_bytes: int, assignment: str = "local", gather: str = "ring",
         host_ns_per_byte: float | None = None) -> dict:
    """The model's figures for one step (seconds, rows, GB/s of payload)."""
    remote = remote_rows(batch, c.hosts, assignment)
    per_gpu = batch / c.ranks
    local_rows = (batch - remote) / c.ranks
    t_local = local_rows * row_bytes / (c.pcie_gb_per_s * GB)
    if assignment == "iid":
        t_remote = remote / c.ranks * row_bytes / (c.nic_gb_per_s * GB)
    else:
        t_remote = remote / max(1, c.hosts) * row_bytes / (c.nic_gb_per_s * GB)
    ctl = control_s(c, gather)
    t_host = 0.0 if host_ns_per_byte is None else per_gpu * row_bytes * host_ns_per_byte * 1e-9
    total = ctl + t_host + max(t_local, t_remote)
    return {"remote_rows": remote, "remote_fraction": remote / batch, "rows_per_gpu": per_gpu,
            "control_s": ctl, "local_s": t_local, "remote_s": t_remote, "host_s": t_host, "step_s": total,
            "gb_per_s": batch * row_bytes / total / GB}


def _us(x: float) -> str:
    return f"{x * 1e6:,.0f}" if x >= 1e-5 else f"{x * 1e6:.1f}"


def prediction_lines(host_ns_per_byte: float | None = None, batch: int = 1024) -> list[str]:
    """The markdown tables of the model's predictions (labelled as such)."""
    out = [f"Model predictions (not measurements; see `benchmarks/cluster/model.py`): global batch "
           f"{batch}, one consumer per GPU, one shard per host, `assignment=\"local\"`, "
           f"{GEAR.pcie_gb_per_s:g} GB/s PCIe and {GEAR.nic_gb_per_s:g} GB/s NIC per GPU, "
           f"{GEAR.hop_us:g} us per cross-host hop (assumed). control = header all_gather + row "
           "all_to_all; `ring` = gloo's ring allgather over every rank (today), `tree` = a "
           "log-depth gather.", "",
           "| cluster | row | remote rows/step (iid) | control ring / tree (us) | local gather (us) | "
           "remote (us) | step ring / tree (us) | GB/s ring / tree |",
           "|---|---|---|---|---|---|---|---|"]
    for c in (ONE_NODE, GEAR, BIG):
        for s in ROW_BYTES:
            ring, tree = step(c, batch, s, gather="ring"), step(c, batch, s, gather="tree")
            out.append(f"| {c.name} | {s // 1024} KB | {ring['remote_rows']:.1f} "
                       f"({remote_rows(batch, c.hosts, 'iid'):.0f}) | {_us(ring['control_s'])} / "
                       f"{_us(tree['control_s'])} | {_us(ring['local_s'])} | {_us(ring['remote_s'])} | "
                       f"{_us(ring['step_s'])} / {_us(tree['step_s'])} | "
                       f"{ring['gb_per_s']:.1f} / {tree['gb_per_s']:.1f} |")
    out += ["", f"Weak scaling (batch {batch} per host, i.e. {batch // 8} per GPU), against GEAR's "
            f"measured {GEAR_MEASURED['one_node_gb_per_s']} GB/s on 1 node and "
            f"{GEAR_MEASURED['three_nodes_gb_per_s']} GB/s on 3 "
            f"({GEAR_MEASURED['scaling']:.0%} scaling); the model's scaling = GB/s(h) / (h x GB/s(1)):",
            "",
            "| row | 1 node GB/s ring / tree | 3 nodes GB/s ring / tree | scaling ring / tree | "
            "64 nodes GB/s ring / tree | scaling ring / tree |",
            "|---|---|---|---|---|---|"]
    for s in ROW_BYTES:
        cells = []
        base = {g: step(ONE_NODE, batch, s, gather=g)["gb_per_s"] for g in ("ring", "tree")}
        cells.append(f"{base['ring']:.1f} / {base['tree']:.1f}")
        for c in (GEAR, BIG):
            v = {g: step(c, batch * c.hosts, s, gather=g)["gb_per_s"] for g in ("ring", "tree")}
            cells.append(f"{v['ring']:.1f} / {v['tree']:.1f}")
            cells.append(f"{v['ring'] / (c.hosts * base['ring']):.0%} / {v['tree'] / (c.hosts * base['tree']):.0%}")
        out.append(f"| {s // 1024} KB | " + " | ".join(cells) + " |")
    if host_ns_per_byte:
        out += ["", f"With the current code's host work ({host_ns_per_byte:.2f} ns per received payload byte "
                "per rank, measured on this machine) added to every step (tree gather), GEAR's cluster "
                f"at batch {batch}:", "",
                "| row | host work per rank (us) | step (us) | GB/s | vs the design (tree) |", "|---|---|---|---|---|"]
        for s in ROW_BYTES:
            cur = step(GEAR, batch, s, gather="tree", host_ns_per_byte=host_ns_per_byte)
            design = step(GEAR, batch, s, gather="tree")
            out.append(f"| {s // 1024} KB | {_us(cur['host_s'])} | {_us(cur['step_s'])} | "
                       f"{cur['gb_per_s']:.1f} | {cur['gb_per_s'] / design['gb_per_s']:.0%} |")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=1024, help="global batch per step (default 1024)")
    ap.add_argument("--host-ns-per-byte", type=float, default=None,
                    help="add the current code's host work per received payload byte (ns)")
    args = ap.parse_args()
    print("\n".join(prediction_lines(args.host_ns_per_byte, args.batch)))


if __name__ == "__main__":
    main()
