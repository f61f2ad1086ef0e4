"""One step's experience: prompts, sampled responses, rewards, and the trainer-side batch built from them.

Shape legend: B = sequences (prompts x samples), P = prompt width (left padded), T = response width
(right padded), S = P + T. RL math works on response-space tensors [B, T]; the trainer works on the
full sequence [B, S] with the alignment of hpcrl.train.logprobs (index s = token s). `to_full` and
`to_response` convert between them: response token t sits at sequence index P + t for every row.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from hpcrl.data.tasks import Example
from hpcrl.rollout.base import GenerationOutput, left_pad
from hpcrl.rows import concat_rows, select_rows
from hpcrl.train.batch import TrainBatch


@dataclass
class Experience:
    examples: list[Example]
    """The prompt row of each sequence (a prompt appears once per sample)."""
    group_ids_B: torch.Tensor
    """Index of the prompt in this step's prompt batch (GRPO/RLOO groups)."""
    prompt_ids_BP: torch.Tensor
    prompt_mask_BP: torch.Tensor
    gen: GenerationOutput
    responses: list[str] = field(default_factory=list)
    scores_B: torch.Tensor | None = None
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    """Response-space [B, T] (or [B]) tensors filled by the dataflow: old_logprobs_BT, values_BT, ...;
    episodes' context_mask_BT, env_rewards_BT and turns_BT (hpcrl.rl.episodes)."""
    episodes: dict[str, list] = field(default_factory=dict)
    """Episodes' errors and infos (env_errors, env_info) between generation and scoring (never saved)."""

    @classmethod
    def from_generation(
        cls,
        examples: list[Example],
        group_ids_B: torch.Tensor,
        prompt_ids: list[list[int]],
        gen: GenerationOutput,
        pad_id: int,
    ) -> Experience:
        ids_BP, mask_BP = left_pad(prompt_ids, pad_id)
        return cls(examples, group_ids_B, prompt_ids_BP=ids_BP, prompt_mask_BP=mask_BP, gen=gen)

    def __len__(self) -> int:
        return len(self.examples)

    @property
    def prompt_width(self) -> int:
        return self.prompt_ids_BP.shape[1]

    @property
    def response_mask_BT(self) -> torch.Tensor:
        return self.gen.response_mask_BT

    def to_full(self, x_BT: torch.Tensor) -> torch.Tensor:
        return F.pad(x_BT, (self.prompt_width, 0))

    def to_response(self, x_BS: torch.Tensor) -> torch.Tensor:
        return x_BS[:, self.prompt_width :]

    def select(self, keep_B: torch.Tensor) -> Experience:
        """Only the rows where keep_B is True (skipped rewards are dropped before any update)."""
        return select_rows(self, keep_B.nonzero().squeeze(1))

    @classmethod
    def concat(cls, parts: list[Experience], pad_id: int) -> Experience:
        """One experience from several rollout batches (dynamic sampling): prompts are left padded again
        to the widest part; responses already share the generation width (the rollout worker pads)."""
        if len(parts) == 1:
            return parts[0]
        width = max(p.prompt_width for p in parts)
        return concat_rows(
            [
                dataclasses.replace(
                    p,
                    prompt_ids_BP=F.pad(p.prompt_ids_BP, (width - p.prompt_width, 0), value=pad_id),
                    prompt_mask_BP=F.pad(p.prompt_mask_BP, (width - p.prompt_width, 0)),
                )
                for p in parts
            ]
        )

    @property
    def context_mask_BT(self) -> torch.Tensor:
        """1.0 on every response-space token the model reads: its own, and an episode's observations."""
        return self.tensors.get("context_mask_BT", self.gen.response_mask_BT)

    def train_batch(self, extras: dict[str, torch.Tensor] | None = None) -> TrainBatch:
        """The [B, S] batch for the trainer; response-space extras are moved to sequence space. The
        trainer attends to the context (observations included); its losses read the response mask."""
        mask_BT = self.gen.response_mask_BT
        return TrainBatch(
            input_ids_BT=torch.cat([self.prompt_ids_BP, self.gen.response_ids_BT], dim=1),
            attention_mask_BT=torch.cat([self.prompt_mask_BP.bool(), self.context_mask_BT.bool()], dim=1),
            response_mask_BT=self.to_full(mask_BT).bool(),
            extras={k: self.to_full(v) if v.dim() == 2 else v for k, v in (extras or {}).items()},
        )
