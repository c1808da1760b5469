"""Randomness of the sampler: per-step seeds and exponential noise.

Sampling is an exponential race: token = argmax(probs / E) with E ~ Exp(1)
drawn independently per vocabulary entry, which picks token i with probability
probs[i] (the Gumbel-max trick in another form) and needs no host sync.
E is drawn as -log(U), U ~ Uniform[0, 1): three times cheaper than torch's
exponential_ on CPU, and never 0 (U < 1), so probs / E is never 0 / 0.

Invariant: a seeded row's noise depends only on (seed, number of tokens it has
generated so far). Its generator is re-seeded from those two numbers every
step, so batch composition, row order, preemption and recompute never change
the token it draws.
"""

from __future__ import annotations

import torch
from torch import Tensor

_MASK_64 = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    """A bijective 64-bit mixer: nearby inputs give unrelated outputs."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK_64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK_64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK_64
    return x ^ (x >> 31)


def derive_step_seed(seed: int, num_output_tokens: int) -> int:
    """The generator seed of a seeded request at one step; fits torch's 63 bits."""
    return _splitmix64(_splitmix64(seed & _MASK_64) ^ num_output_tokens) >> 1


def exponential_noise(
    probs: Tensor,  # [B, V]
    step_seeds: list[int | None],
    is_greedy: list[bool],
    shared: torch.Generator,
    per_row: torch.Generator,
) -> Tensor:
    """[B, V] Exp(1) noise for every sampling row; greedy rows hold anything."""
    uniform = torch.empty_like(probs)  # [B, V]
    if any(s is None and not g for s, g in zip(step_seeds, is_greedy, strict=True)):
        # One draw over the whole batch is cheaper than gathering the unseeded rows;
        # the shared stream is not reproducible anyway.
        uniform.uniform_(generator=shared)
    for i, seed in enumerate(step_seeds):
        if seed is None or is_greedy[i]:
            continue
        per_row.manual_seed(seed)
        # In place on the contiguous [V] row: the same values as a fresh tensor
        # (tests check it), without an allocation and a copy per row.
        uniform[i].uniform_(generator=per_row)
    return uniform.log_().neg_()  # [B, V]
