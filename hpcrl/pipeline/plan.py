"""A pipeline file -> every stage resolved and checked, in dependency order, before anything is written.

Each stage is its template resolved as `hpcrl expand` resolves one (hpcrl.experiment.resolve), with its
`set` values (references replaced by the upstream outputs' paths) and then the command line's overrides
(which apply to every stage, and win). Its outputs are known before it runs: the run directory is the
config id's, the HF export is `<run_dir>/hf` (hpcrl.stages.export), the checkpoint root `checkpoint.dir`
or `<run_dir>/checkpoints`; so a consumer's config, id and run directory are fixed at submit.

A consumer's rules meet the model it will load: where `model.hf_path` is an upstream stage's export (a
path that does not exist yet), the stage is checked a second time as if it started from the upstream
model itself (its own `hf_path`, or its architecture fields): a layout that cannot split the SFT model
is refused at `expand`/`submit`, not on a compute node at 3 a.m. Every problem of every stage is
collected and raised together, each naming its stage, file and key.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpcrl.ckpt.config import HF_EXPORT_DIR, checkpoint_root
from hpcrl.errors import ConfigError, Problem
from hpcrl.experiment.elements import ResolvedConfig
from hpcrl.experiment.resolve import Sweep, resolve
from hpcrl.launcher.inputs import Input
from hpcrl.pipeline.refs import Reference, substitute
from hpcrl.pipeline.spec import PipelineSpec, StageSpec, load_pipeline
from hpcrl.progress import Track, untracked
from hpcrl.train.config import ARCHITECTURE_FIELDS

MODEL_PATH = "model.hf_path"


@dataclass(frozen=True)
class PlannedStage:
    spec: StageSpec
    sweep: Sweep
    overrides: dict[str, Any]
    """What the stage's template was resolved with: its `set` (references replaced), then the command
    line's overrides."""
    checked_as: Sweep
    """The sweep as checked with the model it starts from (an upstream export: resolved with that model's
    own `hf_path` or dims), which the memory plan reads; else `sweep` itself."""
    inputs: list[Input]
    """What each element takes from upstream stages (written to its run dir as inputs.json; bound and
    verified when it starts: hpcrl.launcher.inputs)."""

    @property
    def name(self) -> str:
        return self.spec.name


@dataclass(frozen=True)
class Pipeline:
    spec: PipelineSpec
    stages: list[PlannedStage]
    """In dependency order."""

    def stage(self, name: str) -> PlannedStage:
        return next(s for s in self.stages if s.name == name)


def output_path(element: ResolvedConfig, output: str) -> Path:
    """Where element `element` leaves `output` (hpcrl.pipeline.refs.OUTPUTS)."""
    if output == "hf":
        return element.run_dir / HF_EXPORT_DIR
    if output == "checkpoint":
        return checkpoint_root(element.config.checkpoint, element.run_dir).absolute()
    return element.run_dir


def plan_pipeline(
    path: str | Path, overrides: dict[str, Any] | None = None, *, track: Track = untracked
) -> Pipeline:
    """Load, resolve and check every stage; ConfigError with every problem of every stage."""
    spec = load_pipeline(path)
    overrides = overrides or {}
    planned: dict[str, PlannedStage | None] = {}  # None: the stage has problems
    problems: list[Problem] = []
    for stage in spec.stages:
        values, inputs, found = _substituted(stage, planned, spec.path)
        inputs = [i for i in inputs if not _overridden(i.key, overrides)]  # the command line wins
        problems += found
        stage_overrides = {**values, **overrides}
        try:
            sweep = resolve(stage.template, stage_overrides, track=track)
        except ConfigError as err:
            problems += [_placed(p, stage, spec.path, overrides) for p in err.problems]
            planned[stage.name] = None
            continue
        if found or any(planned[name] is None for name in stage.after):
            planned[stage.name] = None  # checked, against stand-ins for what it references
            continue
        upstream = {name: planned[name] for name in stage.after}
        found, checked_as = _upstream_model_check(
            stage, sweep, stage_overrides, upstream, spec.path, overrides, track
        )
        problems += found
        planned[stage.name] = PlannedStage(stage, sweep, stage_overrides, checked_as or sweep, inputs)
    if problems:
        raise ConfigError(list(dict.fromkeys(problems)))
    return Pipeline(spec, [planned[s.name] for s in spec.stages])


