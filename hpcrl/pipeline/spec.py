"""A pipeline file: stages in order, each an ordinary experiment template plus overrides.

    name: tiny                           # optional; default: the file's name without .yaml
    stages:
      sft: {template: ../sft_tiny.yaml}
      rm:  {template: ../rm_tiny.yaml, set: {model.hf_path: "${stages.sft.hf}"}}
      rl:
        template: ../ppo_tiny.yaml
        set: {model.hf_path: "${stages.sft.hf}", reward.model_path: "${stages.rm.hf}"}
        after: [rm]                      # edges beyond those the references imply

A stage's `template` is a path relative to the pipeline file (it may `extends:` and `sweep:`); `set`
maps dotted config keys to values, which may hold references to upstream outputs (hpcrl.pipeline.refs);
a stage depends on every stage it references and every stage in its `after`. The file is untrusted
input: every problem is collected, each naming the file and the key (`stages.rl.set.model.hf_path`),
and raised together (ConfigError, exit 2) before anything is resolved.
"""

from __future__ import annotations

import graphlib
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpcrl.config.text_rules import path_problem, text_problem
from hpcrl.config.yaml_io import load_yaml
from hpcrl.errors import ConfigError, Problem, short
from hpcrl.pipeline.refs import STAGE_NAME, Reference, ReferenceError, references

MAX_STAGES = 32
PIPELINE_NAME = re.compile(r"[a-z][a-z0-9_-]{0,63}", re.ASCII)
STAGE_KEYS = ("template", "set", "after")
TOP_KEYS = ("name", "stages")


@dataclass(frozen=True)
class StageSpec:
    """One stage as the pipeline file writes it."""

    name: str
    template: Path
    """The stage's experiment template, anchored at the pipeline file's directory."""
    values: dict[str, Any]
    """`set`: dotted key -> value (strings may hold references)."""
    refs: dict[str, list[Reference]]
    """Dotted key of `values` -> the references its value holds."""
    after: tuple[str, ...]
    """Every stage this one waits for: its `after` and the stages it references, in pipeline order."""


@dataclass(frozen=True)
class PipelineSpec:
    path: Path
    name: str
    stages: list[StageSpec]
    """In an order where every stage comes after those it waits for (the file's order where it can)."""

    def stage(self, name: str) -> StageSpec:
        return next(s for s in self.stages if s.name == name)


def is_pipeline(data: Any) -> bool:
    """A YAML document is a pipeline (not an experiment template) when it has a top-level `stages:`."""
    return isinstance(data, dict) and "stages" in data


def is_pipeline_file(path: str | Path) -> bool:
    """`path` reads as a pipeline file (a file that does not read is the template loader's to report)."""
    try:
        return is_pipeline(load_yaml(path))
    except ConfigError:
        return False


def load_pipeline(path: str | Path) -> PipelineSpec:
    """The checked pipeline in `path`; ConfigError listing every problem, each naming file and key."""
    path = Path(path)
    data = load_yaml(path)
    file = str(path)
    problems: list[Problem] = []
    if not is_pipeline(data):
        raise ConfigError(
            Problem("a pipeline is a mapping with a `stages:` mapping", file=file, key="stages")
        )
    problems += [
        Problem("unknown key (a pipeline has name, stages)", file, str(k)) for k in data if k not in TOP_KEYS
    ]
    name = data.get("name", path.name.removesuffix(".yaml").removesuffix(".yml"))
    if not isinstance(name, str) or not PIPELINE_NAME.fullmatch(name):
        problems.append(Problem(f"{short(name)} is not a pipeline name ([a-z][a-z0-9_-]*)", file, "name"))
    raw = data["stages"]
    if not isinstance(raw, dict) or not raw:
        problems.append(Problem("must map stage names to stages", file, "stages"))
        raise ConfigError(problems)
    if len(raw) > MAX_STAGES:
        problems.append(Problem(f"{len(raw)} stages; at most {MAX_STAGES}", file, "stages"))
        raise ConfigError(problems)
    stages = []
    for stage_name, body in raw.items():
        stage, found = _stage(stage_name, body, path)
        problems += found
        if stage is not None:
            stages.append(stage)
    if problems:
        raise ConfigError(problems)
    ordered = _ordered(stages, file)
    return PipelineSpec(path=path, name=str(name), stages=ordered)


