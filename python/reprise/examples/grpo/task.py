"""The verifiable task: sort a short string of digits.

A prompt is ``LENGTH`` digits from ``0..DIGITS-1``; the policy writes ``LENGTH`` digits after
a separator; the reward is the fraction of positions where the answer equals the sorted
prompt (partial credit, exact checker, no model of the reward). A uniformly random policy
scores ``1 / DIGITS`` on average. A sequence (one item of the ``rollouts`` table) is the
prompt, the separator and the answer: ``SEQUENCE`` tokens, a token a step."""

from __future__ import annotations

import numpy as np

DIGITS = 6
LENGTH = 4
SEP = DIGITS                 # the separator token
VOCAB = DIGITS + 1           # the embedding's tokens; the policy writes digits only
PROMPT = LENGTH + 1          # prompt digits and the separator
SEQUENCE = PROMPT + LENGTH   # prompt, separator, answer
RANDOM_REWARD = 1.0 / DIGITS


def prompts(n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` prompts, int64 ``[n, LENGTH]``."""
    return rng.integers(0, DIGITS, (n, LENGTH))


def rewards(prompt: np.ndarray, answer: np.ndarray) -> np.ndarray:
    """float32 ``[n]``: the fraction of the answer's positions that hold the sorted prompt's digit."""
    prompt, answer = np.asarray(prompt), np.asarray(answer)
    if prompt.shape != answer.shape or prompt.ndim != 2:
        raise ValueError(f"prompts {prompt.shape} and answers {answer.shape} must both be [n, {LENGTH}]")
    return (answer == np.sort(prompt, axis=1)).mean(axis=1).astype(np.float32)


def eval_prompts(n: int = 256, seed: int = 12_345) -> np.ndarray:
    """The fixed prompts of the greedy evaluation."""
    return prompts(n, np.random.default_rng(seed))
