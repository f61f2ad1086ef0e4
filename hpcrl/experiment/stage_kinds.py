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

Each kind's module (hpcrl.experiment.kinds) declares its `KIND`: its entrypoint (what the element runner
calls unless `entrypoint` names another), its rules, the key counting its steps, its headline metric, the
checkpoint prefix of the model it trains and, offline, its memory shape; hpcrl.experiment.config
registers it (STAGE_KINDS). This module answers questions about a config's stage.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable
from typing import Any

from hpcrl.errors import ConfigError, Problem
from hpcrl.experiment.config import STAGE_KINDS, ExperimentConfig
from hpcrl.experiment.kinds.kind import StageKind
from hpcrl.experiment.rules import check_rules

SHARED_SECTIONS = ("model", "parallel", "optim", "data", "checkpoint", "logging", "cluster")
"""The sections every stage reads (besides the top-level keys: name, seed, run_root, stage, entrypoint)."""

STAGE_SECTIONS = frozenset(section for kind in STAGE_KINDS.values() for section in kind.sections)
"""The sections some stage owns (and another does not read)."""


def stage_of(cfg: ExperimentConfig) -> StageKind:
    return STAGE_KINDS[cfg.stage]


def entrypoint_of(cfg: ExperimentConfig) -> str:
    """What every rank of the element calls: the config's own entrypoint, else its stage's."""
    return cfg.entrypoint or stage_of(cfg).entrypoint


def config_rules(cfg: ExperimentConfig) -> list[Problem]:
    """Every cross-field rule of one resolved config: the shared ones, its stage's and the final export's."""
    return check_rules(cfg, stage_of(cfg).rules) + export_problems(cfg)


def export_problems(cfg: ExperimentConfig) -> list[Problem]:
    """`checkpoint.export_hf` writes the model of the final step's checkpoint (hpcrl.stages.export): with
    `save_on_exit: false` that checkpoint exists only when `every_steps` divides the step count, so a
    config that would end without it is refused rather than finishing without its export."""
    ckpt = cfg.checkpoint
    steps_key = stage_of(cfg).steps_key
    steps = operator.attrgetter(steps_key)(cfg)
    if not ckpt.export_hf or ckpt.save_on_exit or (ckpt.every_steps and steps % ckpt.every_steps == 0):
        return []
    message = (
        f"false leaves the final step {steps} ({steps_key}) unsaved (checkpoint.every_steps "
        f"{ckpt.every_steps} does not divide it), and the HF export (checkpoint.export_hf) is written from "
        "it: set save_on_exit true, or export_hf false"
    )
    return [Problem(message, key="checkpoint.save_on_exit")]


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