def _substituted(
    stage: StageSpec, planned: dict[str, PlannedStage | None], pipeline: Path
) -> tuple[dict[str, Any], list[Input], list[Problem]]:
    """The stage's `set` values with every reference replaced by its upstream path (a selection rule's
    stays: the element binds it when it starts), the stage's inputs, and the problems. A reference to a
    stage with problems, or one that is wrong, is replaced by a stand-in path (`<pipeline dir>/.unresolved`),
    so the stage's own rules still run: every problem of every stage is reported at once."""
    resolved: dict[str, str] = {}
    inputs: list[Input] = []
    problems = []
    for key, refs in stage.refs.items():
        for ref in refs:
            resolved[ref.text] = str(pipeline.parent / ".unresolved" / ref.stage / ref.output)
            upstream = planned[ref.stage]
            if upstream is None:
                continue
            try:
                found = reference_input(key, ref, upstream)
            except ValueError as err:
                problems.append(Problem(str(err), str(pipeline), f"stages.{stage.name}.set.{key}"))
                continue
            resolved[ref.text] = found.reference
            inputs.append(found)
    return {key: _replace_in(value, resolved) for key, value in stage.values.items()}, inputs, problems


def reference_input(key: str, ref: Reference, upstream: PlannedStage) -> Input:
    """What reference `ref` in `key` takes from `upstream`: one element's output (its path stands in the
    config), or with a rule every element's, the choice left to the consumer's start."""
    elements = upstream.sweep.elements
    if ref.output == "hf" and not elements[0].config.checkpoint.export_hf:
        raise ValueError(
            f"{ref.text}: stage {ref.stage} writes no HF export (its checkpoint.export_hf is false)"
        )
    if ref.rule is not None:
        runs = [str(e.run_dir) for e in elements]
        outputs = [str(output_path(e, ref.output)) for e in elements]
        return Input(key, ref.text, ref.stage, ref.output, runs, outputs, ref.rule, ref.metric)
    if ref.element is None and len(elements) > 1:
        raise ValueError(
            f"{ref.text}: stage {ref.stage} is a sweep of {len(elements)}: name an element "
            f"(${{stages.{ref.stage}.0.{ref.output}}}) or a rule (${{stages.{ref.stage}.best(METRIC).{ref.output}}})"
        )
    if ref.element is not None and ref.element >= len(elements):
        raise ValueError(f"{ref.text}: stage {ref.stage} has elements 0..{len(elements) - 1}")
    element = elements[ref.element or 0]
    path = str(output_path(element, ref.output))
    return Input(key, path, ref.stage, ref.output, [str(element.run_dir)], [path])


def _overridden(key: str, overrides: dict[str, Any]) -> bool:
    """`key` is set on the command line, itself or as part of a mapping given there."""
    return any(key == k or key.startswith(f"{k}.") for k in overrides)


def _replace_in(value: Any, resolved: dict[str, str]) -> Any:
    if isinstance(value, str):
        return substitute(value, resolved)
    if isinstance(value, dict):
        return {_replace_in(k, resolved): _replace_in(v, resolved) for k, v in value.items()}
    if isinstance(value, list):
        return [_replace_in(v, resolved) for v in value]
    return value


