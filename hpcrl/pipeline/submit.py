"""Submit a planned pipeline to Slurm: one sbatch per stage (an array for a sweep stage), each waiting for
its upstream stages' arrays with `--dependency=afterok:<ids>` and `--kill-on-invalid-dep=yes`.

Order: check every stage (the memory plan, the Slurm preflight: nothing written on a problem) -> write
every stage's sweep directory (its configs and manifest, hpcrl.launcher.sweeps) and the pipeline record
-> sbatch the stages in dependency order, each with the job ids of the arrays it waits for. `afterok` on
an array job holds until every element of it completed; an element that fails makes the dependency
unsatisfiable, and `--kill-on-invalid-dep=yes` has Slurm cancel the dependents (reason
DependencyNeverSatisfied) instead of leaving them pending forever. A stage that is preempted or requeued
(submitit's time-limit handler) has not ended, so its dependents keep waiting.

If sbatch refuses stage k, the stages already queued are scancelled (no half-pipeline runs), and the
record says which stage was refused and why (ClusterError, exit 1).
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpcrl.config.output_dirs import PIPELINE_DIR
from hpcrl.errors import ClusterError, ConfigError, Problem, cut
from hpcrl.launcher import preflight, slurm, sweeps
from hpcrl.launcher.inputs import write_inputs
from hpcrl.launcher.memory_preflight import memory_preflight
from hpcrl.launcher.sweep_manifest import Manifest
from hpcrl.pipeline.manifest import PIPELINE_MANIFEST, PipelineManifest, StageRecord, load_pipeline_manifest
from hpcrl.pipeline.plan import Pipeline, PlannedStage
from hpcrl.progress import Track, untracked

KILL_ON_INVALID_DEP = {"kill_on_invalid_dep": "yes"}


@dataclass(frozen=True)
class CheckedStage:
    stage: PlannedStage
    arrays: list[slurm.ArrayJob]


def default_pipeline_dir(pipeline: Pipeline) -> Path:
    first = pipeline.stages[0].sweep.elements[0].config
    ids = "".join(e for s in pipeline.stages for e in s.sweep.elements.ids)
    digest = hashlib.sha256(ids.encode()).hexdigest()[:6]
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    return (Path(first.run_root) / pipeline.spec.name / "pipelines" / f"{stamp}-{digest}").absolute()


def pipeline_dir_problems(pipeline_dir: Path, key: str) -> list[Problem]:
    """An output directory (as a sweep's) that holds no submitted pipeline (a dry run's may be reused)."""
    problems = sweeps.sweep_dir_problems(pipeline_dir, key, PIPELINE_DIR)
    if problems or not (pipeline_dir / PIPELINE_MANIFEST).exists():
        return problems
    try:
        record = load_pipeline_manifest(pipeline_dir)
    except ConfigError:
        return [Problem(f"{pipeline_dir} holds a {PIPELINE_MANIFEST} that does not load", key=key)]
    if all(s.state == "DRY_RUN" for s in record.stages):
        return []
    return [Problem(f"{pipeline_dir} holds a submitted pipeline: choose another {key}", key=key)]


def check(
    pipeline: Pipeline,
    pipeline_dir: Path,
    *,
    dry_run: bool,
    ignore_memory_plan: bool,
    track: Track = untracked,
) -> tuple[list[CheckedStage], list[str]]:
    """Every stage's memory plan and Slurm preflight (a dry run: without a controller, warnings only);
    (the arrays of each stage, notes). ConfigError with every stage's problems, before anything is written."""
    problems: list[Problem] = []
    notes: list[str] = []
    checked = []
    for stage in pipeline.stages:
        elements = stage.sweep.elements
        if not ignore_memory_plan:
            memory = memory_preflight(stage.checked_as.elements, track)  # with the model it starts from
            notes += [f"stage {stage.name}: {n}" for n in memory.notes]
            problems += [_of_stage(p, stage.name) for p in memory.problems]
        slurm_executor = elements[0].config.cluster.executor == "slurm"
        if not dry_run and not slurm_executor:
            message = "submit sends a pipeline to Slurm (cluster.executor: slurm); `hpcrl run PIPELINE` runs it here"
            problems.append(Problem(f"stage {stage.name}: {message}", key="cluster.executor"))
            continue
        plan = preflight.plan(
            elements,
            stage.sweep.name,
            pipeline_dir / stage.name / sweeps.SLURM_DIR,
            need_controller=not dry_run,
            fit_to_cluster=slurm_executor,
        )
        notes += [f"stage {stage.name}: {n}" for n in plan.notes]
        if dry_run:
            notes += [f"stage {stage.name}: a submit would refuse it: {p}" for p in plan.problems]
        else:
            problems += [_of_stage(p, stage.name) for p in plan.problems]
        checked.append(CheckedStage(stage, plan.arrays))
    if problems:
        raise ConfigError(problems)
    return checked, notes


