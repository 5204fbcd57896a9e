"""``apex.png``: episode returns over time and replay throughput."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def plot(path: Path, history: list[dict], episodes: list[tuple], evals: list[dict], threshold, title: str):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 7), sharex=True)
    if episodes:
        t = np.array([e[0] for e in episodes])
        r = np.array([e[1] for e in episodes])
        top.scatter(t, r, s=3, alpha=0.25, color="tab:blue", label="actor episodes (epsilon-greedy)")
        window = min(100, len(r))
        rolling = np.convolve(r, np.ones(window) / window, mode="valid")
        top.plot(t[window - 1:], rolling, color="tab:blue", label=f"actors, mean of last {window}")
    if evals:
        top.plot([e["time"] for e in evals], [e["mean_return"] for e in evals], "o-", color="tab:orange",
                 markersize=3, label="learner, greedy evaluation")
    if threshold is not None:
        top.axhline(threshold, color="gray", linestyle="--", linewidth=1, label=f"solved ({threshold:g})")
    top.set_ylabel("episode return")
    if top.get_legend_handles_labels()[0]:
        top.legend(loc="upper left", fontsize=8)
    top.set_title(title)
    if len(history) > 1:
        t = np.array([h["time"] for h in history])
        for key, label in (("inserts", "inserts/s"), ("samples", "samples/s"), ("env_steps", "env steps/s")):
            v = np.array([h[key] for h in history], dtype=float)
            lag = min(10, len(t) - 1)   # rates over about 5 s: episodes report their steps when they end
            rate = (v[lag:] - v[:-lag]) / np.maximum(t[lag:] - t[:-lag], 1e-9)
            bottom.plot(t[lag:], rate, label=label)
        bottom.set_yscale("symlog")
    bottom.set_xlabel("seconds")
    bottom.set_ylabel("replay throughput")
    if bottom.get_legend_handles_labels()[0]:
        bottom.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
