"""Reward model (stage: rm): a scalar head on the last token learns which of two responses is preferred.

`main(cfg, run_dir)` is the entrypoint of the `rm` stage (templates/rm_tiny.yaml; it reads the `rm:`
section, hpcrl.experiment.kinds.rm.RMConfig), on every rank, checkpointed and resumed like every stage
(hpcrl.stages.trainer_stage). The model is the critic's: the GPT trunk (from `model.hf_path`, e.g. the
SFT model, or random init) with a ScalarHead, read per position (hpcrl.train.logprobs.ScoreHead). Per step:
  1. sample `rm.pairs_per_step` preference pairs (flat or chat rows, hpcrl.data.preference; the built-in
     task's rejected responses also differ in length, so the model learns to penalise stopping early);
  2. one [2N, S] batch, rows (chosen_0, rejected_0, ...): prompt + response + <eos>, right padded;
  3. the score of a row, r(x, y), is the head's output at its last real token (its <eos>): where
     transformers' `*ForSequenceClassification` reads it, so the HF export scores exactly as trained;
  4. one update on the Bradley-Terry loss -mean log sigmoid(r_w - r_l) (hpcrl.posttrain.preference_losses).
Metrics: rm/loss, rm/accuracy (r_w > r_l), rm/margin; every `rm.eval_every` steps the same on held-out
pairs (rm/heldout_*). The run ends with `<run_dir>/hf`, a `*ForSequenceClassification` directory that
`reward.name: model` scores with (hpcrl.stages.export, hpcrl.ckpt.export).
Shape legend: B rows (2 per pair), N pairs, S tokens.
"""

from __future__ import annotations

from pathlib import Path

import torch

from hpcrl.data.cursor import DataCursor, PromptSampler
from hpcrl.data.preference import PreferencePair, load_preference_splits
from hpcrl.data.tokenizer import model_tokenizer
from hpcrl.errors import ConfigError, Problem
from hpcrl.experiment.config import ExperimentConfig
from hpcrl.lifecycle import Lifecycle
from hpcrl.posttrain.preference_losses import bradley_terry_loss
from hpcrl.posttrain.preference_setup import PairWorker, pair_batch
from hpcrl.posttrain.supervised import SupervisedDriver
from hpcrl.stages.trainer_stage import run_trainer_stage
from hpcrl.train.batch import TrainBatch
from hpcrl.train.logprobs import last_token_scores_B
from hpcrl.train.model import build_train_groups
from hpcrl.train.trainer import build_reward_trainer


def rm_loss(out, mb: TrainBatch) -> tuple[torch.Tensor, dict]:
    """This micro-batch's share of the mean Bradley-Terry loss over all pairs."""
    score_B = last_token_scores_B(out.values_BT, mb.attention_mask_BT)
    loss, stats = bradley_terry_loss(score_B[0::2], score_B[1::2])
    share = (len(mb) // 2) / (mb.num_global_seqs // 2)
    return loss * share, {"rm/accuracy": stats.reward_accuracy, "rm/margin": stats.reward_margin}


class ScoreWorker(PairWorker):
    """The reward model over DP ranks (whole pairs per rank)."""

    def scores(self, batch: TrainBatch) -> torch.Tensor:
        """r(x, y) of every row, [B] (global)."""
        return last_token_scores_B(self.forward(batch).values_BT, batch.attention_mask_BT)


def heldout_metrics(score_B: torch.Tensor) -> dict[str, float]:
    """Held-out Bradley-Terry loss, accuracy and margin of rows (chosen_0, rejected_0, ...)."""
    loss, stats = bradley_terry_loss(score_B[0::2], score_B[1::2])
    metrics = {"rm/heldout_loss": float(loss), "rm/heldout_accuracy": stats.reward_accuracy}
    return {**metrics, "rm/heldout_margin": stats.reward_margin}


def build_rm_driver(cfg: ExperimentConfig) -> SupervisedDriver:
    tokenizer = model_tokenizer(cfg.model.hf_path, cfg.model.vocab_size)
    train, heldout = load_preference_splits(cfg.data, tokenizer, lengths=True)  # see toy_pairs
    unpaired = [i for i, row in enumerate(train + heldout) if not isinstance(row, PreferencePair)]
    if unpaired:
        message = f"row {unpaired[0]} is unpaired (completion, label): the rm stage needs pairs"
        raise ConfigError(Problem(message, cfg.data.path, "stage"))
    p = cfg.parallel
    groups = build_train_groups(p.tensor, p.pipeline, p.data, timeout_s=p.timeout_s)
    model = build_reward_trainer(cfg.model, cfg.optim, groups)
    context = model.model_cfg.max_position_embeddings

    def make_batch(pairs: list[PreferencePair]) -> TrainBatch:
        return pair_batch(pairs, tokenizer, cfg.data.max_prompt_length, context)

    make_batch(train)  # fail early on any pair too long for the model
    reward_model = ScoreWorker(model, cfg.optim.micro_batch_size)
    return SupervisedDriver(
        metric_prefix="rm",
        rows_per_step=cfg.rm.pairs_per_step,
        trained=reward_model,
        loss_fn=rm_loss,
        sampler=PromptSampler(train, DataCursor(seed=cfg.data.shuffle_seed)),
        make_batch=make_batch,
        heldout=make_batch(heldout),
        heldout_metrics=lambda batch: heldout_metrics(reward_model.scores(batch)),
    )


def main(cfg: ExperimentConfig, run_dir: Path, lifecycle: Lifecycle | None = None) -> dict:
    """Train the reward model on this rank (checkpointed as "reward."; exported to `<run_dir>/hf` as a
    `*ForSequenceClassification` when the run completes)."""
    return run_trainer_stage(cfg, run_dir, lifecycle, build_rm_driver, cfg.rm.eval_every)
