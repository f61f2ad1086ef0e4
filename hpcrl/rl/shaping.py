"""Reward shaping and batch filtering from DAPO (Yu et al. 2025, "DAPO: An Open-Source LLM
Reinforcement Learning System at Scale"): small pure functions over one step's scores.

Shape legend: B = sequences (prompts x samples).
"""

from __future__ import annotations

import torch


def overlong_penalty(
    lengths_B: torch.Tensor, max_new_tokens: int, buffer_len: int, factor: float
) -> torch.Tensor:
    """DAPO's soft overlong punishment (§3.4, eq. 13), added to the score: with L_max the generation
    budget and L_cache the buffer,
      R_length(y) = 0                                  if |y| <= L_max - L_cache
                  = ((L_max - L_cache) - |y|) / L_cache  if L_max - L_cache < |y| <= L_max
    times `factor` (verl's overlong_penalty_factor). Responses never exceed L_max here (the engines stop
    there), so the paper's third case (-1 beyond L_max) is the second one's end point."""
    if buffer_len <= 0:
        return torch.zeros_like(lengths_B, dtype=torch.float32)
    exceed_B = lengths_B.float() - (max_new_tokens - buffer_len)
    return -factor * torch.clamp(exceed_B, min=0) / buffer_len


def informative_groups(scores_B: torch.Tensor, group_ids_B: torch.Tensor) -> torch.Tensor:
    """DAPO's dynamic sampling filter (§3.2, eq. 11's constraint 0 < |{correct}| < G): keep the rows of
    groups whose scores are not all equal. A group whose samples all score the same has zero
    group-relative advantage and adds nothing but noise (through the KL and entropy terms) and a smaller
    effective batch. Returns a bool mask over rows."""
    _, inverse_B = torch.unique(group_ids_B, return_inverse=True)
    num_groups = int(inverse_B.max()) + 1 if len(inverse_B) else 0
    high_G = torch.full((num_groups,), -torch.inf).scatter_reduce(0, inverse_B, scores_B.float(), "amax")
    low_G = torch.full((num_groups,), torch.inf).scatter_reduce(0, inverse_B, scores_B.float(), "amin")
    return (high_G > low_G)[inverse_B]


def first_groups(group_ids_B: torch.Tensor, count: int) -> torch.Tensor:
    """Bool mask of the rows of the first `count` groups in order of appearance (dynamic sampling trims
    the kept groups to the batch size, as verl's DAPO recipe)."""
    seen: dict[int, int] = {}
    for g in group_ids_B.tolist():
        seen.setdefault(g, len(seen))
    return torch.tensor([seen[g] < count for g in group_ids_B.tolist()], dtype=torch.bool)
