"""One step's experience: prompts, sampled responses, rewards, and the trainer-side batch built from them.

Shape legend: B = sequences (prompts x samples), P = prompt width (left padded), T = response width
(right padded), S = P + T. RL math works on response-space tensors [B, T]; the trainer works on the
full sequence [B, S] with the alignment of hpcrl.train.logprobs (index s = token s). `to_full` and
`to_response` convert between them: response token t sits at sequence index P + t for every row.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from hpcrl.data.tasks import Example
from hpcrl.rollout.base import GenerationOutput, left_pad
from hpcrl.train.batch import TrainBatch

_GEN_FIELDS = ("response_ids_BT", "response_mask_BT", "logprobs_BT")


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
    """Response-space [B, T] (or [B]) tensors filled by the dataflow: old_logprobs_BT, values_BT, ..."""

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
        return cls(examples, group_ids_B, ids_BP, mask_BP, gen)

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
        idx = keep_B.nonzero().squeeze(1)
        gen = GenerationOutput(
            self.gen.response_ids_BT[idx], self.gen.response_mask_BT[idx], self.gen.logprobs_BT[idx]
        )
        return Experience(
            [self.examples[i] for i in idx.tolist()],
            self.group_ids_B[idx],
            self.prompt_ids_BP[idx],
            self.prompt_mask_BP[idx],
            gen,
            [self.responses[i] for i in idx.tolist()] if self.responses else [],
            None if self.scores_B is None else self.scores_B[idx],
            {k: v[idx] for k, v in self.tensors.items()},
        )

    @classmethod
    def concat(cls, parts: list[Experience], pad_id: int) -> Experience:
        """One experience from several rollout batches (dynamic sampling): prompts are left padded again
        to the widest part; responses already share the generation width (the rollout worker pads)."""
        if len(parts) == 1:
            return parts[0]
        width = max(p.prompt_width for p in parts)
        ids_BP = torch.cat([F.pad(p.prompt_ids_BP, (width - p.prompt_width, 0), value=pad_id) for p in parts])
        mask_BP = torch.cat([F.pad(p.prompt_mask_BP, (width - p.prompt_width, 0)) for p in parts])
        gens = [p.gen for p in parts]
        gen = GenerationOutput(*(torch.cat([getattr(g, f) for g in gens]) for f in _GEN_FIELDS))
        return cls(
            [e for p in parts for e in p.examples],
            torch.cat([p.group_ids_B for p in parts]),
            ids_BP,
            mask_BP,
            gen,
            [r for p in parts for r in p.responses],
            None if parts[0].scores_B is None else torch.cat([p.scores_B for p in parts]),
            {k: torch.cat([p.tensors[k] for p in parts]) for k in parts[0].tensors},
        )

    def train_batch(self, extras: dict[str, torch.Tensor] | None = None) -> TrainBatch:
        """The [B, S] batch for the trainer; response-space extras are moved to sequence space."""
        mask_BT = self.gen.response_mask_BT
        return TrainBatch(
            input_ids_BT=torch.cat([self.prompt_ids_BP, self.gen.response_ids_BT], dim=1),
            attention_mask_BT=torch.cat([self.prompt_mask_BP.bool(), mask_BT.bool()], dim=1),
            response_mask_BT=self.to_full(mask_BT).bool(),
            extras={k: self.to_full(v) if v.dim() == 2 else v for k, v in (extras or {}).items()},
        )
