"""`cancel` and `resume` on a pipeline directory.

cancel: a stage and every stage downstream of it (all stages when none is named) are scancelled; the
stages upstream keep running. resume: every stage that did not complete, and every stage downstream of
one, is submitted again: its elements that did not complete (failed, cancelled by Slurm because an
upstream stage failed, lost, never submitted), each in its own run directory (its checkpoints resume
it), with fresh `afterok` dependencies on the stages resubmitted before it. A completed stage is not
touched: its run directories and outputs stay as they are, and its consumers read them. Every element's
config is verified against its manifest's fingerprint and every rule a submit checks runs again, for all
stages, before the first sbatch.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from hpcrl.errors import ClusterError, ConfigError, Problem
from hpcrl.experiment.elements import ResolvedConfig
from hpcrl.experiment.resolve import element_problems
from hpcrl.launcher import preflight, slurm, sweeps
from hpcrl.launcher.memory_preflight import memory_preflight
from hpcrl.launcher.sweep_manifest import FINAL, Entry, Manifest, load_manifest
from hpcrl.pipeline.manifest import PipelineManifest
from hpcrl.pipeline.status import StageStatus, pipeline_status
from hpcrl.pipeline.submit import cancel_accepted, with_dependency

RERUN_STATES = (FINAL - {"COMPLETED"}) | {"NEW"}
"""Element states `resume` submits again in a pipeline: every end but COMPLETED, and never submitted."""


def cancel_stages(record: PipelineManifest, stage: str | None) -> list[str]:
    """Cancel `stage` and its downstream stages (every stage when None); their names, in order."""
    names = record.downstream(stage) if stage else [s.name for s in record.stages]
    for name in names:
        entry = record.stage(name)
        if entry.state in ("QUEUED",) and entry.job_ids:
            sweeps.cancel(load_manifest(record.stage_dir(name)), None)
        if entry.state in ("QUEUED", "NEW"):
            entry.state, entry.reason = "CANCELLED", "hpcrl cancel"
    record.save()
    return names


@dataclass(frozen=True)
class Rerun:
    name: str
    manifest: Manifest
    entries: list[Entry]
    elements: list[ResolvedConfig]
    arrays: list[slurm.ArrayJob]


def stages_to_rerun(record: PipelineManifest, statuses: list[StageStatus]) -> list[str]:
    """Every stage that did not complete, and every stage downstream of one, in pipeline order."""
    chosen: set[str] = set()
    for status in statuses:
        if status.state != "COMPLETED":
            chosen.update(record.downstream(status.name))
    return [s.name for s in record.stages if s.name in chosen]


def plan_resume(record: PipelineManifest, notes: list[str], *, ignore_memory_plan: bool) -> list[Rerun]:
    """What `resume` submits, checked (ConfigError with every problem of every stage, nothing written)."""
    if any(s.state == "DRY_RUN" for s in record.stages):
        raise ConfigError(
            Problem("a dry run's pipeline: submit the pipeline file", str(record.path), "stages")
        )
    statuses = pipeline_status(record, notes)
    problems: list[Problem] = []
    reruns = []
    for name in stages_to_rerun(record, statuses):
        manifest = load_manifest(record.stage_dir(name))
        live = [e for e in manifest.entries if e.state not in FINAL and e.state not in ("NEW", "DRY_RUN")]
        if live:
            message = (
                f"stage {name} has elements still queued or running ({live[0].state}): wait, or cancel it"
            )
            problems.append(Problem(message, str(record.path), f"stages.{name}"))
            continue
        entries = [e for e in manifest.entries if e.state in RERUN_STATES]
        elements = []
        for entry in entries:
            try:
                element = sweeps.resumed_element(entry, {})
            except ConfigError as err:
                problems += [_of_stage(p, name) for p in err.problems]
                continue
            problems += [_of_stage(p, name) for p in element_problems(element.config, element.data)]
            elements.append(element)
        if not ignore_memory_plan:
            memory = memory_preflight(elements)
            notes += [f"stage {name}: {n}" for n in memory.notes]
            problems += [_of_stage(p, name) for p in memory.problems]
        checked = preflight.plan(elements, manifest.name, sweeps.slurm_folder(manifest), need_controller=True)
        notes += [f"stage {name}: {n}" for n in checked.notes]
        problems += [_of_stage(p, name) for p in checked.problems]
        reruns.append(Rerun(name, manifest, entries, elements, checked.arrays))
    if problems:
        raise ConfigError(problems)
    return reruns


def _of_stage(problem: Problem, stage: str) -> Problem:
    return dataclasses.replace(problem, message=f"stage {stage}: {problem.message}")


def resume(record: PipelineManifest, reruns: list[Rerun]) -> None:
    """Submit each rerun stage after the rerun stages it waits for; on a refusal, cancel what this resume
    queued and record why (then raise)."""
    queued: list[Rerun] = []
    for rerun in reruns:
        stage = record.stage(rerun.name)
        waits = [j for r in queued if r.name in stage.after for j in record.stage(r.name).job_ids]
        arrays = [dataclasses.replace(a, params=with_dependency(a.params, waits)) for a in rerun.arrays]
        before = len(rerun.manifest.arrays)
        try:
            sweeps.submit_elements(rerun.manifest, rerun.elements, arrays=arrays)
        except ClusterError:
            cancel_accepted(rerun.manifest, before)  # a stage of several arrays: those sbatch took
            for done in queued:
                sweeps.cancel(done.manifest, [e.index for e in done.entries])
                record.stage(done.name).state = "CANCELLED"
            stage.state, stage.reason = "SUBMIT_FAILED", "sbatch refused the resume"
            record.save()
            raise
        stage.job_ids = [str(a["job_id"]) for a in rerun.manifest.arrays[before:]]
        stage.state, stage.reason = "QUEUED", None
        record.save()
        queued.append(rerun)
