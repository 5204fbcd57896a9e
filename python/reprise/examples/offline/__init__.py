"""Offline RL on Reprise: a Decision Transformer trained on windows of an imported dataset.

    reprise demo offline                   # CartPole-v1, a few minutes on a CPU; close to 500
    reprise demo offline --smoke           # well under a minute; shows learning
    reprise demo offline --dataset D       # an existing dataset file or checkpoint instead
    reprise demo offline --nproc 2         # cluster mode: 2 ranks, a sharded table, DDP
    torchrun --nproc-per-node 2 -m reprise.examples.offline   # the same under torchrun
    python -m reprise.examples.offline --help

What it does:

1. **Dataset.** Unless ``--dataset`` is given, it plays CartPole-v1 with a scripted
   controller (push the cart toward the pole's lean, from angle and angular velocity)
   that takes a random action with a per-episode probability drawn from [0, 1], so
   returns span ~10 to 500. Each step gets its ``returns_to_go`` (the rewards from
   that step to the episode's end) and ``timesteps`` (its index in the episode), and
   the episodes are written as an HDF5 file in the D4RL layout in the run directory.
2. **Import.** ``rp.datasets.load(file, window=K)``: one store holding every step, a
   ``windows`` table with one item per K-step window inside an episode.
3. **Training.** A Decision Transformer (Chen et al., 2021): a causal transformer over
   (return-to-go, state, action) tokens with timestep embeddings, predicting each action
   from the tokens up to its state, cross-entropy on the dataset's actions. Batches are
   ``windows.sample(B, device=dev)``: ``[B, K]`` windows gathered on the GPU when there is
   one; items of episodes shorter than K are zero-padded past ``lengths`` and masked out
   of the loss.
4. **Evaluation.** Online in CartPole-v1, conditioned on ``--target-return`` (500): the
   mean return over ``--eval-episodes``, beside a uniformly random policy (~22) and the
   dataset's mean return. ``summary.json`` and ``offline.png`` go into ``--out``.

With ``--nproc N`` (or under ``torchrun``) the same model trains on N ranks with
DistributedDataParallel, its windows drawn from an ``rp.distributed.ShardedTable``
with one shard per rank: ``cluster``. Everything else is shared.

Modules, each using only those before it: ``config`` (``Config``, the smoke preset, the
command line), ``dataset`` (generation, import, the signature check), ``model`` (the
Decision Transformer), ``training`` (the device, batches, normalisation, the loop),
``evaluation``, ``plots``, ``summary`` (how a run ends, completed or stopped),
``cluster`` (``--nproc N`` and torchrun), ``run`` (``run`` and ``main``).
"""

from .config import Config, make_parser, parse_args
from .dataset import generate
from .model import make_model
from .run import main, run

__all__ = ["Config", "generate", "main", "make_model", "make_parser", "parse_args", "run"]
