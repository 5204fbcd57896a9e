"""Training: the device, batches as tensors, the state normalisation from a probe draw, and
the loop (AdamW with warm-up, cross-entropy on the dataset's actions, masked past each
item's length). The same for one process and for each rank of cluster mode."""

from __future__ import annotations

import time

import numpy as np

import reprise as rp

from ..progress import ProgressLine
from .config import Config
from .model import RTG_SCALE

TRAIN_FIELDS = ("observations", "actions", "returns_to_go", "timesteps")  # what a training batch reads
PROBE = 2048  # windows drawn once for the state normalisation
LINE_EVERY_S = 10.0  # a progress line this often without a terminal


def device_of(cfg: Config, torch, index: int | None = None):
    """``--device``, else cuda when available (``cuda:index`` when given), else cpu."""
    dev = torch.device(cfg.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise rp.errors.InvalidArgument(f"--device {cfg.device}: CUDA is not available here")
    if dev.type == "cuda" and index is not None and dev.index is None:
        dev = torch.device("cuda", index % torch.cuda.device_count())
    return dev


def to_torch(sample, torch, dev):
    """``(data, lengths)``: a sample's training fields and lengths as tensors on ``dev``."""
    data = {k: (torch.from_numpy(v) if isinstance(v, np.ndarray) else v).to(dev)
            for k, v in sample.data.items() if k in TRAIN_FIELDS}
    return data, torch.from_numpy(sample.lengths).to(dev)


def valid_states(data, lengths, torch, dev):
    """``(states, top)``: the states of a batch's steps inside its items (not the
    padding) and its largest timestep."""
    valid = torch.arange(data["observations"].shape[1], device=dev)[None] < lengths[:, None]
    return data["observations"][valid].float(), int(data["timesteps"].max())


def normalisation(states, top: int, cfg: Config):
    """``(state_mean, state_std, max_timestep)`` from a probe's valid states and largest timestep."""
    return states.mean(0), states.std(0) + 1e-6, max(500, top + cfg.context)


def train(cfg: Config, model, next_batch, state_mean, state_std, torch, dev, show: bool = True,
          unit: str = "samples/s", losses: list | None = None):
    """``cfg.steps`` steps of AdamW (linear warm-up over the first 10%, gradients
    clipped to norm 1) on ``next_batch() -> (data, lengths)``, the loss masked past
    each item's length. Returns ``(losses, seconds, seconds inside next_batch)``;
    ``losses`` (if given) is filled as it goes, so a caller stopped midway has them.
    ``show``: the progress line (one rank of several shows it)."""
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=1e-4)
    warmup = max(1, cfg.steps // 10)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: min(1.0, (i + 1) / warmup))
    progress = ProgressLine("train", every=LINE_EVERY_S, enabled=show)
    losses = [] if losses is None else losses
    t0, waited = time.time(), 0.0
    try:
        for step in range(cfg.steps):
            t = time.time()
            data, lengths = next_batch()
            waited += time.time() - t
            k = data["actions"].shape[1]
            logits = model(data["returns_to_go"].float() / RTG_SCALE,
                           (data["observations"].float() - state_mean) / state_std,
                           data["actions"].long(), data["timesteps"].long())
            mask = torch.arange(k, device=dev)[None] < lengths[:, None]
            loss = torch.nn.functional.cross_entropy(logits[mask], data["actions"].long()[mask])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            losses.append(loss.item())
            elapsed = time.time() - t0
            rate = (step + 1) * cfg.batch_size / max(elapsed, 1e-9)
            progress.update((step + 1) / cfg.steps, f"step {step + 1}/{cfg.steps} loss {np.mean(losses[-20:]):.4f} "
                                                    f"{rate:,.0f} {unit} {elapsed:.0f} s")
    finally:
        progress.close()
    return losses, time.time() - t0, waited
