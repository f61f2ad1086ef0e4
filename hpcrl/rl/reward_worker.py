"""The reward model as a megatron-core model role (`reward.model_backend: megatron`): a BatchScorer whose
scores come from a frozen scalar-head trainer on the learner's pools (hpcrl.rl.roles) instead of
transformers on every rank.

A row is what the HF scorer and the `rm` stage build (hpcrl.rewards.reward_model.reward_rows: BOS, prompt,
response, EOS), right padded; the score is the head's value at the row's last real token
(hpcrl.train.logprobs.last_token_scores_B), where the `rm` stage trained it and where transformers'
`*ForSequenceClassification` reads it. Every rank calls it on the same batch (the Collector runs on every
rank, hpcrl.rl.driver); the pool's ranks compute and share the result with the others.
Shape legend: B rows, S tokens.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from hpcrl.rewards.reward_model import padded_rows, reward_rows
from hpcrl.train.logprobs import last_token_scores_B
from hpcrl.train.workers import TrainerWorker


class MegatronRewardScorer:
    """(prompts, responses, answers) -> the reward model's score of each response."""

    __name__ = "model"

    def __init__(self, worker: TrainerWorker, tokenizer):
        self.worker, self.tokenizer = worker, tokenizer

    @torch.no_grad()
    def __call__(
        self, prompts: Sequence[str], responses: Sequence[str], answers: Sequence[str]
    ) -> list[float]:
        batch = padded_rows(reward_rows(self.tokenizer, prompts, responses), self.tokenizer.pad_token_id)
        values_BS = self.worker.forward(batch).values_BT
        return last_token_scores_B(values_BS, batch.attention_mask_BT).tolist()
