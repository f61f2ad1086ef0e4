"""Template + command-line overrides + cluster profile + sweep -> N checked ExperimentConfigs.

Precedence, lowest first: dataclass defaults < cluster profile (for `cluster:`) < template chain <
command-line overrides < the element's sweep values. Overriding a swept key on the command line is an
error (the sweep would collapse into copies). Everything is checked before anything is returned, and
ALL problems are raised together as one ConfigError (exit 2). Where profiles may come from and what
only they may set: hpcrl.launcher.profiles. Every string of every element: hpcrl.config.text_rules.

Config id: the first 10 hex digits of sha256 over the canonical JSON of the resolved config, so the
same experiment always gets the same id (and run directory), whatever template produced it.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpcrl.config.experiment import ExperimentConfig
from hpcrl.config.rules import check_rules
from hpcrl.config.schema import build, check_tree, deep_merge, flatten, leaf_types, to_dict
from hpcrl.config.sweep import SweepPlan, check_sweep
from hpcrl.config.template import Template, load_template
from hpcrl.config.text_rules import string_problems
from hpcrl.config.yaml_io import canonical_json
from hpcrl.errors import ConfigError, Problem
from hpcrl.launcher.config import ClusterConfig
from hpcrl.launcher.profiles import find_profile, is_path, load_profile, reference_problem, setup_problems

COMMAND_LINE = "command line"
PROFILE_KEY = "cluster.profile"
ID_LENGTH = 10


@dataclass(frozen=True)
class ResolvedConfig:
    """One array element: its index in the sweep, its id and its config."""

    index: int
    config_id: str
    config: ExperimentConfig
    data: dict[str, Any]
    """The config as plain data (what is written to config.yaml)."""
    swept: dict[str, Any]
    """The swept keys' values of this element."""

    @property
    def run_dir(self) -> Path:
        return (Path(self.config.run_root) / self.config.name / self.config_id).absolute()


@dataclass(frozen=True)
class Sweep:
    """All elements of a template (a template without `sweep:` is a sweep of one)."""

    template: Path
    name: str
    keys: list[str]
    """Swept dotted keys, in order."""
    elements: list[ResolvedConfig]


def config_id(data: dict[str, Any]) -> str:
    return hashlib.sha256(canonical_json(data).encode()).hexdigest()[:ID_LENGTH]


def resolve(template_path: str | Path, overrides: dict[str, Any] | None = None) -> Sweep:
    """Load, check and expand a template. Raises ConfigError with every problem found."""
    template = load_template(template_path)
    overrides = overrides or {}
    values = dict(template.values)
    for key, value in overrides.items():
        values = with_values(values, {key: value})
        template.origins[key] = COMMAND_LINE
    base, problems = check_tree(values, ExperimentConfig, template.origin_of)
    problems += setup_problems(values.get("cluster"), template.origin_of)
    plan, sweep_problems = check_sweep(
        template.sweep,
        template.sweep_file,
        leaf_types(ExperimentConfig),
        lambda key: "it is set on the command line" if key in overrides else None,
    )
    problems += sweep_problems
    profile, profile_problems = _profile(base, template, from_command_line=PROFILE_KEY in overrides)
    problems += profile_problems
    elements, rule_problems = _expand(base, plan, template, profile)
    problems += rule_problems
    if problems:
        raise ConfigError(_dedupe(problems))
    return Sweep(
        template=Path(template_path),
        name=str(base.get("name", ExperimentConfig.name)),
        keys=plan.keys,
        elements=elements,
    )


def _expand(
    base: dict[str, Any], plan: SweepPlan, template: Template, profile: dict[str, Any]
) -> tuple[list[ResolvedConfig], list[Problem]]:
    elements: list[ResolvedConfig] = []
    failures: dict[tuple[str, str], list[int]] = defaultdict(list)
    for index, assignment in enumerate(plan.assignments()):
        data = with_values(base, assignment)
        if profile:
            data["cluster"] = deep_merge(profile, data.get("cluster", {}))
        cfg = build(ExperimentConfig, data)
        plain = to_dict(cfg)
        for key, message in element_problems(cfg, plain):
            failures[(key, message)].append(index)
        elements.append(ResolvedConfig(index, config_id(plain), cfg, plain, assignment))
    problems = []
    for (key, message), indices in failures.items():
        swept = key in plan.keys
        file = template.sweep_file if swept else template.origin_of(key)
        if len(elements) > 1:
            shown = ", ".join(map(str, indices[:8])) + (", ..." if len(indices) > 8 else "")
            message = f"{message} [sweep element(s) {shown}]"
        problems.append(Problem(message, file, key))
    return elements, problems


def element_problems(cfg: ExperimentConfig, plain: dict[str, Any] | None = None) -> list[tuple[str, str]]:
    """Every rule one resolved config must pass, as (dotted key, message): the cross-field rules and the
    text rule of every string. Run on each element here and on each config `hpcrl resume` submits again
    (its config.yaml may have been edited since)."""
    return [*check_rules(cfg), *string_problems(to_dict(cfg) if plain is None else plain)]


def _profile(
    base: dict[str, Any], template: Template, from_command_line: bool
) -> tuple[dict[str, Any], list[Problem]]:
    """The checked `cluster:` defaults of the profile that `cluster.profile` selects ({} for none).

    One per sweep (cluster.profile cannot be swept). The profile's keys are recorded as coming from its
    file, so a problem with one of its values names the profile, not the template. When it was chosen
    by file, `cluster.profile` records the absolute path that was read."""
    reference = base.get("cluster", {}).get(PROFILE_KEY.partition(".")[2])
    if reference is None:
        return {}, []
    where = template.origin_of(PROFILE_KEY)
    problem = reference_problem(reference, from_command_line)
    if problem:
        return {}, [Problem(problem, where, PROFILE_KEY)]
    try:
        path = find_profile(reference, from_command_line)
        raw = load_profile(path)
    except ConfigError as err:
        return {}, [Problem(p.message, p.file or where, p.key) for p in err.problems]
    raw.pop("profile", None)
    checked, problems = check_tree(raw, ClusterConfig, lambda _k: str(path), prefix="cluster.")
    for key in flatten(checked, "cluster."):
        template.origins.setdefault(key, str(path))
    if is_path(reference):
        base["cluster"] = {**base["cluster"], "profile": str(path)}
    return checked, problems


def with_values(base: dict[str, Any], assignment: dict[str, Any]) -> dict[str, Any]:
    """A copy of `base` with dotted keys set; only the mappings on the changed paths are copied."""
    out = dict(base)
    for dotted, value in assignment.items():
        parts = dotted.split(".")
        node = out
        for part in parts[:-1]:
            child = node.get(part)
            node[part] = dict(child) if isinstance(child, dict) else {}
            node = node[part]
        node[parts[-1]] = value
    return out


def _dedupe(problems: list[Problem]) -> list[Problem]:
    return list(dict.fromkeys(problems))
