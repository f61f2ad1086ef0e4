"""Reward-model worker: an HF sequence-classification model scores prompt + response text.

The model directory holds config.json, weights and its tokenizer (a `*ForSequenceClassification` with
one label); the score is its logit for the last real token. Runs in eval mode under no_grad.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


class RewardModelScorer:
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
        texts = [p + r for p, r in zip(prompts, responses, strict=True)]
        scores: list[float] = []
        for start in range(0, len(texts), self.batch_size):
            enc = self.tokenizer(texts[start : start + self.batch_size], return_tensors="pt", padding=True)
            logits = self.model(**enc.to(self.device)).logits
            scores.extend(logits[:, 0].float().cpu().tolist())
        return scores
