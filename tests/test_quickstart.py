"""examples/quickstart.py, run as a user runs it (``python examples/quickstart.py``), must
keep working and keep printing what the README shows: a table of 50 episodes x 18 items
plus 256 bulk-inserted ones, a prioritized sample of 8 three-step items with importance
weights normalised to a maximum of 1, and 8 priorities updated."""

from __future__ import annotations

import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_quickstart() -> str:
    r = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "quickstart.py")],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    return r.stdout


def numbers(line: str) -> list[float]:
    return [float(x) for x in re.findall(r"-?\d+(?:\.\d+)?(?:e-?\d+)?", line.split("[", 1)[1])]


def test_quickstart_runs_and_prints_its_results():
    out = run_quickstart()
    lines = {line.split()[0]: line for line in out.splitlines() if line.strip()}
    # 50 episodes of 20 steps, an item per step from the third on (18 each), + 256 bulk.
    assert "table size 1156 (max 5000), 256 bulk-inserted" in out, out
    assert "sampled 8 items: data['obs'] float32[8, 3, 4], lengths [3, 3, 3, 3, 3, 3, 3, 3]" in out
    keys = numbers(lines["keys"])
    assert len(keys) == 8 and all(k > 0 for k in keys), lines["keys"]
    probabilities = numbers(lines["probabilities"])
    assert len(probabilities) == 8 and all(0 < p < 1 for p in probabilities), lines["probabilities"]
    weights = numbers(lines["weights"])
    assert len(weights) == 8 and max(weights) == 1.0 and min(weights) > 0, lines["weights"]
    # The rarest item gets the largest weight.
    assert weights.index(1.0) == probabilities.index(min(probabilities))
    assert "updated 8 priorities; info: num_inserts=1156, num_samples=8" in out, out