def _placed(problem: Problem, stage: StageSpec, pipeline: Path, overrides: dict[str, Any]) -> Problem:
    """A stage's problem, named by its stage; one in a `set` value points at the pipeline file's key."""
    key = problem.key or ""
    message = f"stage {stage.name}: {problem.message}"
    set_key = next((k for k in stage.values if key == k or key.startswith(f"{k}.")), None)
    if problem.file == "command line" and set_key is not None and set_key not in overrides:
        return Problem(message, str(pipeline), f"stages.{stage.name}.set.{key}")
    return Problem(message, problem.file, problem.key)


def _upstream_model_check(
    stage: StageSpec,
    sweep: Sweep,
    stage_overrides: dict[str, Any],
    upstream_stages: dict[str, PlannedStage],
    pipeline: Path,
    overrides: dict[str, Any],
    track: Track,
) -> tuple[list[Problem], Sweep | None]:
    """The stage's rules again as if it started from the upstream model its `model.hf_path` names — with a
    selection rule, from each distinct model among the elements it may pick; the problems and the sweep
    resolved with the first of them (None when the stage does not start from an upstream export)."""
    refs = [r for r in stage.refs.get(MODEL_PATH, []) if r.output == "hf"]
    if len(refs) != 1 or stage.values.get(MODEL_PATH) != refs[0].text or MODEL_PATH in overrides:
        return [], None
    ref = refs[0]
    # checked_as: an upstream that itself starts from an export is checked with that export's model
    elements = upstream_stages[ref.stage].checked_as.elements
    candidates = [elements[ref.element or 0]] if ref.rule is None else elements
    distinct = {_architecture(e.config.model): e.config.model for e in candidates}
    problems: list[Problem] = []
    checked_as = None
    for upstream in distinct.values():
        found, resolved = _check_with(
            upstream, stage, sweep, stage_overrides, ref, pipeline, overrides, track
        )
        problems += found
        checked_as = checked_as or resolved
    return problems, checked_as


def _architecture(model) -> tuple:
    return (model.hf_path, *(getattr(model, name) for name in ARCHITECTURE_FIELDS))


def _check_with(
    upstream,
    stage: StageSpec,
    sweep: Sweep,
    stage_overrides: dict[str, Any],
    ref: Reference,
    pipeline: Path,
    overrides: dict[str, Any],
    track: Track,
) -> tuple[list[Problem], Sweep | None]:
    """The stage's own dims against `upstream` (an upstream element's model), then its rules resolved
    with that model: the problems, and the sweep so resolved (None with problems)."""
    own = sweep.elements[0].config.model
    problems = []
    for name in ARCHITECTURE_FIELDS:
        mine, theirs = getattr(own, name), getattr(upstream, name)
        if mine is not None and theirs is not None and mine != theirs:
            message = (
                f"stage {stage.name}: model.{name}={mine!r}, but the model it starts from (stage "
                f"{ref.stage}'s export) has {theirs!r}"
            )
            problems.append(Problem(message, str(sweep.template), f"model.{name}"))
    if problems:
        return problems, None
    variant = {**stage_overrides, MODEL_PATH: upstream.hf_path}
    variant |= {
        f"model.{name}": getattr(upstream, name)
        for name in ARCHITECTURE_FIELDS
        if getattr(own, name) is None and getattr(upstream, name) is not None
    }
    try:
        return [], resolve(stage.template, variant, track=track)
    except ConfigError as err:
        return [_with_upstream_model(p, stage, ref, pipeline, overrides) for p in err.problems], None


def _with_upstream_model(
    problem: Problem, stage: StageSpec, ref: Reference, pipeline: Path, overrides: dict[str, Any]
) -> Problem:
    """A problem found with the upstream model: a model key the check set stands for `model.hf_path`."""
    message = f"{problem.message} (with stage {ref.stage}'s model)"
    key = problem.key or ""
    if problem.file == "command line" and key.startswith("model.") and key not in overrides:
        return Problem(
            f"stage {stage.name}: {message}", str(pipeline), f"stages.{stage.name}.set.{MODEL_PATH}"
        )
    return _placed(Problem(message, problem.file, problem.key), stage, pipeline, overrides)
