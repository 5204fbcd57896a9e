"""The policy: a small causal transformer over the task's tokens, written in plain PyTorch,
with sampling (token by token, returning each sampled token's log-probability), greedy
decoding, the log-probabilities of given sequences (the trainer's forward pass) and its
parameters as one flat float32 vector (how the ``params`` table carries them)."""

from __future__ import annotations

import numpy as np

from .task import LENGTH, PROMPT, SEP, SEQUENCE, VOCAB, DIGITS


def make_policy(width: int = 64, layers: int = 2, heads: int = 4):
    import torch

    class Policy(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.tok = torch.nn.Embedding(VOCAB, width)
            self.pos = torch.nn.Embedding(SEQUENCE, width)
            layer = torch.nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.0, batch_first=True,
                                                     norm_first=True)
            self.body = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
            self.head = torch.nn.Linear(width, DIGITS)
            self.register_buffer("causal", torch.triu(torch.full((SEQUENCE, SEQUENCE), float("-inf")), 1),
                                 persistent=False)

        def forward(self, x):
            """Logits over the digits for the token after each position of ``x`` ``[n, t]``."""
            t = x.shape[1]
            h = self.tok(x) + self.pos(torch.arange(t, device=x.device))
            return self.head(self.body(h, mask=self.causal[:t, :t], is_causal=True))

    return Policy()


def generate(policy, prompt, greedy: bool = False, generator=None):
    """``(sequences int64 [n, SEQUENCE], logprobs float32 [n, LENGTH])``: the prompts, the
    separator and ``LENGTH`` answer digits, sampled (or greedy) from ``policy``, with each
    answer digit's log-probability under it."""
    import torch
    prompt = torch.as_tensor(prompt, dtype=torch.int64)
    x = torch.cat([prompt, torch.full((len(prompt), 1), SEP, dtype=torch.int64)], dim=1)
    return extend(policy, x, LENGTH, greedy, generator)


def extend(policy, x, steps: int, greedy: bool = False, generator=None):
    """``x`` (int64 ``[n, t]``, prompts with the separator and any answer digits so far)
    with ``steps`` more digits sampled (or greedy) from ``policy``, and their
    log-probabilities ``[n, steps]``."""
    import torch
    x = torch.as_tensor(x, dtype=torch.int64)
    logps = []
    with torch.no_grad():
        for _ in range(steps):
            logp = torch.log_softmax(policy(x)[:, -1], dim=-1)
            a = logp.argmax(-1) if greedy else torch.multinomial(logp.exp(), 1, generator=generator)[:, 0]
            logps.append(logp.gather(1, a[:, None])[:, 0])
            x = torch.cat([x, a[:, None]], dim=1)
    return x, (torch.stack(logps, dim=1) if logps else torch.zeros((len(x), 0)))


def answer_logprobs(policy, sequences):
    """float32 ``[n, LENGTH]``: the log-probability ``policy`` gives each answer digit of
    ``sequences`` ``[n, SEQUENCE]`` (with gradients)."""
    import torch
    logits = policy(sequences[:, :-1])[:, PROMPT - 1:]
    return torch.log_softmax(logits, dim=-1).gather(2, sequences[:, PROMPT:, None])[..., 0]


def flat_parameters(policy) -> np.ndarray:
    import torch
    with torch.no_grad():
        return torch.cat([p.detach().reshape(-1).cpu() for p in policy.parameters()]).numpy().astype(np.float32)


def load_flat_parameters(policy, flat) -> None:
    import torch
    flat = torch.as_tensor(np.asarray(flat), dtype=torch.float32)
    total = sum(p.numel() for p in policy.parameters())
    if flat.numel() != total:
        raise ValueError(f"{flat.numel()} parameters given, the policy has {total}")
    at = 0
    with torch.no_grad():
        for p in policy.parameters():
            n = p.numel()
            p.copy_(flat[at:at + n].view_as(p))
            at += n


def num_parameters(width: int, layers: int) -> int:
    return sum(p.numel() for p in make_policy(width, layers).parameters())
