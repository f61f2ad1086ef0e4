"""Template + command-line overrides + cluster profile + sweep -> N checked ExperimentConfigs.

Precedence, lowest first: dataclass defaults < cluster profile (for `cluster:`) < template chain <
command-line overrides < the element's sweep values. Overriding a swept key on the command line is an
error (the sweep would collapse into copies). Everything is checked before anything is returned, and
ALL problems are raised together as one ConfigError (exit 2). Where profiles may come from and what
only they may set: hpcrl.cluster.profiles. Every string of every element: hpcrl.config.text_rules.

Config id: the first 10 hex digits of sha256 over the canonical JSON of the resolved config, so the
same experiment always gets the same id (and run directory), whatever template produced it.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpcrl.cluster.config import ClusterConfig
from hpcrl.cluster.profiles import (
    COMMAND_LINE,
    find_profile,
    is_path,
    load_profile,
    reference_problem,
    setup_problems,
)
from hpcrl.config.schema import (
    check_tree,
    deep_merge,
    flatten,
    get_dotted,
    leaf_types,
    set_dotted,
    to_dict,
    with_values,
)
from hpcrl.config.sweep_axes import SweepPlan, check_sweep
from hpcrl.config.template import Template, load_template
from hpcrl.config.text_rules import string_problems
from hpcrl.env.spec import KEY as ENVIRONMENT
from hpcrl.errors import ConfigError, Problem
from hpcrl.experiment.config import ExperimentConfig
from hpcrl.experiment.elements import ElementMaker, Elements, ResolvedConfig
from hpcrl.experiment.ids import config_id
from hpcrl.experiment.stage_kinds import config_rules, section_problems, stage_data
from hpcrl.progress import Track, untracked
from hpcrl.rewards.function import KEY as REWARD_FUNCTION
from hpcrl.usercode.spec import absolute_spec

__all__ = ["ResolvedConfig", "Sweep", "config_id", "element_problems", "resolve"]

PROFILE_KEY = "cluster.profile"
INDICES_SHOWN = 8
"""Sweep element indices quoted in a problem that several elements share."""


@dataclass(frozen=True)
class Sweep:
    """All elements of a template (a template without `sweep:` is a sweep of one)."""

    template: Path
    name: str
    keys: list[str]
    """Swept dotted keys, in order."""
    elements: Elements
    """Made one at a time when read (hpcrl.experiment.elements); each was checked by `resolve`."""
    plan: SweepPlan = field(repr=False)


def resolve(
    template_path: str | Path, overrides: dict[str, Any] | None = None, *, track: Track = untracked
) -> Sweep:
    """Load, check and expand a template. Raises ConfigError with every problem found.

    Every element is made and checked once here, and only its config id kept; `track` shows that pass."""
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
        lambda key: _unsweepable(key, overrides),
    )
    problems += sweep_problems + _stage_problems(values, plan, template)
    _anchor_paths(base, plan, template)
    profile, profile_problems = _profile(base, template, from_command_line=PROFILE_KEY in overrides)
    problems += profile_problems
    if profile:
        base["cluster"] = deep_merge(profile, base.get("cluster", {}))
    # Made from what passed (bad keys left out), so that the rules report too: every problem at once.
    maker = ElementMaker(base, profile, plan)
    ids, element_problems_found = _check_elements(maker, plan, template, track)
    problems += element_problems_found
    if problems:
        raise ConfigError(_dedupe(problems))
    return Sweep(
        template=Path(template_path),
        name=maker.base_config.name,
        keys=plan.keys,
        elements=Elements(maker, plan, ids),
        plan=plan,
    )


def _unsweepable(key: str, overrides: dict[str, Any]) -> str | None:
    if key in overrides:
        return "it is set on the command line"
    if key == "stage":
        return "a sweep's elements run one stage (chain stages as separate jobs)"
    return None


def _stage_problems(values: dict[str, Any], plan: SweepPlan | None, template: Template) -> list[Problem]:
    """A section the stage does not read, set anywhere (one problem per section: a DPO template that
    extends an RL one would otherwise list every inherited key)."""
    stage = values.get("stage", ExperimentConfig.stage)
    first: dict[str, str] = {}
    for key in (*flatten(values), *(plan.keys if plan else ())):
        first.setdefault(key.partition(".")[0], key)
    swept = set(plan.keys if plan else ())

    def origin_of(key: str) -> str | None:
        return template.sweep_file if key in swept else template.origin_of(key)

    return section_problems(stage, first.values(), origin_of)


RELATIVE_TO_TEMPLATE = {REWARD_FUNCTION: absolute_spec, ENVIRONMENT: absolute_spec}
"""Keys whose relative file paths mean the directory of the file that sets them (the template, the
sweep's file; the working directory for the command line), made absolute here so that every rank and
every resume reads the same file."""
USER_CODE_KEYS = (REWARD_FUNCTION, ENVIRONMENT)
"""Keys that name user code (a file or module run by the ranks): their sources' digests are recorded."""


def user_code_specs(cfg: Any) -> dict[str, str]:
    """The user code a config names, by key (those of USER_CODE_KEYS it sets)."""
    specs = {}
    for key in USER_CODE_KEYS:
        value = cfg
        for part in key.split("."):
            value = getattr(value, part, None)
        if isinstance(value, str):
            specs[key] = value
    return specs


def _anchor_paths(base: dict[str, Any], plan: SweepPlan | None, template: Template) -> None:
    for key, anchor in RELATIVE_TO_TEMPLATE.items():
        value = get_dotted(base, key, None)
        if isinstance(value, str):
            origin = template.origin_of(key)
            where = Path.cwd() if origin == COMMAND_LINE else Path(origin).parent
            set_dotted(base, key, anchor(value, where))
        if plan is not None and key in plan.keys:
            where = Path(template.sweep_file).parent if template.sweep_file else Path.cwd()
            for axis in (plan.grid, plan.zip):
                if key in axis:
                    axis[key] = [anchor(v, where) if isinstance(v, str) else v for v in axis[key]]
            for point in plan.points:
                if isinstance(point.get(key), str):
                    point[key] = anchor(point[key], where)


class _Failures:
    """Problems shared by elements: (key, message) -> how many elements and the first few indices."""

    def __init__(self) -> None:
        self._seen: dict[tuple[str, str], tuple[int, list[int]]] = {}

    def add(self, key: str, message: str, indices: Iterable[int], count: int) -> None:
        seen, shown = self._seen.get((key, message), (0, []))
        shown += itertools.islice(indices, INDICES_SHOWN - len(shown))
        self._seen[(key, message)] = (seen + count, shown)

    def problems(self, plan: SweepPlan, template: Template, elements: int) -> list[Problem]:
        out = []
        for (key, message), (count, shown) in self._seen.items():
            file = template.sweep_file if key in plan.keys else template.origin_of(key)
            if elements > 1:
                more = ", ..." if count > INDICES_SHOWN else ""
                message = f"{message} [sweep element(s) {', '.join(map(str, shown))}{more}]"
            out.append(Problem(message, file, key))
        return out


def _check_elements(
    maker: ElementMaker, plan: SweepPlan, template: Template, track: Track
) -> tuple[list[str], list[Problem]]:
    """Make and check every element; return their config ids and the problems (shared ones merged).

    The strings of the base config are checked once, those of each element's sweep values per element:
    an element's strings are exactly these (element_problems checks a whole config, for `resume`)."""
    failures = _Failures()
    for problem in string_problems(maker.base_data):
        if not _is_swept(problem.key, plan.keys):  # else no element has the base's value
            failures.add(problem.key, problem.message, range(len(plan)), len(plan))
    ids: list[str] = []
    for index, assignment in enumerate(track(plan.assignments(), len(plan), "checking configs")):
        element = maker.make(index, assignment)
        swept_data = {key: get_dotted(element.data, key) for key in assignment}
        for problem in (*config_rules(element.config), *string_problems(swept_data)):
            failures.add(problem.key, problem.message, (index,), 1)
        ids.append(element.config_id)
    return ids, failures.problems(plan, template, len(plan))


def _is_swept(key: str, swept: list[str]) -> bool:
    """`key` is a swept key or lies inside one (cluster.env.X inside a swept cluster.env)."""
    return any(key == k or key.startswith(f"{k}.") for k in swept)


def element_problems(cfg: ExperimentConfig, plain: dict[str, Any] | None = None) -> list[Problem]:
    """Every rule one resolved config must pass, each problem naming its dotted key: the cross-field rules and the
    text rule of every string. Checks each config `hpcrl resume` submits again (its config.yaml may have
    been edited since); `resolve` applies the same rules per element, the strings split as it says."""
    return [*config_rules(cfg), *string_problems(stage_data(to_dict(cfg)) if plain is None else plain)]


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


def _dedupe(problems: list[Problem]) -> list[Problem]:
    return list(dict.fromkeys(problems))
