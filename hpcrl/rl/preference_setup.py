"""What the preference drivers (DPO / IPO in hpcrl.rl.dpo, KTO in hpcrl.rl.kto) share: the data, the
policy and its frozen reference, the (prompt, response) batch, and a worker that sums response log-probs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from hpcrl.data.preference import PreferenceRow, load_preference_splits, unpair
from hpcrl.data.tokenizer import model_tokenizer
from hpcrl.experiment.config import ExperimentConfig
from hpcrl.rl.workers import TrainerWorker
from hpcrl.stages.sequences import response_batch
from hpcrl.train.batch import TrainBatch
from hpcrl.train.model import build_train_groups
from hpcrl.train.trainer import build_policy_trainer


class RowWorker(TrainerWorker):
    """A trainer over DP ranks that also gives each row's summed response log-probs."""

    def sequence_logprobs(self, batch: TrainBatch) -> torch.Tensor:
        """Summed log-probs of each row's response tokens, [B] (global)."""
        out = self.forward(batch)
        return (out.logprobs_BT * batch.response_mask_BT).sum(dim=1)


@dataclass
class PreferenceSetup:
    """What every preference driver builds first: the data, the policy and the frozen reference, and the
    batch of (prompt, response) rows."""

    train: list[PreferenceRow]
    heldout: list[PreferenceRow]
    policy: object
    reference: object
    rows: Callable[[list[str], list[str]], TrainBatch]
    """(prompts, responses) -> the [B, S] batch (hpcrl.stages.sequences.response_batch)."""


def preference_setup(cfg: ExperimentConfig) -> PreferenceSetup:
    tokenizer = model_tokenizer(cfg.model.hf_path, cfg.model.vocab_size)
    train, heldout = load_preference_splits(cfg.data, tokenizer)
    p = cfg.parallel
    groups = build_train_groups(p.tensor, p.pipeline, p.data, timeout_s=p.timeout_s)
    policy = build_policy_trainer(cfg.model, cfg.optim, groups)
    reference = build_policy_trainer(cfg.model, None, groups)  # same init (or HF weights), frozen
    context = policy.model_cfg.max_position_embeddings

    def rows(prompts: list[str], responses: list[str]) -> TrainBatch:
        return response_batch(prompts, responses, tokenizer, cfg.data.max_prompt_length, context)

    everything = unpair(train + heldout)
    rows([r.prompt for r in everything], [r.completion for r in everything])  # fail early: too long a row
    return PreferenceSetup(train, heldout, policy, reference, rows)