def _stage(name: Any, body: Any, path: Path) -> tuple[StageSpec | None, list[Problem]]:
    file = str(path)
    if not isinstance(name, str) or not STAGE_NAME.fullmatch(name):
        message = f"{short(name)} is not a stage name ([a-z][a-z0-9_]*, at most 32 characters)"
        return None, [Problem(message, file, "stages")]
    where = f"stages.{name}"
    if not isinstance(body, dict):
        return None, [Problem(f"must be a mapping with `template`, got {short(body)}", file, where)]
    problems = [
        Problem(f"unknown key (a stage has {', '.join(STAGE_KEYS)})", file, f"{where}.{k}")
        for k in body
        if k not in STAGE_KEYS
    ]
    template = body.get("template")
    if not isinstance(template, str) or not template:
        problems.append(
            Problem(f"must be a path to a template, got {short(template)}", file, f"{where}.template")
        )
    elif problem := path_problem(template):
        problems.append(Problem(problem, file, f"{where}.template"))
    values, refs, found = _values(body.get("set", {}), file, f"{where}.set")
    after, found_after = _after(body.get("after", []), name, file, f"{where}.after")
    problems += found + found_after
    if problems:
        return None, problems
    anchored = Path(os.path.normpath(path.parent / template))
    try:
        found_file = anchored.is_file()
    except (OSError, ValueError) as err:  # a directory on the way that may not be read
        return None, [Problem(f"cannot read {short(str(anchored))}: {err}", file, f"{where}.template")]
    if not found_file:
        return None, [Problem(f"no template file at {short(str(anchored))}", file, f"{where}.template")]
    waits = (*after, *(r.stage for rs in refs.values() for r in rs))
    return StageSpec(name, anchored, values, refs, tuple(dict.fromkeys(waits))), []


def _values(
    raw: Any, file: str, where: str
) -> tuple[dict[str, Any], dict[str, list[Reference]], list[Problem]]:
    if not isinstance(raw, dict):
        return {}, {}, [Problem(f"must map dotted config keys to values, got {short(raw)}", file, where)]
    values, refs, problems = {}, {}, []
    for key, value in raw.items():
        if not isinstance(key, str) or (why := text_problem(key)) or not key:
            problems.append(Problem(why or f"{short(key)} is not a dotted config key", file, where))
            continue
        try:
            found = references(value) if isinstance(value, str) else []
            nested = not isinstance(value, str) and any("${" in text for text in _strings(value))
        except ReferenceError as err:
            problems.append(Problem(str(err), file, f"{where}.{key}"))
            continue
        except RecursionError:
            problems.append(Problem("nested too deep to be a config value", file, f"{where}.{key}"))
            continue
        if nested:  # the element binds a reference in the value of the key it names, a string
            message = "a reference stands in a string value: name the key in full (e.g. reward.model_path)"
            problems.append(Problem(message, file, f"{where}.{key}"))
            continue
        values[key] = value
        if found:
            refs[key] = found
    return values, refs, problems


def _strings(value: Any) -> Iterator[str]:
    """Every string inside a YAML value (mapping keys and values, list items)."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _strings(key)
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def _after(raw: Any, name: str, file: str, where: str) -> tuple[tuple[str, ...], list[Problem]]:
    if not isinstance(raw, list) or not all(isinstance(s, str) for s in raw):
        return (), [Problem(f"must be a list of stage names, got {short(raw)}", file, where)]
    if name in raw:
        return (), [Problem(f"stage {name} cannot wait for itself", file, where)]
    return tuple(raw), []


def _ordered(stages: list[StageSpec], file: str) -> list[StageSpec]:
    """The stages in dependency order (stable: the file's order where no edge says otherwise); every
    unknown stage named, and a cycle, as problems."""
    by_name = {s.name: s for s in stages}
    problems = []
    for stage in stages:
        for upstream in stage.after:
            if upstream not in by_name:
                key = _key_naming(stage, upstream)
                problems.append(Problem(f"no stage {upstream!r} in this pipeline", file, key))
            elif upstream == stage.name:
                problems.append(
                    Problem("a stage cannot use its own outputs", file, _key_naming(stage, upstream))
                )
    if problems:
        raise ConfigError(problems)
    sorter = graphlib.TopologicalSorter({s.name: s.after for s in stages})
    try:
        sorter.prepare()
    except graphlib.CycleError as err:
        loop = " -> ".join(err.args[1])
        raise ConfigError(
            Problem(f"the stages wait for each other in a cycle: {loop}", file, "stages")
        ) from None
    order, position = [], {s.name: i for i, s in enumerate(stages)}
    while sorter.is_active():
        ready = sorted(sorter.get_ready(), key=position.__getitem__)
        order += ready
        sorter.done(*ready)
    return [by_name[name] for name in order]


def _key_naming(stage: StageSpec, upstream: str) -> str:
    """The key of `stage` that names `upstream`: a `set` key whose value references it, else `after`."""
    for key, refs in stage.refs.items():
        if any(r.stage == upstream for r in refs):
            return f"stages.{stage.name}.set.{key}"
    return f"stages.{stage.name}.after"
