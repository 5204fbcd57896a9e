"""``offline.png``: the training loss, and the evaluation beside a random policy and the dataset."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .config import ENV


def plot(path: Path, losses: list, summary: dict):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    steps = np.arange(1, len(losses) + 1)
    left.plot(steps, losses, color="tab:blue", alpha=0.3, linewidth=0.8, label="batch loss")
    w = max(1, min(50, len(losses) // 10))
    left.plot(steps[w - 1:], np.convolve(losses, np.ones(w) / w, mode="valid"), color="tab:blue",
              label=f"mean of {w}")
    left.set_xlabel("training step")
    left.set_ylabel("action cross-entropy")
    ranks = summary["config"].get("nproc", 1)
    left.set_title(f"training on [{summary['config']['batch_size']}, {summary['config']['context']}] windows"
                   + (f" on each of {ranks} ranks" if ranks > 1 else ""))
    left.legend(fontsize=8)
    bars = {"random policy": summary["random_policy"]["mean_return"],
            "dataset (mean)": summary["dataset"].get("return_mean", float("nan")),
            "Decision Transformer": summary["eval"]["mean_return"]}
    right.bar(list(bars), list(bars.values()), color=["tab:gray", "tab:green", "tab:blue"])
    right.errorbar([2], [bars["Decision Transformer"]], yerr=[summary["eval"]["std_return"]], color="black",
                   capsize=4)
    right.axhline(summary["config"]["target_return"], color="tab:red", linestyle="--", linewidth=1,
                  label=f"target return {summary['config']['target_return']:g}")
    right.set_ylabel(f"{ENV} episode return")
    right.set_title(f"evaluation over {len(summary['eval']['returns'])} episodes")
    right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
