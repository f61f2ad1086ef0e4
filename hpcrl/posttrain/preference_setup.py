"""What the stages that learn from preferences share: for the preference drivers (DPO / IPO in
hpcrl.posttrain.dpo, KTO in hpcrl.posttrain.kto) the data, the policy and its frozen reference, and a
worker that sums response log-probs; for them and the reward model (hpcrl.posttrain.rm) the batch of
preference pairs and a worker that keeps each pair on one data-parallel rank."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from hpcrl.data.preference import PreferencePair, PreferenceRow, load_preference_splits, unpair
from hpcrl.data.tokenizer import model_tokenizer
from hpcrl.experiment.config import ExperimentConfig
from hpcrl.stages.sequences import response_batch
from hpcrl.train.batch import TrainBatch
from hpcrl.train.model import build_train_groups
from hpcrl.train.trainer import build_policy_trainer
from hpcrl.train.workers import TrainerWorker


class RowWorker(TrainerWorker):
    """A trainer over DP ranks that also gives each row's summed response log-probs."""

    def sequence_logprobs(self, batch: TrainBatch) -> torch.Tensor:
        """Summed log-probs of each row's response tokens, [B] (global)."""
        out = self.forward(batch)
        return (out.logprobs_BT * batch.response_mask_BT).sum(dim=1)


def pair_batch(pairs: list[PreferencePair], tokenizer, max_prompt_length: int, context: int) -> TrainBatch:
    """The [2N, S] batch of `pairs` (chosen then rejected per pair), right padded; a pair longer than the
    model's context is a ConfigError naming it (hpcrl.stages.sequences.response_batch)."""
    prompts = [p.prompt for p in pairs for _ in range(2)]
    responses = [r for p in pairs for r in (p.chosen, p.rejected)]
    return response_batch(prompts, responses, tokenizer, max_prompt_length, context)


class PairWorker(RowWorker):
    """A trainer over DP ranks that dispatches whole pairs: rows 2i and 2i+1 stay on one rank."""

    def _local(self, batch: TrainBatch, parts: list[list[int]] | None) -> TrainBatch:
        """Pairs, contiguously (the preference stage refuses token balancing at expand: `parts` is None)."""
        start, stop = self.shards.bounds(len(batch) // 2)
        return batch.slice(2 * start, 2 * stop)


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
    # same init (or HF weights), frozen; it runs the policy's batches as the policy does
    reference = build_policy_trainer(cfg.model, None, groups, pack_sequences=cfg.optim.pack_sequences)
    context = policy.model_cfg.max_position_embeddings

    def rows(prompts: list[str], responses: list[str]) -> TrainBatch:
        return response_batch(prompts, responses, tokenizer, cfg.data.max_prompt_length, context)

    everything = unpair(train + heldout)
    rows([r.prompt for r in everything], [r.completion for r in everything])  # fail early: too long a row
    return PreferenceSetup(train, heldout, policy, reference, rows)
