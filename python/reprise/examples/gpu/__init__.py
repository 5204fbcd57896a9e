"""GPU-born data on Reprise: vectorised CartPole on the device, a device store, a learner
sampling on the device.

    reprise demo gpu                       # 60 s; CUDA when available, else emulated on the CPU
    reprise demo gpu --smoke               # about 15 s (CI)
    reprise demo gpu --envs 16384 --prioritized
    python -m reprise.examples.gpu --help

Environments that run on the GPU (Isaac Gym, Brax, or a few lines of tensor maths) produce
their data where the learner trains; the replay should keep it there. This demo:

- steps ``--envs`` CartPole-v1 environments at once as tensor maths on the device
  (``cartpole``: gymnasium's dynamics, thresholds and rewards, step for step);
- an **actor thread** acts epsilon-greedily with a copy of the learner's network (Ape-X's
  per-environment epsilons) and writes each step of all N environments with one
  ``writer.extend`` into a **device store** (``rp.Store(..., device="cuda")``) and N one-step
  items with one ``writer.create_items`` (``replay``): the host sees row numbers and
  priorities, never step data;
- the **learner** (the main thread) draws ``table.sample(B, device=...)``, gathered on the
  device, and takes a double-DQN step (``dqn``); with ``--prioritized`` it updates the items'
  priorities with |TD error|. A ``SampleToInsertRatio`` limiter keeps the replay ratio;
- every ``--eval-every`` seconds it prints env steps/s, samples/s (items drawn per second),
  the training episodes' mean return and a greedy evaluation, and at the end writes
  ``summary.json`` into a new ``./reprise-runs/gpu-<time>-<pid>`` (or ``--out``).

Without a GPU the same program runs on the CPU with Reprise's GPU path emulated
(``reprise.torch.emulate_cuda``): the store is still a device store and every sample takes
the device path, at CPU speed and with smaller defaults (``config.CPU_DEFAULTS``).

Modules, each using only those before it: ``cartpole``, ``config``, ``dqn``, ``replay``,
``run`` (the loop, evaluations, the summary; ``run`` and ``main``).
"""

from .cartpole import VecCartPole
from .config import Config, parse_args
from .run import main, run

__all__ = ["Config", "VecCartPole", "main", "parse_args", "run"]
