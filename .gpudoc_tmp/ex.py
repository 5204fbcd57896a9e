import numpy as np
import reprise as rp

store = rp.Store({"obs": rp.Field((4, 84, 84), "uint8"),
                  "reward": rp.Field((), "float32")}, capacity=100_000)
table = rp.Table("replay", store, sampler=rp.selectors.Prioritized(0.6), seed=0)
table.insert({"obs": np.zeros((1000, 1, 4, 84, 84), np.uint8),      # actors would write these
              "reward": np.ones((1000, 1), np.float32)}, priorities=1.0)

s = table.sample(256, device="cuda")
s.data["obs"]              # torch.uint8 on cuda:0, shape [256, 1, 4, 84, 84]
s.keys, s.probabilities    # numpy, as on the host
table.update_priorities(s.keys, np.full(256, 2.0))

import torch
import reprise as rp

sig = {"obs": rp.Field((64,), "float32"), "action": rp.Field((), "int64")}
dev_store = rp.Store(sig, capacity=1_000_000, device="cuda")
dev_table = rp.Table("dev-replay", dev_store, max_size=500_000)

with dev_store.writer() as w:
    w.extend({"obs": torch.randn(8, 64, device="cuda"),              # T = 8 steps
              "action": torch.zeros(8, dtype=torch.int64, device="cuda")})
    w.create_items(dev_table, num_steps=1, priorities=[1.0] * 8)    # one item per step
dev_table.insert({"obs": torch.randn(32, 4, 64, device="cuda"),     # 32 items of 4 steps
                  "action": torch.zeros(32, 4, dtype=torch.int64, device="cuda")},
                 priorities=1.0)

s = dev_table.sample(256, device="cuda")   # tensors on the GPU, gathered in GPU memory
h = dev_table.sample(256)                  # numpy: gathered on the GPU, then copied to the host

gpu_table = rp.Table("gpu-replay", store, sampler=rp.selectors.Prioritized(0.6),
                     seed=0, selection_device="cuda")
gpu_table.insert({"obs": np.zeros((1000, 1, 4, 84, 84), np.uint8),
                  "reward": np.ones((1000, 1), np.float32)}, priorities=np.arange(1000.0))
s = gpu_table.sample(4096, device="cuda")   # picks made on the GPU, rows gathered there
gpu_table.update_priorities(s.keys, np.ones(4096))

for s in table.iterate(batch_size=256, device="cuda", prefetch=2, num_batches=100):
    reward = s.data["reward"][:, 0]                     # use it on the current stream
    table.update_priorities(s.keys, (reward.abs() + 1.0).double().cpu().numpy())

try:
    import cupy, jax
    obs = s.data["obs"]
    c = cupy.from_dlpack(obs)            # CuPy
    j = jax.dlpack.from_dlpack(obs)      # JAX
except ImportError as e:
    print('skipped dlpack block:', e)

print('obs', s.data['obs'].dtype, s.data['obs'].device, tuple(s.data['obs'].shape)); print('store.device', store.device, dev_store.device, type(h.data['obs']))
import torch
print("h100 dlpack jax:", type(j), j.shape, j.dtype, bool((np.asarray(j) == s.data["obs"].cpu().numpy()).all()))
print("cupy:", c.shape)
# timeout partial with fields
t2 = rp.Table("lim", store, rate_limiter=rp.rate_limiters.SampleToInsertRatio(1.0, 1, 5.0))
t2.insert({"obs": np.zeros((3, 1, 4, 84, 84), np.uint8), "reward": np.ones((3, 1), np.float32)}, 1.0)
try:
    t2.sample(50, timeout=0.05, device="cuda", fields=["reward"])
except rp.errors.Timeout as e:
    print("partial:", e.partial, type(e.partial.data["reward"]))
import time
big = rp.Store({"x": rp.Field((1024,), "float32")}, capacity=2_000_000)   # 8 GB
bt = rp.Table("b", big)
bt.insert({"x": np.zeros((4, 1, 1024), np.float32)}, 1.0)
import os
print("resident before: %.2f GB" % (os.stat(big.path).st_blocks * 512 / 1e9))
t0 = time.perf_counter(); bt.sample(4, device="cuda"); torch.cuda.synchronize(); print("first GPU sample of 8 GB store: %.2f s" % (time.perf_counter() - t0))
print("resident after: %.2f GB" % (os.stat(big.path).st_blocks * 512 / 1e9))
t0 = time.perf_counter(); bt.sample(4, device="cuda"); torch.cuda.synchronize(); print("second: %.4f s" % (time.perf_counter() - t0))
big.close(); store.close(); dev_store.close()
print("ok")
