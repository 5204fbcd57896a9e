"""Quickstart: write episodes, sample by priority, update priorities.

    python examples/quickstart.py
"""

import numpy as np

import reprise as rp

rng = np.random.default_rng(0)
signature = {
    "obs": rp.Field((4,), "float32"),
    "action": rp.Field((), "int64"),
    "reward": rp.Field((), "float32"),
}
store = rp.Store(signature, capacity=10_000, block_steps=64)
table = rp.Table(
    "replay", store,
    sampler=rp.selectors.Prioritized(priority_exponent=0.6),
    remover=rp.selectors.Fifo(),
    max_size=5_000,
    rate_limiter=rp.rate_limiters.MinSize(100),
    seed=0,
)

# An actor loop: one step per call, an item over the last 3 steps of each episode.
with store.writer() as w:
    for episode in range(50):
        for t in range(20):
            w.append({"obs": rng.standard_normal(4, dtype=np.float32), "action": t % 2, "reward": 1.0})
            if t >= 2:
                w.create_item(table, num_steps=3, priority=float(rng.uniform(0.1, 2.0)))
        w.end_episode()

# The bulk path: 256 more items of 3 steps from [n, T, ...] arrays in one call.
keys = table.insert(
    {
        "obs": rng.standard_normal((256, 3, 4), dtype=np.float32),
        "action": np.zeros((256, 3), np.int64),
        "reward": np.ones((256, 3), np.float32),
    },
    priorities=rng.uniform(0.1, 2.0, 256),
)

# A learner step: prioritized sample, importance weights, new priorities.
s = table.sample(8, timeout=1.0)
weights = s.importance_weights(beta=0.4)
applied = table.update_priorities(s.keys, np.abs(rng.standard_normal(len(s))) + 1e-3)

print(f"table size {table.size} (max {table.info()['max_size']}), {len(keys)} bulk-inserted")
print(f"sampled {len(s)} items: data['obs'] {s.data['obs'].dtype}{list(s.data['obs'].shape)}, lengths {s.lengths.tolist()}")
print("keys          ", s.keys.tolist())
print("probabilities ", np.round(s.probabilities, 6).tolist())
print("weights       ", np.round(weights, 3).tolist())
print(f"updated {applied} priorities; info: num_inserts={table.info()['num_inserts']}, "
      f"num_samples={table.info()['num_samples']}")
store.close()