def _of_stage(problem: Problem, stage: str) -> Problem:
    return Problem(f"stage {stage}: {problem.message}", problem.file, problem.key)


def write(
    pipeline: Pipeline, pipeline_dir: Path, *, dry_run: bool, track: Track = untracked
) -> tuple[PipelineManifest, dict[str, Manifest]]:
    """Every stage's sweep directory (`<pipeline dir>/<stage>`: configs, manifest) and the pipeline record."""
    manifests = {}
    for stage in pipeline.stages:
        manifests[stage.name] = sweeps.prepare(
            stage.sweep, pipeline_dir / stage.name, stage.overrides, dry_run=dry_run, track=track
        )
        if stage.inputs and not dry_run:  # what each element takes from upstream, bound when it starts
            for entry in manifests[stage.name].entries:
                write_inputs(Path(entry.run_dir), stage.inputs)
    state = "DRY_RUN" if dry_run else "NEW"
    record = PipelineManifest(
        pipeline_dir=str(pipeline_dir),
        name=pipeline.spec.name,
        file=str(pipeline.spec.path.absolute()),
        created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        stages=[StageRecord(s.name, list(s.spec.after), state) for s in pipeline.stages],
    )
    record.save()
    return record, manifests


def with_dependency(params: dict[str, Any], job_ids: list[str]) -> dict[str, Any]:
    """sbatch parameters that wait for every job of `job_ids` to complete (none: unchanged)."""
    if not job_ids:
        return params
    extra = {**params.get("additional_parameters", {}), **KILL_ON_INVALID_DEP}
    return {**params, "dependency": "afterok:" + ":".join(job_ids), "additional_parameters": extra}


def submit(record: PipelineManifest, manifests: dict[str, Manifest], checked: list[CheckedStage]) -> None:
    """sbatch every stage in order, each after its upstream stages' arrays; on a refusal, cancel what
    was queued and record why (then raise the ClusterError)."""
    for position, item in enumerate(checked):
        stage = record.stage(item.stage.name)
        waits = [job_id for name in stage.after for job_id in record.stage(name).job_ids]
        arrays = [dataclasses.replace(a, params=with_dependency(a.params, waits)) for a in item.arrays]
        manifest = manifests[stage.name]
        try:
            sweeps.submit_elements(manifest, item.stage.sweep.elements, arrays=arrays)
        except ClusterError as err:
            cancel_accepted(manifest, 0)  # a stage of several arrays: those sbatch took before the refusal
            _undo(record, manifests, stage.name, [c.stage.name for c in checked[position + 1 :]], err)
            raise
        stage.job_ids = [str(a["job_id"]) for a in manifest.arrays]
        stage.state = "QUEUED"
        record.save()


def cancel_accepted(manifest: Manifest, before: int) -> None:
    """scancel the arrays of `manifest` recorded after its first `before` ones (what one submit queued)."""
    indices = [i for array in manifest.arrays[before:] for i in array["indices"]]
    if indices:
        sweeps.cancel(manifest, indices)


def _undo(
    record: PipelineManifest,
    manifests: dict[str, Manifest],
    refused: str,
    later: list[str],
    err: ClusterError,
) -> None:
    why = cut(str(err), slurm.REASON_CHARS)
    for stage in record.stages:
        if stage.state == "QUEUED":
            sweeps.cancel(manifests[stage.name], None)
            stage.state, stage.reason = "CANCELLED", f"stage {refused} was refused by sbatch"
    refused_stage = record.stage(refused)
    refused_stage.state, refused_stage.reason = "SUBMIT_FAILED", why
    for name in later:
        record.stage(name).reason = f"not submitted: stage {refused} was refused by sbatch"
    record.save()


def render_scripts(
    record: PipelineManifest, checked: list[CheckedStage], python: str
) -> list[tuple[str, Path]]:
    """A dry run: every stage's sbatch script(s), with its dependency on its upstream stages' arrays
    (whose ids a submit fills in; here `<stage>`), written to `<pipeline dir>/<stage>/sbatch/`."""
    out = []
    for item in checked:
        stage = record.stage(item.stage.name)
        waits = [f"<{name}>" for name in stage.after]
        arrays = [dataclasses.replace(a, params=with_dependency(a.params, waits)) for a in item.arrays]
        for path, _ in sweeps.render_scripts(arrays, record.stage_dir(stage.name), python):
            out.append((stage.name, path))
    return out
