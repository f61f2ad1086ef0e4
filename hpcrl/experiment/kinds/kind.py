"""What a stage kind declares (each kind's module in hpcrl.experiment.kinds holds one `KIND`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from hpcrl.errors import Problem
from hpcrl.metrics.headline import Headline

if TYPE_CHECKING:
    from hpcrl.experiment.config import ExperimentConfig

StageRules = Callable[["ExperimentConfig"], list[Problem]]
"""A stage's own rules: those of the sections only its stage reads (hpcrl.experiment.rules.check_rules
runs them after the shared ones)."""


@dataclass(frozen=True)
class OfflineShape:
    """What an offline stage holds and trains on, for its memory plan (hpcrl.plan.offline)."""

    role: str
    """The trained model's name in the plan."""
    examples_per_step: Callable[[ExperimentConfig], int]
    """Examples (rows, or pairs) of one step's batch."""
    rows_per_example: int = 1
    """Token rows of an example: a preference pair is two."""
    scalar_head: bool = False
    """A scalar head on the trunk (the reward model): no output layer, no logits buffer."""
    reference: bool = False
    """A frozen copy of the initial model beside it (DPO, IPO, KTO)."""


@dataclass(frozen=True)
class StageKind:
    """One kind of stage."""

    name: str
    """The value of the config's `stage` that selects it."""
    entrypoint: str
    """`module:function` every rank runs when the config's `entrypoint` is null."""
    sections: tuple[str, ...]
    """The config sections only this kind reads (fields of hpcrl.experiment.config.ExperimentConfig)."""
    rules: StageRules
    """Its sections' rules, run at expand/submit/resume with the shared ones."""
    steps_key: str
    """The dotted key of its step count (run identity leaves it free: a resume may extend a run)."""
    headline: Headline
    """What its progress bar and plot show."""
    model_prefix: str = "actor."
    """The checkpoint prefix of the model the stage trains: what its HF export (`<run_dir>/hf`) and
    `hpcrl ckpt export` read by default."""
    offline: OfflineShape | None = None
    """An offline stage's memory shape (one trained model, no rollout: hpcrl.plan.offline); None for the
    RL stage, whose pools, rollout engine and reshard hpcrl.plan.memory plans."""
    rehearsed: bool = False
    """`hpcrl rehearse` rehearses it (it shrinks an RL recipe's pools, rollout and reshard; another stage
    gets a clear refusal, not a rehearsal of what it does not run). `hpcrl plan` plans every stage
    (hpcrl.plan.stages)."""


def accuracy_headline(
    title: str, train: str, heldout: str, label: str, heldout_label: str = Headline.heldout_label
) -> Headline:
    """An offline stage's headline: an accuracy of the trained model (metric keys `train`, `heldout`),
    one per step (no spread over a group), plotted to accuracy.png."""
    return Headline(
        title=title,
        train=train,
        heldout=heldout,
        label=label,
        heldout_label=heldout_label,
        heldout_also=(),
        spread=None,
        plot_file="accuracy.png",
    )
