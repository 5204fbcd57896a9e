"""The GPU packed gather of a token-budget draw (issue 34's GPU goal): ``sample(tokens=B,
device="cuda")`` against a pinned host-to-device memcpy of the same bytes, on one GPU.

    python -m benchmarks.async_rl.gpu_packed                  # on a CUDA machine, ~20 s
    python -m benchmarks.async_rl.gpu_packed --emulate --quick   # CPU smoke test ("cuda" mapped to the CPU)

A host store of token sequences (int32 token, float32 logprob, bool mask: 9 bytes a step;
``--row-bytes`` adds a float32 field to reach wider steps), 256-16,384 tokens each
(log-uniform, seed 0), one table; then ``sample(tokens=65_536, device="cuda")`` repeated,
each call synchronised, and ``torch.cuda.synchronize`` around a pinned ``copy_`` of a
buffer as large as the draw's bytes. Reports GB/s of each, the ratio (goal >= 0.8) and the
draw's own numbers (items, tokens per call). Every draw is checked: packed, no padding,
``cu_seqlens`` consistent, first and last token of every item where they belong.
Writes ``benchmarks/out/gpu_packed-<date>.json`` (``--out`` elsewhere).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

import numpy as np


def sequences(n: int, rng) -> np.ndarray:
    return np.exp(rng.uniform(np.log(256), np.log(16_384), n)).astype(np.int64)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=65_536, help="token budget per draw")
    ap.add_argument("--sequences", type=int, default=400, help="sequences in the table")
    ap.add_argument("--extra-floats", type=int, default=0, help="float32 values added to each step")
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--quick", action="store_true", help="few sequences and repeats (a smoke test)")
    ap.add_argument("--emulate", action="store_true", help="map 'cuda' to the CPU (no GPU needed; numbers are noise)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if args.quick:
        args.sequences, args.repeats, args.tokens = 40, 5, min(args.tokens, 16_384)
    import torch

    import reprise as rp
    import reprise.torch as rt
    from reprise.torch.collect import wait_released
    if args.emulate:
        rt.emulate_cuda(True)
    elif not torch.cuda.is_available():
        raise SystemExit("no CUDA device: run with --emulate for a smoke test")
    dev = torch.device("cpu") if args.emulate else torch.device("cuda")

    sig = {"token": rp.Field((), "int32"), "logprob": rp.Field((), "float32"), "mask": rp.Field((), "bool")}
    if args.extra_floats:
        sig["hidden"] = rp.Field((args.extra_floats,), "float32")
    step_bytes = sum(int(np.prod(f.shape, dtype=np.int64)) * np.dtype(f.dtype).itemsize for f in sig.values())
    lengths = sequences(args.sequences, np.random.default_rng(0))
    store = rp.Store(sig, capacity=int(lengths.sum()) + 1024 * 64, block_steps=1024)
    table = rp.Table("rollouts", store, max_size=args.sequences, seed=0, extensions=[])
    with store.writer() as w:
        for i, n in enumerate(lengths):
            toks = (i * 100_000 + np.arange(n) % 100_000).astype(np.int32)
            step = {"token": toks, "logprob": -toks.astype(np.float32), "mask": toks % 2 == 0}
            if args.extra_floats:
                step["hidden"] = np.zeros((n, args.extra_floats), np.float32)
            w.extend(step)
            w.create_item(table, num_steps=int(n), priority=1.0)
            w.end_episode()

    def check(s) -> None:
        p = s.packed()
        cu = p.cu_seqlens.cpu().numpy() if torch.is_tensor(p.cu_seqlens) else p.cu_seqlens
        tok = p.data["token"].cpu().numpy()
        assert tok.shape == (s.num_steps,) and cu[-1] == s.num_steps <= args.tokens
        for i in range(len(s)):
            first, last = int(tok[cu[i]]), int(tok[cu[i + 1] - 1])
            assert first % 100_000 == 0 and last // 100_000 == first // 100_000

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize()

    for _ in range(3):
        check(table.sample(tokens=args.tokens, device="cuda"))
    times, steps, items = [], [], []
    for _ in range(args.repeats):
        sync()
        t0 = time.perf_counter()
        s = table.sample(tokens=args.tokens, device="cuda")
        sync()
        times.append(time.perf_counter() - t0)
        steps.append(s.num_steps)
        items.append(len(s))
        check(s)
    wait_released(10)
    nbytes = int(statistics.median(steps)) * step_bytes
    src = torch.empty(nbytes, dtype=torch.uint8, pin_memory=dev.type == "cuda")
    dst = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    copies = []
    for i in range(args.repeats + 3):
        sync()
        t0 = time.perf_counter()
        dst.copy_(src, non_blocking=True)
        sync()
        if i >= 3:
            copies.append(time.perf_counter() - t0)
    gather_gbps = statistics.median(s * step_bytes / t / 1e9 for s, t in zip(steps, times))
    memcpy_gbps = nbytes / statistics.median(copies) / 1e9
    report = {
        "config": {**vars(args), "step_bytes": step_bytes, "fields": list(sig)},
        "machine": {"platform": platform.platform(), "gpu": torch.cuda.get_device_name() if dev.type == "cuda" else None,
                    "torch": torch.__version__},
        "packed_gather": {"gbps": gather_gbps, "seconds_median": statistics.median(times),
                          "tokens_per_call_median": statistics.median(steps),
                          "items_per_call_median": statistics.median(items)},
        "pinned_memcpy": {"gbps": memcpy_gbps, "bytes": nbytes},
        "ratio": gather_gbps / memcpy_gbps,
        "goal": ">= 0.8 of pinned memcpy (issue 34)",
        "emulated": args.emulate,
    }
    print(f"packed gather {gather_gbps:.2f} GB/s ({statistics.median(steps):.0f} tokens, "
          f"{statistics.median(items):.0f} items a draw), pinned memcpy {memcpy_gbps:.2f} GB/s: "
          f"ratio {report['ratio']:.2f} (goal >= 0.8){'  [emulated: noise]' if args.emulate else ''}")
    out = args.out or os.path.join("benchmarks", "out", time.strftime("gpu_packed-%Y%m%d-%H%M%S.json"))
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    with open(out, "w") as f:
        json.dump(report, f, indent=1)
    store.close()
    return report


if __name__ == "__main__":
    main()
