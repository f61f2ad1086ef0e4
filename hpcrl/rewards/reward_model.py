"""Reward-model worker: an HF sequence-classification model scores prompt + response text.

The model directory holds config.json, weights and its tokenizer (a `*ForSequenceClassification` with
one label, e.g. the `hf` export of an hpcrl `rm` stage); the score is its logit for the last real token.
A row is tokenised as hpcrl's offline stages build theirs (hpcrl.stages.sequences): BOS (when the
tokenizer has one and the prompt's template did not write it), the prompt, the response, then EOS (the
rollout's decoded responses stop before it) - so an hpcrl reward model scores exactly the rows it was
trained on. Right padded; runs in eval mode under no_grad.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from hpcrl.train.batch import TrainBatch


def reward_rows(tokenizer, prompts: Sequence[str], responses: Sequence[str]) -> list[list[int]]:
    """Token ids of each (prompt, response) as a reward model scores it: BOS (unless the prompt's
    template wrote it), the prompt, the response, EOS - the rows hpcrl's `rm` stage trained on. One
    function for the HF scorer here and the megatron one (hpcrl.rl.reward_worker)."""
    bos = tokenizer.bos_token_id
    prompt_ids = tokenizer(list(prompts), add_special_tokens=False)["input_ids"]
    response_ids = tokenizer(list(responses), add_special_tokens=False)["input_ids"]
    rows = []
    for p, r in zip(prompt_ids, response_ids, strict=True):
        head = [] if bos is None or p[:1] == [bos] else [bos]
        rows.append([*head, *p, *r, tokenizer.eos_token_id])
    return rows


class RewardModelScorer:
    """The HF reward model (`reward.model_backend: hf`): transformers' `*ForSequenceClassification` on
    every rank, scoring decoded text."""

    __name__ = "model"

    def __init__(self, model_path: str, batch_size: int = 32, device: str | None = None):
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.model = AutoModelForSequenceClassification.from_pretrained(model_path).to(self.device).eval()
        if self.model.config.num_labels != 1:
            raise ValueError(
                f"{model_path}: reward model needs num_labels=1, has {self.model.config.num_labels}"
            )
        if self.model.config.pad_token_id is None:
            self.model.config.pad_token_id = self.tokenizer.pad_token_id
        self.batch_size = batch_size

    @torch.no_grad()
    def __call__(
        self, prompts: Sequence[str], responses: Sequence[str], answers: Sequence[str]
    ) -> list[float]:
        rows = self.rows(prompts, responses)
        scores: list[float] = []
        for start in range(0, len(rows), self.batch_size):
            batch = padded_rows(rows[start : start + self.batch_size], self.tokenizer.pad_token_id)
            logits = self.model(
                input_ids=batch.input_ids_BT.to(self.device),
                attention_mask=batch.attention_mask_BT.long().to(self.device),
            ).logits
            scores.extend(logits[:, 0].float().cpu().tolist())
        return scores

    def rows(self, prompts: Sequence[str], responses: Sequence[str]) -> list[list[int]]:
        return reward_rows(self.tokenizer, prompts, responses)


def padded_rows(rows: list[list[int]], pad_id: int) -> TrainBatch:
    """The right-padded [B, S] batch of token rows (nothing trained: an all-False response mask)."""
    width = max(len(row) for row in rows)
    ids_BS = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attention_BS = torch.zeros((len(rows), width), dtype=torch.bool)
    for b, row in enumerate(rows):
        ids_BS[b, : len(row)], attention_BS[b, : len(row)] = torch.tensor(row), True
    return TrainBatch(
        input_ids_BT=ids_BS, attention_mask_BT=attention_BS, response_mask_BT=torch.zeros_like(attention_BS)
    )
