"""The sft stage: supervised fine-tuning on (prompt, answer) rows (trainer: hpcrl.posttrain.sft)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from hpcrl.config.ranges import Count, EveryNSteps, Steps
from hpcrl.errors import Problem
from hpcrl.experiment.kinds.kind import OfflineShape, StageKind, accuracy_headline
from hpcrl.experiment.rules import data_rules, token_budget_rules

if TYPE_CHECKING:
    from hpcrl.experiment.config import ExperimentConfig


@dataclass(kw_only=True)
class SFTConfig:
    """Supervised fine-tuning (stage: sft): the policy learns the answers of (prompt, answer) rows."""

    steps: Steps = 100
    """Training steps (one update on `examples_per_step` rows each)."""
    examples_per_step: Count = 32
    """(prompt, answer) rows per step; the loss counts answer tokens (and the closing <eos>) only."""
    eval_every: EveryNSteps = 10
    """Evaluate held-out loss and greedy exact match every this many steps (0: never)."""


def sft_rules(cfg: ExperimentConfig) -> list[Problem]:
    """The SFT stage's data file's rows, a token budget that holds a row with the longest prompt, and one
    row per DP rank at least (its numbers' ranges are its fields')."""
    longest = cfg.data.max_prompt_length + 2  # the prompt, one answer token and <eos>
    out = data_rules(cfg, preference=None, needs_answers=True) + token_budget_rules(
        cfg, longest, "data.max_prompt_length + one answer token + <eos>"
    )
    if cfg.data.heldout_size < 1:
        message = "SFT evaluates on held-out rows: must be >= 1 (exact match and loss on unseen rows)"
        out.append(Problem(message, key="data.heldout_size"))
    rows, ranks = cfg.sft.examples_per_step, cfg.parallel.data
    if 1 <= rows < ranks:
        message = f"{rows} rows per step leave some of the {ranks} DP ranks empty"
        out.append(Problem(message, key="sft.examples_per_step"))
    return out


KIND = StageKind(
    name="sft",
    entrypoint="hpcrl.posttrain.sft:main",
    sections=("sft",),
    rules=sft_rules,
    steps_key="sft.steps",
    headline=accuracy_headline(
        "SFT", "sft/token_accuracy", "sft/heldout_exact_match", "token accuracy", "held-out exact match"
    ),
    offline=OfflineShape("policy", lambda cfg: cfg.sft.examples_per_step),
)
