"""`hpcrl expand PIPELINE.yaml` and `hpcrl run PIPELINE.yaml`: the template commands on a pipeline file
(hpcrl.pipeline: a YAML file with a top-level `stages:` mapping).

expand: every stage resolved and checked (all problems of all stages at once, exit 2), then one table
per stage, in dependency order, with the stages it waits for; --json: one object per element with its
stage. run: the stages in dependency order on this machine, each element in the foreground as
`hpcrl run` runs one (its runner handed in by hpcrl.cli.run); the chain stops at the first element that does not exit 0 (its exit code), and
each stage's headline figure is printed when it ends.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

from hpcrl.cli.common import cell, element_record, overrides_from, print_notes
from hpcrl.errors import ConfigError, Problem
from hpcrl.experiment.elements import ResolvedConfig
from hpcrl.experiment.stage_kinds import STAGE_KINDS
from hpcrl.launcher import sweeps
from hpcrl.launcher.inputs import write_inputs
from hpcrl.metrics.sinks import step_records
from hpcrl.pipeline import submit
from hpcrl.pipeline.manifest import load_pipeline_manifest
from hpcrl.pipeline.plan import Pipeline, PlannedStage, plan_pipeline
from hpcrl.pipeline.rerun import cancel_stages, plan_resume, resume
from hpcrl.pipeline.status import pipeline_status
from hpcrl.progress import DelayedProgress


def _planned(args) -> Pipeline:
    if getattr(args, "print_config", None) is not None:
        message = "--print_config shows one template's config: expand the pipeline, or the stage's template"
        raise ConfigError(Problem(message, key="--print_config"))
    with DelayedProgress() as track:
        return plan_pipeline(args.template, overrides_from(args), track=track)


def expand_pipeline(args) -> int:
    pipeline = _planned(args)
    if getattr(args, "json", False):
        for stage in pipeline.stages:
            for e in stage.sweep.elements:
                record = {"stage": stage.name, "after": list(stage.spec.after), **element_record(e)}
                sys.stdout.write(json.dumps(record) + "\n")
        return 0
    from rich.console import Console

    console = Console(width=200)
    console.print(
        cell(f"{pipeline.spec.path}: pipeline {pipeline.spec.name}, {len(pipeline.stages)} stage(s)")
    )
    for stage in pipeline.stages:
        waits = f", after {', '.join(stage.spec.after)}" if stage.spec.after else ""
        console.print(
            cell(f"stage {stage.name}: {stage.sweep.template}, {len(stage.sweep.elements)} config(s){waits}")
        )
        console.print(_table(stage))
    return 0


def _table(stage: PlannedStage):
    from rich.table import Table

    sweep = stage.sweep
    table = Table()
    for column in ("index", "id", *sweep.keys, "run dir"):
        table.add_column(cell(column), justify="right" if column == "index" else "left")
    for e in sweep.elements:
        cells = (cell(e.swept.get(k, "")) for k in sweep.keys)
        table.add_row(str(e.index), e.config_id, *cells, cell(str(e.run_dir)))
    return table


def run_pipeline(args, run_element: Callable[[ResolvedConfig], int]) -> int:
    if getattr(args, "index", None) is not None:
        message = "a pipeline runs every element of every stage; --index picks one of a template's"
        raise ConfigError(Problem(message, key="--index"))
    pipeline = _planned(args)
    for stage in pipeline.stages:
        print(
            f"== stage {stage.name} ({stage.sweep.template}): {len(stage.sweep.elements)} element(s)",
            flush=True,
        )
        for element in stage.sweep.elements:
            if stage.inputs:  # what it takes from upstream, bound and verified when it starts
                with sweeps.writing(None, "run_root"):
                    element.run_dir.mkdir(parents=True, exist_ok=True)
                    write_inputs(element.run_dir, stage.inputs)
            code = run_element(element)
            if code != 0:
                print(
                    f"stage {stage.name}: element {element.index} exited {code}; the chain stops",
                    file=sys.stderr,
                )
                return code
        for line in headline_lines(stage):
            print(line, flush=True)
    return 0


def headline_lines(stage: PlannedStage) -> list[str]:
    """Per element: the stage's held-out headline figure, first and last evaluation, and those logged
    beside it (Headline.heldout_also: an RL stage's task-rule score, a reward model's term)."""
    lines = []
    for element in stage.sweep.elements:
        headline = STAGE_KINDS[element.config.stage].headline
        path = element.run_dir / "metrics.jsonl"
        rows = list(step_records(path.read_bytes().splitlines())) if path.is_file() else []  # torn: skipped
        figures = []
        for key in (headline.heldout, *headline.heldout_also):
            held = [r[key] for r in rows if isinstance(r.get(key), int | float)]
            if held or key == headline.heldout:
                figures.append(f"{key}: {held[0]:.3f} -> {held[-1]:.3f}" if held else f"{key}: not logged")
        lines.append(f"stage {stage.name} [{element.index}] " + ", ".join(figures))
    return lines


def submit_pipeline(args) -> int:
    """`hpcrl submit PIPELINE.yaml`: check every stage, write the pipeline directory, sbatch each stage
    after its upstream ones (hpcrl.pipeline.submit); --dry-run writes and prints every stage's script."""
    if getattr(args, "force", False):
        raise ConfigError(
            Problem("a pipeline directory is never replaced: choose another --sweep_dir", key="--force")
        )
    pipeline = _planned(args)
    if args.sweep_dir:
        pipeline_dir, key = Path(args.sweep_dir).absolute(), "--sweep_dir"
    else:
        pipeline_dir, key = submit.default_pipeline_dir(pipeline), "run_root"
    problems = submit.pipeline_dir_problems(pipeline_dir, key)
    if not args.dry_run:
        roots = {root for stage in pipeline.stages for root in sweeps.run_roots(stage.sweep)}
        problems += sweeps.run_root_problems(roots)
    if problems:
        raise ConfigError(problems)
    with DelayedProgress() as track:
        checked, notes = submit.check(
            pipeline,
            pipeline_dir,
            dry_run=args.dry_run,
            ignore_memory_plan=args.ignore_memory_plan,
            track=track,
        )
        print_notes(notes)
        with sweeps.writing(pipeline_dir, key):
            record, manifests = submit.write(pipeline, pipeline_dir, dry_run=args.dry_run, track=track)
            scripts = submit.render_scripts(record, checked, sys.executable) if args.dry_run else []
    print(f"pipeline: {pipeline_dir}", flush=True)
    if args.dry_run:
        print(f"dry run: {len(pipeline.stages)} stage(s), {len(scripts)} sbatch script(s), nothing submitted")
        for name, path in scripts:
            print(f"# ----- stage {name}: {path}")
            print(path.read_text())
        return 0
    submit.submit(record, manifests, checked)
    for stage in record.stages:
        waits = f" after {', '.join(stage.after)}" if stage.after else ""
        print(f"stage {stage.name}: job(s) {', '.join(stage.job_ids)}{waits}")
    print(f"next: hpcrl status {pipeline_dir}")
    return 0


