"""Ragged RL batches for the micro-batching tests (token budget, packing)."""

from __future__ import annotations

import torch

from hpcrl.train.batch import TrainBatch


def ragged_batch(
    vocab: int, prompts: list[int], responses: list[int], *, width: int, seed: int
) -> TrainBatch:
    """Rows of `width` columns: prompt b left padded to max(prompts) columns, its response right after,
    right padded; the extras a PPO/GRPO loss and a critic loss read, random on the response."""
    gen = torch.Generator().manual_seed(seed)
    B, start = len(prompts), max(prompts)
    ids = torch.randint(0, vocab, (B, width), generator=gen)
    attention = torch.zeros(B, width, dtype=torch.bool)
    response = torch.zeros(B, width, dtype=torch.bool)
    for b, (p, r) in enumerate(zip(prompts, responses, strict=True)):
        attention[b, start - p : start + r] = True
        response[b, start : start + r] = True
    extras = {
        "old_logprobs": -torch.rand(B, width, generator=gen) * response,
        "advantages": torch.randn(B, width, generator=gen) * response,
        "old_values": torch.randn(B, width, generator=gen) * response,
        "returns": torch.randn(B, width, generator=gen) * response,
    }
    return TrainBatch(ids, attention, response, extras=extras)
