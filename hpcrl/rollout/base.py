"""The rollout engine interface: push weights in, generate responses with their log-probs.

Shape legend: B = prompts in the call, P = prompt tokens (left padded), T = response tokens (right padded).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from hpcrl.rollout.config import RolloutConfig


@dataclass(frozen=True, kw_only=True)
class SamplingParams:
    """How one generate call samples; the defaults are RolloutConfig's (the settings' one home)."""

    max_new_tokens: int
    """Response tokens at most."""
    temperature: float = RolloutConfig.temperature
    """0 = greedy; log-probs are then reported at temperature 1."""
    top_p: float = RolloutConfig.top_p
    """Nucleus sampling mass; 1 disables top-p."""
    top_k: int = RolloutConfig.top_k
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
    extras: dict[str, Any] = field(default_factory=dict)
    """Row-wise additions of multi-turn episodes (hpcrl.rl.episodes): `context_mask_BT` (1 on every token
    the model reads after the prompt: its own turns and the observations between them, where
    response_mask_BT is 1 on its own only), `env_rewards_BT`, `turns_BT`, `env_errors`, `env_info`."""

    @property
    def lengths_B(self) -> torch.Tensor:
        return self.response_mask_BT.sum(dim=1).long()


class RolloutEngine(Protocol):
    """What the driver and the weight hand-off need from a generation backend; every engine has every
    method (one that has nothing to do makes it a no-op), so no caller asks which engine it holds. The
    kinds' own facts (what each can run, how it is built) are hpcrl.rollout.engine_rule.ENGINES."""

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Copy (name, tensor) pairs into the engine's model; returns how many tensors were loaded."""
        ...

    def sleep(self) -> None:
        """Free what the engine holds between generation and training (vLLM: `LLM.sleep` on CUDA)."""
        ...

    def wake_up(self) -> None:
        """Take back what `sleep` freed, before the next weight load and generation."""
        ...

    def generate(
        self,
        prompt_ids: Sequence[Sequence[int]],
        sampling: SamplingParams,
        seeds: Sequence[int] | None = None,
    ) -> GenerationOutput:
        """One response per prompt (repeat a prompt to sample it several times). `seeds`: one per prompt
        (`row_seeds`); an engine that honours them samples each row from its own seed, so the samples do
        not depend on how prompts are split over generation replicas. Engines that draw from the process
        RNG instead (HF `generate`) say so."""
        ...


def row_seeds(seed: int, start: int, count: int) -> list[int]:
    """Seeds of global rows [start, start + count) of one generate call seeded `seed` (any Python int:
    taken mod 2^64)."""
    rows = torch.arange(start, start + count, dtype=torch.long)
    key = torch.full_like(rows, _signed(seed & _MASK64))
    return counter_hash(torch.stack([key, rows], dim=-1))[:, -1].tolist()


_MASK64 = (1 << 64) - 1


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


_SPLITMIX = tuple(_signed(c) for c in (0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB))


def _shift_right(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 (torch's >> is arithmetic)."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def _splitmix64(x: torch.Tensor) -> torch.Tensor:
    """SplitMix64 finaliser (Steele, Lea, Flood 2014) on int64 tensors; int64 products wrap mod 2^64."""
    golden, m1, m2 = _SPLITMIX
    z = x + golden
    z = (z ^ _shift_right(z, 30)) * m1
    z = (z ^ _shift_right(z, 27)) * m2
    return z ^ _shift_right(z, 31)


def counter_hash(keys: torch.Tensor) -> torch.Tensor:
    """Hash int64 keys [..., K] to int64 [..., K] by chaining SplitMix64 along the last dim, so that
    out[..., -1] depends on every key (a counter-based RNG: the same keys give the same bits on any
    device, any batch split)."""
    keys = keys.long()
    out = torch.empty_like(keys)
    state = torch.zeros_like(keys[..., 0])
    for k in range(keys.shape[-1]):
        state = _splitmix64(state ^ keys[..., k])
        out[..., k] = state
    return out


def gumbel_noise(seeds_B: torch.Tensor, position: int | torch.Tensor, vocab: int) -> torch.Tensor:
    """Gumbel(0, 1) noise [B, V], a function of (row seed, token position, vocab id) only; `position` is
    one for every row or a [B] tensor, one per row (rows at different positions: continuous batching).

    argmax(logits/temperature + noise) samples softmax(logits/temperature) (the Gumbel-max trick,
    Gumbel 1954; Maddison et al. 2014 §2), so every replica split of a batch samples the same tokens.
    """
    B = seeds_B.shape[0]
    ids_BV = torch.arange(vocab, device=seeds_B.device).expand(B, vocab)
    if isinstance(position, torch.Tensor):
        positions_BV = position.to(ids_BV)[:, None].expand(B, vocab)
    else:
        positions_BV = torch.full_like(ids_BV, position)
    keys = torch.stack([seeds_B[:, None].expand(B, vocab), positions_BV, ids_BV], -1)
    bits = _shift_right(counter_hash(keys)[..., -1], 11)  # 53 random bits
    uniform = (bits.double() + 0.5) * 2.0**-53  # in (0, 1)
    return -torch.log(-torch.log(uniform))


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
