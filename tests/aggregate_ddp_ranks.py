"""One DDP rank for tests/test_aggregate_ddp.py: trains a small model for a few steps with its
gradients averaged by `--via` (the daemon through `rp.aggregate.ddp_hook`, gloo's own
all-reduce, or a gloo reference that does the daemon's fixed-point arithmetic), then saves
its parameters."""

import argparse
import datetime
import os
import sys

import numpy as np
import torch
import torch.distributed as dist

import reprise as rp


def reference_int32_hook(scale):
    """Quantize, sum the int32 values with gloo, and undo it exactly as `Worker.allreduce(average=True)`."""
    def hook(world, bucket):
        x = bucket.buffer().detach().numpy()
        q = torch.from_numpy(rp.aggregate.quantize(x, scale, world))

        def undo(f):
            total = f.value()[0].numpy()
            return torch.from_numpy((rp.aggregate.dequantize(total, scale) / np.float32(world)).astype(np.float32))
        return dist.all_reduce(q, async_op=True).get_future().then(undo)
    return hook


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rank", type=int)
    p.add_argument("--world", type=int)
    p.add_argument("--init")
    p.add_argument("--via")
    p.add_argument("--daemon")
    p.add_argument("--job", type=int, default=1)
    p.add_argument("--out")
    p.add_argument("--steps", type=int, default=6)
    a = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=a.init, rank=a.rank, world_size=a.world,
                            timeout=datetime.timedelta(seconds=60))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64), torch.nn.Tanh(),
                                torch.nn.Linear(64, 1))
    ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.01)
    scale = 2.0**16
    worker = None
    if a.via.startswith("daemon"):
        dtype = a.via.split("-")[1]
        worker = rp.aggregate.Worker(a.daemon, job=a.job, rank=a.rank, size=a.world, dtype=dtype, scale=scale, timeout=30)
        ddp.register_comm_hook(worker, rp.aggregate.ddp_hook)
    elif a.via == "reference-int32":
        ddp.register_comm_hook(a.world, reference_int32_hook(scale))
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(100 + a.rank)
    for _ in range(a.steps):
        x = torch.randn(32, 8, generator=g)
        y = x.sum(dim=1, keepdim=True).sin()
        opt.zero_grad()
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()
    np.savez(a.out, *[t.detach().numpy() for t in model.parameters()])
    if worker is not None:
        worker.close()
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    # gloo's threads sometimes abort the interpreter's own teardown ("terminate called without
    # an active exception"); everything this rank had to do is done and saved.
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
