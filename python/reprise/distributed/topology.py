"""Which ranks consume batches: every rank, or the first pipeline stage of a
(pp, dp) grid given as a tuple, a torch ``DeviceMesh`` or DeepSpeed's
``PipeModelDataParallelTopology``."""

from __future__ import annotations

from ..errors import InvalidArgument


def consumers(topology, size: int) -> list[int]:
    """The consuming ranks (group order) for ``topology`` over ``size`` ranks."""
    if topology is None:
        return list(range(size))
    if isinstance(topology, tuple):
        return _grid(topology, size)
    if hasattr(topology, "mesh_dim_names") and hasattr(topology, "mesh"):
        return _device_mesh(topology, size)
    if hasattr(topology, "get_axis_names") and hasattr(topology, "filter_match"):
        return _deepspeed(topology, size)
    raise InvalidArgument(
        f"topology must be None, a (pp, dp) tuple, a torch DeviceMesh or DeepSpeed's "
        f"PipeModelDataParallelTopology, got {type(topology).__name__}"
    )


def _grid(topology, size):
    if len(topology) != 2 or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in topology):
        raise InvalidArgument(f"topology as a tuple is (pp, dp) with both >= 1, got {topology!r}")
    pp, dp = topology
    if pp * dp != size:
        raise InvalidArgument(f"topology (pp={pp}, dp={dp}) covers {pp * dp} ranks, but the group has {size}")
    # Rank = stage * dp + data index (pipeline-major, as torchrun launches stages).
    return list(range(dp))


def _device_mesh(mesh, size):
    names = tuple(mesh.mesh_dim_names or ())
    if set(names) - {"pp", "dp"} or "dp" not in names:
        raise InvalidArgument(
            f"a DeviceMesh topology needs dims named 'dp' and optionally 'pp' (tensor parallel is "
            f"not supported in cluster mode v1), got {names}"
        )
    grid = mesh.mesh
    if grid.numel() != size:
        raise InvalidArgument(f"the DeviceMesh covers {grid.numel()} ranks, but the group has {size}")
    if "pp" in names:
        grid = grid.select(names.index("pp"), 0)
    return sorted(int(r) for r in grid.flatten().tolist())


def _deepspeed(topo, size):
    axes = list(topo.get_axis_names())
    if "model" in axes and topo.get_dim("model") > 1:
        raise InvalidArgument("tensor (model) parallelism > 1 is not supported in cluster mode v1")
    if topo.world_size() != size:
        raise InvalidArgument(f"the DeepSpeed topology covers {topo.world_size()} ranks, but the group has {size}")
    if "pipe" not in axes:
        return list(range(size))
    return sorted(topo.filter_match(pipe=0))
