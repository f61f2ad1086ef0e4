"""The stage kinds: what each kind of training stage reads, runs, checks and is watched by.

`ExperimentConfig.stage` is the tag of a tagged union over the config's sections: every stage reads the
SHARED sections, and each kind owns its own (rl: placement, rollout, algorithm, reward; dpo: dpo; sft:
sft; rm: rm). The union is kept where it shows:
- a template, override or sweep that sets a section its stage does not read is refused at `expand`,
  naming the file and key (a DPO template with `algorithm.clip_ratio` would otherwise run, silently
  ignoring it);
- a resolved element's data (config.yaml, the config id) holds only its stage's sections, so an
  element's id does not move when another stage's defaults do;
- `hpcrl --help-config STAGE` lists only what that stage reads (hpcrl.experiment.reference).

One entry per kind holds its entrypoint (what the element runner calls unless `entrypoint` names
another), its rules (hpcrl.experiment.rules), the key counting its steps, its headline metric and the
checkpoint prefix of the model it trains. A new stage is one more entry, one more section, one more
name in hpcrl.experiment.config.StageName (and, for `hpcrl plan`, a shape in hpcrl.plan.offline).
"""

from __future__ import annotations

import typing
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from hpcrl.errors import ConfigError, Problem
from hpcrl.experiment.config import ExperimentConfig, StageName
from hpcrl.experiment.rules import StageRules, check_rules, dpo_rules, rl_rules, rm_rules, sft_rules
from hpcrl.metrics.headline import Headline

SHARED_SECTIONS = ("model", "parallel", "optim", "data", "checkpoint", "logging", "cluster")
"""The sections every stage reads (besides the top-level keys: name, seed, run_root, stage, entrypoint)."""


@dataclass(frozen=True)
class StageKind:
    """One kind of stage."""

    name: str
    entrypoint: str
    """`module:function` every rank runs when the config's `entrypoint` is null."""
    sections: tuple[str, ...]
    """The config sections only this kind reads."""
    rules: StageRules
    """Its sections' rules, run at expand/submit/resume with the shared ones."""
    steps_key: str
    """The dotted key of its step count (run identity leaves it free: a resume may extend a run)."""
    headline: Headline
    """What its progress bar and plot show."""
    model_prefix: str = "actor."
    """The checkpoint prefix of the model the stage trains: what its HF export (`<run_dir>/hf`) and
    `hpcrl ckpt export` read by default."""
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
        spread=None,
        plot_file="accuracy.png",
    )


STAGE_KINDS: dict[str, StageKind] = {
    kind.name: kind
    for kind in (
        StageKind(
            name="rl",
            entrypoint="hpcrl.rl.job:main",
            sections=("placement", "rollout", "algorithm", "reward"),
            rules=rl_rules,
            steps_key="algorithm.steps",
            headline=Headline(),
            rehearsed=True,
        ),
        StageKind(
            name="dpo",
            entrypoint="hpcrl.posttrain.dpo:main",
            sections=("dpo",),
            rules=dpo_rules,
            steps_key="dpo.steps",
            headline=accuracy_headline("DPO", "dpo/accuracy", "dpo/heldout_accuracy", "preference accuracy"),
        ),
        StageKind(
            name="sft",
            entrypoint="hpcrl.posttrain.sft:main",
            sections=("sft",),
            rules=sft_rules,
            steps_key="sft.steps",
            headline=accuracy_headline(
                "SFT",
                "sft/token_accuracy",
                "sft/heldout_exact_match",
                "token accuracy",
                "held-out exact match",
            ),
        ),
        StageKind(
            name="rm",
            entrypoint="hpcrl.posttrain.rm:main",
            sections=("rm",),
            rules=rm_rules,
            steps_key="rm.steps",
            model_prefix="reward.",
            headline=accuracy_headline("RM", "rm/accuracy", "rm/heldout_accuracy", "pairwise accuracy"),
        ),
    )
}
"""Every stage kind by name; the names are exactly hpcrl.experiment.config.StageName's."""

STAGE_SECTIONS = frozenset(section for kind in STAGE_KINDS.values() for section in kind.sections)
"""The sections some stage owns (and another does not read)."""

assert set(STAGE_KINDS) == set(typing.get_args(StageName)), "StageName and STAGE_KINDS disagree"


def stage_of(cfg: ExperimentConfig) -> StageKind:
    return STAGE_KINDS[cfg.stage]


def entrypoint_of(cfg: ExperimentConfig) -> str:
    """What every rank of the element calls: the config's own entrypoint, else its stage's."""
    return cfg.entrypoint or stage_of(cfg).entrypoint


def config_rules(cfg: ExperimentConfig) -> list[Problem]:
    """Every cross-field rule of one resolved config: the shared ones and its stage's."""
    return check_rules(cfg, stage_of(cfg).rules)


def require_rehearsed(cfg: ExperimentConfig, template: str) -> None:
    """ConfigError (exit 2) naming the template's `stage` when `hpcrl rehearse` cannot rehearse it."""
    kind = stage_of(cfg)
    if not kind.rehearsed:
        rehearsed = [k.name for k in STAGE_KINDS.values() if k.rehearsed]
        message = (
            f"hpcrl rehearse models the {', '.join(rehearsed)} stage; this template's stage is {kind.name}"
        )
        raise ConfigError(Problem(message, template, "stage"))


def unread_sections(stage: str) -> frozenset[str]:
    """The sections of other stages (empty for an unknown stage: the schema reports the name)."""
    kind = STAGE_KINDS.get(stage)
    return frozenset() if kind is None else STAGE_SECTIONS - set(kind.sections)


def stage_data(data: dict[str, Any]) -> dict[str, Any]:
    """A resolved config's plain data with only its stage's sections (config.yaml, the config id)."""
    unread = unread_sections(str(data.get("stage")))
    return {key: value for key, value in data.items() if key not in unread}


def section_problems(
    stage: Any, keys: Iterable[str], origin_of: Callable[[str], str | None]
) -> list[Problem]:
    """A Problem for each dotted key (set by a template, the command line or a sweep) under a section
    that `stage` does not read, naming where it was set."""
    if not isinstance(stage, str):
        return []  # not a stage name: the schema reports it
    unread = unread_sections(stage)
    problems = []
    for key in keys:
        section = key.partition(".")[0]
        if section in unread:
            owner = next(k.name for k in STAGE_KINDS.values() if section in k.sections)
            reads = ", ".join((*SHARED_SECTIONS, *STAGE_KINDS[stage].sections))
            message = (
                f"the {stage} stage does not read {section} (the {owner} stage's section); it reads: {reads}"
            )
            problems.append(Problem(message, origin_of(key), key))
    return problems
