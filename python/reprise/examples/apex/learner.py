"""The learner process: dueling double DQN on prioritized n-step samples, publishing its
parameters to ``params`` and its quick evaluations to ``evals``."""

from __future__ import annotations

import time

import numpy as np

import reprise as rp

from ..stopping import child_setup
from .config import Config, solve_threshold
from .envs import env_spec, evaluate
from .model import flat_parameters, load_flat_parameters, make_network
from .nstep import n_step_targets


def learner_main(cfg: Config, address: str, seed: int, started: float, parent: int) -> None:
    """The learner process: dueling double DQN on prioritized n-step samples. The
    supervisor (``parent``) stops it with SIGTERM; it ignores the terminal's SIGINT."""
    child_setup(parent)
    import torch
    import torch.nn.functional as F
    torch.manual_seed(seed)
    device = torch.device(cfg.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cpu":
        torch.set_num_threads(1)
    spec = env_spec(cfg.env)
    net = make_network(spec, cfg.hidden).to(device)
    client = rp.Client(address)
    # A restarted learner continues from the newest published parameters.
    step = 0
    try:
        s = client.sample("params", 1, timeout=0)
        load_flat_parameters(net, s.data["weights"][0, 0])
        step = int(s.data["learner_step"][0, 0])
    except rp.errors.Timeout:
        pass
    target = make_network(spec, cfg.hidden).to(device)
    target.load_state_dict(net.state_dict())
    try:
        optimizer = torch.optim.Adam(net.parameters(), lr=cfg.lr, fused=True)
    except (RuntimeError, TypeError):  # a torch without fused Adam for this device
        optimizer = torch.optim.Adam(net.parameters(), lr=cfg.lr)
    # max_sequence_length=1: each item is one step, older steps' blocks go back at once.
    params = client.writer("params", max_sequence_length=1)
    evals = client.writer("evals", max_sequence_length=1)
    best_params = client.writer("best", max_sequence_length=1)

    def publish():
        params.append({"weights": flat_parameters(net), "learner_step": step})
        params.create_item("params", 1, 1.0)
        params.flush()

    def report(mean_return, episodes, loss):
        evals.append({"learner_step": step, "mean_return": mean_return, "episodes": episodes, "loss": loss})
        evals.create_item("evals", 1, 1.0)
        evals.flush()

    def keep(mean_return):
        """Offers the parameters just evaluated to ``best``. Priorities are >= 0 and returns are
        not (Pong's go down to -21): r + sqrt(r^2 + 1) maps every return to a positive number
        in the same order."""
        best_params.append({"weights": flat_parameters(net), "learner_step": step})
        best_params.create_item("best", 1, float(mean_return + np.hypot(mean_return, 1.0)))
        best_params.flush()

    publish()
    sample_device = "cuda" if device.type == "cuda" else None
    threshold = solve_threshold(cfg, spec)
    next_eval = time.monotonic() + cfg.eval_every
    losses = []
    while True:
        try:
            s = client.sample("replay", cfg.batch_size, timeout=1.0, device=sample_device)
        except rp.errors.Timeout:
            continue
        d = {k: torch.as_tensor(v, device=device) for k, v in s.data.items()}
        B = len(s)
        lengths = torch.as_tensor(s.lengths.astype(np.int64), device=device)
        rows = torch.arange(B, device=device)
        boot_obs = d["obs"][rows, lengths - 1]
        q_all = net(torch.cat([d["obs"][:, 0], boot_obs]))
        q_taken = q_all[:B].gather(1, d["action"][:, 0:1]).squeeze(1)
        with torch.no_grad():
            best = q_all[B:].argmax(dim=1, keepdim=True)                     # double DQN: online picks,
            q_next = target(boot_obs).gather(1, best).squeeze(1)            # target evaluates
            y = n_step_targets(d["reward"], d["terminal"], lengths, cfg.gamma, q_next)
        td = y - q_taken
        progress = min(1.0, (time.time() - started) / cfg.time_limit)
        weights = torch.as_tensor(s.importance_weights(cfg.beta + (1.0 - cfg.beta) * progress),
                                  dtype=torch.float32, device=device)
        loss = (weights * F.smooth_l1_loss(q_taken, y, reduction="none")).mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 10.0)
        optimizer.step()
        client.update_priorities("replay", s.keys, td.detach().abs().cpu().numpy().astype(np.float64) + 1e-3)
        losses.append(loss.item())
        step += 1
        if step % cfg.target_update == 0:
            target.load_state_dict(net.state_dict())
        if step % cfg.publish_every == 0:
            publish()
        if time.monotonic() >= next_eval:
            net.eval()
            quick = evaluate(net, cfg, cfg.quick_eval_episodes, seed=10_000 + step, device=device)
            mean_loss = float(np.mean(losses)) if losses else float("nan")
            report(float(np.mean(quick)), len(quick), mean_loss)
            keep(float(np.mean(quick)))
            if threshold is not None and np.mean(quick) >= threshold:
                full = evaluate(net, cfg, cfg.eval_episodes, seed=20_000 + step, device=device)
                if np.mean(full) >= threshold:
                    # Solved: publish exactly these parameters (the final evaluation's) and stop
                    # learning; the supervisor ends the run.
                    publish()
                    report(float(np.mean(full)), len(full), mean_loss)
                    while True:
                        time.sleep(1.0)
                report(float(np.mean(full)), len(full), mean_loss)
            net.train()
            losses.clear()
            next_eval = time.monotonic() + cfg.eval_every
