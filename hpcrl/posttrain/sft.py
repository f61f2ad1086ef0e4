"""Supervised fine-tuning (stage: sft): the policy learns the answers of (prompt, answer) rows.

`main(cfg, run_dir)` is the entrypoint of the `sft` stage (templates/sft_tiny.yaml; it reads the `sft:`
section, hpcrl.experiment.kinds.sft.SFTConfig); it runs on every rank after torch.distributed is initialised,
like the RL and DPO jobs, and checkpoints and resumes like them (hpcrl.stages). Per step:
  1. sample `sft.examples_per_step` rows (resumable cursor, hpcrl.data.cursor);
  2. one [B, S] batch: prompt + answer + <eos>, right padded, the loss mask over answer and <eos>
     (the model learns to stop); a chat row (`messages`) is its conversation under the chat template with
     the loss on every assistant turn only, system, user and tool turns masked (hpcrl.stages.sequences,
     hpcrl.data.chat);
  3. one update on the completion-only token-mean NLL (TRL SFTTrainer's completion_only_loss):
       L = -(1/N) sum_{b,t} m_bt log pi(x_bt | x_<bt),   N = sum_{b,t} m_bt over the global batch.
Metrics: sft/loss, sft/token_accuracy (share of answer tokens that are the model's argmax); every
`sft.eval_every` steps, on the held-out rows, sft/heldout_loss and sft/heldout_exact_match.

Exact match without generating: greedy decoding reproduces a held-out answer and then stops iff at every
answer position (and at <eos>) the target is the argmax given the correct prefix. By induction on the
position, each greedy step then sees exactly the teacher-forced prefix, and the first position where the
target is not the argmax is where greedy decoding departs. So one teacher-forced forward gives greedy
decoding's exact match (a tie counts as a hit).

Shape legend: B rows, S prompt + answer tokens (right padded).
"""

from __future__ import annotations

from pathlib import Path

import torch

from hpcrl.data.cursor import DataCursor, PromptSampler
from hpcrl.data.sources import has_target, load_splits
from hpcrl.data.tasks import Example
from hpcrl.data.tokenizer import model_tokenizer
from hpcrl.errors import ConfigError, Problem
from hpcrl.experiment.config import ExperimentConfig
from hpcrl.lifecycle import Lifecycle
from hpcrl.posttrain.supervised import SupervisedDriver
from hpcrl.stages.sequences import example_batch
from hpcrl.stages.trainer_stage import run_trainer_stage
from hpcrl.train.batch import TrainBatch
from hpcrl.train.logprobs import HeadOutputs
from hpcrl.train.model import build_train_groups
from hpcrl.train.trainer import build_policy_trainer
from hpcrl.train.workers import TrainerWorker


def sft_loss(out: HeadOutputs, mb: TrainBatch) -> tuple[torch.Tensor, dict]:
    """This micro-batch's share of the global token-mean NLL over answer tokens, and its token accuracy."""
    mask_BS = mb.response_mask_BT
    accuracy = (out.greedy_BT * mask_BS).sum() / mask_BS.sum().clamp(min=1)
    return mb.token_mean(-out.logprobs_BT), {"sft/token_accuracy": accuracy}


def exact_match_B(greedy_BS: torch.Tensor, response_BS: torch.Tensor) -> torch.Tensor:
    """Whether greedy decoding reproduces each row's answer and stops: every answer token and <eos> is
    the argmax given the correct prefix (see the module docstring), [B] bool."""
    return ((greedy_BS > 0) | ~response_BS.bool()).all(dim=1)


def heldout_metrics(out: HeadOutputs, batch: TrainBatch) -> dict[str, float]:
    """Held-out token-mean NLL and greedy exact match."""
    mask_BS = batch.response_mask_BT.bool()
    loss = -(out.logprobs_BT * mask_BS).sum() / mask_BS.sum()
    exact = exact_match_B(out.greedy_BT, mask_BS).float().mean()
    return {"sft/heldout_loss": float(loss), "sft/heldout_exact_match": float(exact)}


def build_sft_driver(cfg: ExperimentConfig) -> SupervisedDriver:
    tokenizer = model_tokenizer(cfg.model.hf_path, cfg.model.vocab_size)
    train, heldout = load_splits(cfg.data, tokenizer)
    if not train or not heldout or not all(map(has_target, train + heldout)):
        message = (
            "SFT needs an answer (or an assistant turn) on every row, and training and held-out rows "
            "(data.heldout_size)"
        )
        raise ConfigError(Problem(message, cfg.data.path, "data.answer_key"))
    p = cfg.parallel
    groups = build_train_groups(p.tensor, p.pipeline, p.data, timeout_s=p.timeout_s)
    policy = build_policy_trainer(cfg.model, cfg.optim, groups, greedy=True)
    context = policy.model_cfg.max_position_embeddings

    def make_batch(rows: list[Example]) -> TrainBatch:
        return example_batch(rows, tokenizer, cfg.data.max_prompt_length, context)

    make_batch(train)  # fail early on any row too long for the model
    worker = TrainerWorker(policy, cfg.optim.micro_batch_size, balance_tokens=cfg.optim.balance_dp_tokens)
    return SupervisedDriver(
        metric_prefix="sft",
        rows_per_step=cfg.sft.examples_per_step,
        trained=worker,
        loss_fn=sft_loss,
        sampler=PromptSampler(train, DataCursor(seed=cfg.data.shuffle_seed)),
        make_batch=make_batch,
        heldout=make_batch(heldout),
        heldout_metrics=lambda batch: heldout_metrics(worker.forward(batch), batch),
    )


def main(cfg: ExperimentConfig, run_dir: Path, lifecycle: Lifecycle | None = None) -> dict:
    """Run SFT on this rank (hpcrl.stages.trainer_stage: checkpoints the policy as "actor." with its
    AdamW state, the row cursor and RNG states; resume=auto continues from `latest`)."""
    return run_trainer_stage(cfg, run_dir, lifecycle, build_sft_driver, cfg.sft.eval_every)
