"""CartPole-v1 for N environments at once, as tensor maths on one device.

The dynamics, thresholds and rewards are gymnasium's ``CartPoleEnv`` (Euler integration,
``tau`` 0.02, a failure beyond 2.4 in ``x`` or 12 degrees in ``theta``, reward 1 for every
step, the one that fails included) with the ``TimeLimit`` of CartPole-v1: an episode is
truncated after 500 steps. The state is kept in float64, as gymnasium keeps it, so that a
step here and ``CartPoleEnv.step`` agree to the last bits (``tests/test_gpu_demo.py``
checks it); observations are float32, as gymnasium returns them.

Environments that finish are reset in place, in the same call, to a state drawn uniformly
from [-0.05, 0.05]^4 by a seeded ``torch.Generator`` on the device (a different stream of
numbers from gymnasium's numpy generator). ``step`` never reads anything back to the host:
no branch depends on a value, so on a GPU a step is a few dozen kernels queued without a
synchronisation.
"""

from __future__ import annotations

import math

GRAVITY = 9.8
MASS_CART = 1.0
MASS_POLE = 0.1
TOTAL_MASS = MASS_POLE + MASS_CART
LENGTH = 0.5                    # half the pole's length
POLE_MASS_LENGTH = MASS_POLE * LENGTH
FORCE = 10.0
TAU = 0.02                      # seconds between state updates
X_LIMIT = 2.4
THETA_LIMIT = 12 * 2 * math.pi / 360
MAX_STEPS = 500                 # CartPole-v1's TimeLimit
SOLVED_RETURN = 475.0           # CartPole-v1's reward threshold
RESET_BOUND = 0.05
OBS_DIM, NUM_ACTIONS = 4, 2


def dynamics(state, action):
    """One Euler step of gymnasium's CartPole from ``state`` ``[..., 4]`` (x, x_dot, theta,
    theta_dot) under ``action`` (0 pushes left, 1 right): the next state, in the operations
    and order of ``CartPoleEnv.step``."""
    import torch
    x, x_dot, theta, theta_dot = state.unbind(-1)
    force = torch.where(action == 1, FORCE, -FORCE).to(state.dtype)
    costheta, sintheta = torch.cos(theta), torch.sin(theta)
    temp = (force + POLE_MASS_LENGTH * torch.square(theta_dot) * sintheta) / TOTAL_MASS
    thetaacc = (GRAVITY * sintheta - costheta * temp) / (
        LENGTH * (4.0 / 3.0 - MASS_POLE * torch.square(costheta) / TOTAL_MASS))
    xacc = temp - POLE_MASS_LENGTH * thetaacc * costheta / TOTAL_MASS
    return torch.stack((x + TAU * x_dot, x_dot + TAU * xacc, theta + TAU * theta_dot, theta_dot + TAU * thetaacc), -1)


def failed(state):
    """Gymnasium's ``terminated``: the cart left [-2.4, 2.4] or the pole passed 12 degrees."""
    x, theta = state[..., 0], state[..., 2]
    return (x < -X_LIMIT) | (x > X_LIMIT) | (theta < -THETA_LIMIT) | (theta > THETA_LIMIT)


class VecCartPole:
    """``n`` CartPole-v1 environments on ``device``, stepped together.

    ``obs`` is the current observation of every environment (float32 ``[n, 4]``).
    ``step(actions)`` returns ``(next_obs, reward, terminated, truncated)``: ``next_obs`` is
    the observation the step reached, the final one for an environment whose episode just
    ended (what a transition needs), while ``obs`` already holds its reset. Finished
    episodes are counted on the device (``episodes``, ``return_sum``, ``take_returns``)."""

    def __init__(self, n: int, device, seed: int):
        import torch
        self.n, self.device = n, device
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(seed)
        self.state = self._draw_resets()
        self.steps = torch.zeros(n, dtype=torch.int64, device=device)
        self.episodes = torch.zeros((), dtype=torch.int64, device=device)
        self.return_sum = torch.zeros((), dtype=torch.float64, device=device)

    def _draw_resets(self):
        import torch
        u = torch.rand((self.n, OBS_DIM), generator=self.generator, dtype=torch.float64, device=self.device)
        return (2 * u - 1) * RESET_BOUND

    @property
    def obs(self):
        import torch
        return self.state.to(torch.float32)

    def step(self, actions):
        """Steps every environment once; resets, in place, the ones whose episode ended."""
        import torch
        nxt = dynamics(self.state, actions)
        steps = self.steps + 1
        terminated = failed(nxt)
        truncated = (steps >= MAX_STEPS) & ~terminated
        done = terminated | truncated
        next_obs = nxt.to(torch.float32)
        reward = torch.ones(self.n, dtype=torch.float32, device=self.device)
        self.episodes += done.sum()
        self.return_sum += torch.where(done, steps, 0).sum()   # reward 1 per step: return = length
        self.state = torch.where(done.unsqueeze(1), self._draw_resets(), nxt)
        self.steps = torch.where(done, 0, steps)
        return next_obs, reward, terminated, truncated

    def take_returns(self) -> tuple[int, float]:
        """``(episodes, sum of their returns)`` finished since the last call (reads the device)."""
        episodes, total = int(self.episodes), float(self.return_sum)
        self.episodes.zero_()
        self.return_sum.zero_()
        return episodes, total


def greedy_returns(q_network, n: int, device, seed: int) -> list[float]:
    """The return of the first episode of each of ``n`` fresh environments when ``q_network``
    acts greedily: ``MAX_STEPS`` steps of all of them (no early exit: no read-back until
    the end), each environment's first episode counted."""
    import torch
    env = VecCartPole(n, device, seed)
    returns = torch.zeros(n, dtype=torch.int64, device=device)
    running = torch.ones(n, dtype=torch.bool, device=device)
    with torch.no_grad():
        for _ in range(MAX_STEPS):
            actions = q_network(env.obs).argmax(dim=1)
            _, _, terminated, truncated = env.step(actions)
            returns += running.to(torch.int64)
            running &= ~(terminated | truncated)
    return [float(r) for r in returns.cpu()]


__all__ = ["MAX_STEPS", "SOLVED_RETURN", "VecCartPole", "dynamics", "failed", "greedy_returns"]
