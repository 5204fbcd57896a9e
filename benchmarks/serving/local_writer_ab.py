"""A/B micro-benchmark: a local client's per-step writer (append + create_item), 400 B steps.

Run it with two builds to compare them: `PYTHONPATH=/path/to/other/site python -m benchmarks.serving.local_writer_ab`."""
import multiprocessing as mp, sys, time, statistics
import numpy as np

def writer(address, n, q):
    import reprise as rp
    c = rp.Client(address)
    obs = np.random.rand(100).astype(np.float32)   # 400 B
    rates = []
    with c.writer("t") as w:
        for rnd in range(6):
            t0 = time.perf_counter()
            for i in range(n):
                w.append({"obs": obs})
                w.create_item("t", 1, 1.0)
                if i % 1000 == 999:
                    w.end_episode()
            w.flush()
            rates.append(n / (time.perf_counter() - t0))
    q.put(rates[1:])

if __name__ == "__main__":
    import reprise as rp
    print(rp.__file__, file=sys.stderr)
    store = rp.Store({"obs": rp.Field((100,), "float32")}, capacity=1 << 18, block_steps=256)
    t = rp.Table("t", store, max_size=100_000)
    with rp.Server([t]) as s:
        q = mp.get_context("spawn").Queue()
        p = mp.get_context("spawn").Process(target=writer, args=(s.local_address, 50_000, q))
        p.start(); rates = q.get(); p.join()
    print(f"median {statistics.median(rates):,.0f} items/s  all {[round(r) for r in rates]}")
    store.close()
