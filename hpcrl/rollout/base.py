"""The rollout engine interface: push weights in, generate responses with their log-probs.

Shape legend: B = prompts in the call, P = prompt tokens (left padded), T = response tokens (right padded).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from hpcrl.rollout.config import RolloutConfig


@dataclass(frozen=True, kw_only=True)
class SamplingParams:
    max_new_tokens: int
    temperature: float = 1.0
    """0 = greedy; log-probs are then reported at temperature 1."""
    top_p: float = 1.0
    top_k: int = 0
    """0 disables top-k."""

    @classmethod
    def from_config(cls, cfg: RolloutConfig) -> SamplingParams:
        return cls(
            max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k
        )

    def greedy(self) -> SamplingParams:
        return SamplingParams(max_new_tokens=self.max_new_tokens, temperature=0.0)

    @property
    def logprob_temperature(self) -> float:
        return self.temperature if self.temperature > 0 else 1.0


@dataclass
class GenerationOutput:
    response_ids_BT: torch.Tensor
    """Sampled tokens, right padded with the pad id after the first EOS (EOS itself included)."""
    response_mask_BT: torch.Tensor
    """1.0 on real response tokens (up to and including EOS)."""
    logprobs_BT: torch.Tensor
    """log pi(token) of each sampled token under softmax(logits / temperature); 0 on padding."""

    @property
    def lengths_B(self) -> torch.Tensor:
        return self.response_mask_BT.sum(dim=1).long()


class RolloutEngine(Protocol):
    """What the driver needs from a generation backend."""

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Copy (hf_name, tensor) pairs into the engine's model; returns how many tensors were loaded."""
        ...

    def generate(self, prompt_ids: Sequence[Sequence[int]], sampling: SamplingParams) -> GenerationOutput:
        """One response per prompt (repeat a prompt to sample it several times)."""
        ...


def response_mask_from_eos(response_ids_BT: torch.Tensor, eos_id: int) -> torch.Tensor:
    """1.0 up to and including the first EOS of each row; rows without EOS are all real."""
    is_eos_BT = (response_ids_BT == eos_id).long()
    eos_before_BT = torch.cumsum(is_eos_BT, dim=1) - is_eos_BT
    return (eos_before_BT == 0).float()


def left_pad(prompt_ids: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids_BP, attention_mask_BP) with prompts right-aligned (left padding)."""
    width = max(len(p) for p in prompt_ids)
    ids = torch.full((len(prompt_ids), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompt_ids), width), dtype=torch.long)
    for i, p in enumerate(prompt_ids):
        if len(p):
            ids[i, width - len(p) :] = torch.tensor(list(p), dtype=torch.long)
            mask[i, width - len(p) :] = 1
    return ids, mask
