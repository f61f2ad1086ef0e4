"""Template + command-line overrides + cluster profile + sweep -> N checked ExperimentConfigs.

Precedence, lowest first: dataclass defaults < cluster profile (for `cluster:`) < template chain <
command-line overrides < the element's sweep values. Overriding a swept key on the command line is an
error (the sweep would collapse into copies). Everything is checked before anything is returned, and
ALL problems are raised together as one ConfigError (exit 2).

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
from hpcrl.config.schema import build, check_tree, deep_merge, leaf_types, to_dict
from hpcrl.config.sweep import SweepPlan, check_sweep
from hpcrl.config.template import Template, load_template
from hpcrl.config.yaml_io import canonical_json
from hpcrl.errors import ConfigError, Problem
from hpcrl.launcher.config import ClusterConfig

COMMAND_LINE = "command line"
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
    plan, sweep_problems = check_sweep(
        template.sweep,
        template.sweep_file,
        leaf_types(ExperimentConfig),
        lambda key: "it is set on the command line" if key in overrides else None,
    )
    problems += sweep_problems
    profiles = _ProfileCache(Path(template_path).parent)
    elements, rule_problems = _expand(base, plan, template, profiles)
    problems += profiles.problems + rule_problems
    if problems:
        raise ConfigError(_dedupe(problems))
    return Sweep(
        template=Path(template_path),
        name=str(base.get("name", ExperimentConfig.name)),
        keys=plan.keys,
        elements=elements,
    )


def _expand(
    base: dict[str, Any], plan: SweepPlan, template: Template, profiles: _ProfileCache
) -> tuple[list[ResolvedConfig], list[Problem]]:
    elements: list[ResolvedConfig] = []
    failures: dict[tuple[str, str], list[int]] = defaultdict(list)
    for index, assignment in enumerate(plan.assignments()):
        data = with_values(base, assignment)
        cluster = data.get("cluster", {})
        profile = profiles.get(cluster.get("profile"))
        if profile:
            data["cluster"] = deep_merge(profile, cluster)
        cfg = build(ExperimentConfig, data)
        plain = to_dict(cfg)
        for key, message in check_rules(cfg):
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


class _ProfileCache:
    """Checked cluster profiles by name; problems are collected once per profile."""

    def __init__(self, template_dir: Path):
        self.template_dir = template_dir
        self.cache: dict[str, dict[str, Any]] = {}
        self.problems: list[Problem] = []

    def get(self, name: str | None) -> dict[str, Any]:
        if name is None:
            return {}
        if name not in self.cache:
            from hpcrl.launcher.profiles import find_profile, load_profile

            try:
                path = find_profile(name, self.template_dir)
                raw = load_profile(path)
            except ConfigError as err:
                self.problems += err.problems
                self.cache[name] = {}
                return {}
            raw.pop("profile", None)
            checked, problems = check_tree(raw, ClusterConfig, lambda _k: str(path), prefix="cluster.")
            self.problems += problems
            self.cache[name] = checked
        return self.cache[name]


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