def status_pipeline(args) -> int:
    """`hpcrl status PIPELINE_DIR`: each stage's state and why, then its elements' table."""
    record = load_pipeline_manifest(args.sweep)
    notes: list[str] = []
    stages = pipeline_status(record, notes)
    print_notes(sorted(set(notes)))
    if args.json:
        out = {"pipeline": record.pipeline_dir, "name": record.name, "stages": []}
        for stage in stages:
            entries = stage.manifest.entries if stage.manifest else []
            out["stages"].append(
                {
                    "name": stage.name,
                    "after": stage.after,
                    "state": stage.state,
                    "reason": stage.reason,
                    "job_ids": record.stage(stage.name).job_ids,
                    "counts": stage.counts,
                    "elements": [
                        {
                            "index": e.index,
                            "job_id": e.job_id,
                            "state": e.state,
                            "reason": e.reason,
                            "run_dir": e.run_dir,
                        }
                        for e in entries
                    ],
                }
            )
        print(json.dumps(out))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title=cell(f"pipeline {record.name}: {record.pipeline_dir}"))
    for column in ("stage", "after", "jobs", "state", "reason", "elements"):
        table.add_column(cell(column), max_width=60 if column == "reason" else None)
    for stage in stages:
        summary = ", ".join(f"{n} {state}" for state, n in sorted(stage.counts.items())) or "-"
        jobs = ", ".join(record.stage(stage.name).job_ids) or "-"
        table.add_row(
            *map(
                cell,
                (stage.name, ", ".join(stage.after) or "-", jobs, stage.state, stage.reason or "-", summary),
            )
        )
    Console(width=200).print(table)
    return 0


def cancel_pipeline(args) -> int:
    """`hpcrl cancel PIPELINE_DIR [--stage NAME]`: that stage and everything downstream (default: all)."""
    if args.indices:
        raise ConfigError(
            Problem("a pipeline is cancelled by stage (--stage NAME), not by index", key="indices")
        )
    record = load_pipeline_manifest(args.sweep)
    if args.stage is not None and args.stage not in [s.name for s in record.stages]:
        names = ", ".join(s.name for s in record.stages)
        raise ConfigError(Problem(f"no stage {args.stage!r} in this pipeline ({names})", key="--stage"))
    names = cancel_stages(record, args.stage)
    print(f"cancel requested for stage(s): {', '.join(names)}")
    return 0


def resume_pipeline(args) -> int:
    """`hpcrl resume PIPELINE_DIR`: the stages that did not complete and everything downstream of them."""
    if overrides_from(args):
        message = "a pipeline resumes as submitted: resume a stage's own directory to change how it runs"
        raise ConfigError(Problem(message, key="command line"))
    record = load_pipeline_manifest(args.sweep)
    notes: list[str] = []
    reruns = plan_resume(record, notes, ignore_memory_plan=args.ignore_memory_plan)
    print_notes(sorted(set(notes)))
    if not reruns:
        print("nothing to resume: every stage completed")
        return 0
    resume(record, reruns)
    for rerun in reruns:
        stage = record.stage(rerun.name)
        waits = f" after {', '.join(stage.after)}" if stage.after else ""
        print(
            f"stage {stage.name}: {len(rerun.elements)} element(s) resubmitted as job(s) {', '.join(stage.job_ids)}{waits}"
        )
    print(f"next: hpcrl status {record.pipeline_dir}")
    return 0
