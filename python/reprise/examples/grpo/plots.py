"""``grpo.png``: greedy and sampled reward against time and trainer step, the staleness of
what the trainer drew, and tokens per second generated and trained."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def plot(path: Path, evals: list[dict], metrics: list[dict], history: list[dict], staleness: list[int],
         solve: float, untrained: float | None, title: str):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ((a, b), (c, d)) = plt.subplots(2, 2, figsize=(11, 7))
    for ax, key, label in ((a, "time", "seconds"), (b, "step", "trainer step")):
        if evals:
            ax.plot([e[key] for e in evals], [e["greedy_reward"] for e in evals], "o-", markersize=3,
                    color="tab:orange", label="greedy, evaluation prompts")
        if metrics:
            ax.plot([m[key] for m in metrics], [m["reward"] for m in metrics], color="tab:blue", alpha=0.5,
                    linewidth=0.8, label="sampled, trained batches")
        ax.axhline(solve, color="gray", linestyle="--", linewidth=1, label=f"solved ({solve:g})")
        if untrained is not None:
            ax.axhline(untrained, color="tab:red", linestyle=":", linewidth=1, label=f"untrained ({untrained:.2f})")
        ax.set_xlabel(label)
        ax.set_ylabel("reward")
        ax.set_ylim(0, 1.02)
    a.legend(loc="lower right", fontsize=8)
    a.set_title(title, fontsize=10)
    if staleness:
        c.bar(range(len(staleness)), staleness, color="tab:green")
        c.set_xticks(range(len(staleness)))
    c.set_xlabel("versions behind the trainer when drawn")
    c.set_ylabel("items trained on")
    if len(history) > 1:
        t = np.array([h["time"] for h in history])
        lag = min(6, len(t) - 1)
        for key, label in (("generated", "tokens generated/s"), ("trained", "tokens trained/s")):
            v = np.array([h[key] for h in history], dtype=float)
            d.plot(t[lag:], (v[lag:] - v[:-lag]) / np.maximum(t[lag:] - t[:-lag], 1e-9), label=label)
        d.legend(loc="upper left", fontsize=8)
    d.set_xlabel("seconds")
    d.set_ylabel("tokens per second")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
