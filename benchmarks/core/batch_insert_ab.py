"""A/B micro-benchmark: in-process Table.insert of [256, 1, 100k float32] (400 KB items).

Run it with two builds to compare them: `PYTHONPATH=/path/to/other/site python -m benchmarks.core.batch_insert_ab`."""
import sys, time, statistics
import numpy as np
import reprise as rp
print(rp.__file__, file=sys.stderr)
store = rp.Store({"obs": rp.Field((100_000,), "float32")}, capacity=4096, block_steps=16)
t = rp.Table("t", store, max_size=2048)
data = {"obs": np.random.rand(256, 1, 100_000).astype(np.float32)}
rates = []
for r in range(12):
    t0 = time.perf_counter()
    for _ in range(4):
        t.insert(data, priorities=1.0)
    rates.append(4 * 256 / (time.perf_counter() - t0))
print(f"median {statistics.median(rates[2:]):,.0f} items/s  all {[round(x) for x in rates]}")
store.close()
