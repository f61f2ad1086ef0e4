"""`hpcrl resume SWEEP [--cluster.KEY VALUE ...]`: resubmit only the failed / cancelled / timed-out /
lost / never-submitted elements, as one new array job per resource shape.

Overrides fix how those elements run (`--cluster.cpus_per_task 8` after sbatch refused 12 per task):
cluster.* keys only (a run directory's checkpoints belong to its experiment; another experiment is a
new submit). Before anything is written or submitted, each element's config.yaml is verified against
the manifest's fingerprint (a symlink or an edited file is refused), the overrides are applied and
every rule a submit checks runs again: the config rules, the memory plan, and the preflight against the
live cluster. Then the new config.yaml replaces the old one in the element's run dir (same run dir,
checkpoints and logs), the manifest records the new fingerprint, and the new array's record the overrides.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from hpcrl.cli.common import add_override_arguments, overrides_from, print_notes
from hpcrl.cli.pipeline import resume_pipeline
from hpcrl.errors import ConfigError, Problem
from hpcrl.experiment.resolve import element_problems
from hpcrl.launcher import preflight, sweeps
from hpcrl.launcher.memory_preflight import memory_preflight
from hpcrl.launcher.sweep_manifest import Manifest, load_manifest
from hpcrl.pipeline.manifest import is_pipeline_dir

HELP = (
    "Resubmit the failed, cancelled, timed-out and lost elements of a sweep; --cluster.KEY VALUE "
    "corrects how they run."
)
OVERRIDES_HELP = """\
--cluster.<key> VALUE  change how the resubmitted elements run, e.g. --cluster.cpus_per_task 8
                       --cluster.time_min 120 (checked like a submit's; recorded in the manifest)"""


def add_arguments(parser) -> None:
    parser.add_argument("sweep", help="Sweep or pipeline directory.")
    parser.add_argument(
        "--ignore_memory_plan",
        action="store_true",
        help="Resubmit even when `hpcrl plan` predicts an element does not fit its device memory.",
    )
    add_override_arguments(parser, OVERRIDES_HELP)


def main(args) -> int:
    if is_pipeline_dir(args.sweep):
        return resume_pipeline(args)
    overrides = overrides_from(args)
    problems = sweeps.resume_override_problems(overrides)
    if problems:
        raise ConfigError(problems)
    notes: list[str] = []
    manifest = sweeps.refresh(load_manifest(args.sweep), notes)
    print_notes(notes)
    again = sweeps.resubmittable(manifest)
    if not again:
        _check_unused(manifest, overrides)
        unused = " (the overrides were not used)" if overrides else ""
        print(f"nothing to resume: no failed, cancelled, timed-out or lost element{unused}")
        return 0
    elements = []
    for entry in again:
        try:
            elements.append(sweeps.resumed_element(entry, overrides))
        except ConfigError as err:
            problems += err.problems
    if not problems:  # every rule a submit checks, on the configs as they will run
        for entry, element in zip(again, elements, strict=True):
            problems += [
                dataclasses.replace(
                    p, file="command line" if _overridden(p.key, overrides) else entry.config_path
                )
                for p in element_problems(element.config, element.data)
            ]
    if problems:
        raise ConfigError(problems)
    if not args.ignore_memory_plan:
        memory = memory_preflight(elements)
        print_notes(memory.notes)
        if memory.problems:
            hint = Problem("see `hpcrl plan`; --ignore_memory_plan resubmits anyway")
            raise ConfigError([*memory.problems, hint])
    arrays = None
    if manifest.executor == "slurm":
        checked = preflight.plan(elements, manifest.name, sweeps.slurm_folder(manifest), need_controller=True)
        print_notes(checked.notes)
        if checked.problems:
            raise ConfigError(checked.problems)
        arrays = checked.arrays
    # Every check passed: now write (new configs, then the manifest with the jobs).
    with sweeps.writing(None, "run_root"):
        for entry, element in zip(again, elements, strict=True):
            sweeps.rewrite_config(entry, element)
    manifest.save()
    before = len(manifest.arrays)
    sweeps.submit_elements(manifest, elements, arrays=arrays, overrides=overrides)
    changed = f" with {', '.join(f'{k}={v}' for k, v in overrides.items())}" if overrides else ""
    for array in manifest.arrays[before:]:
        print(
            f"resubmitted {len(array['indices'])} element(s) {array['indices']} as job {array['job_id']}{changed}"
        )
    return 0


SAMPLES = 100
"""How many elements `_check_unused` tries before it gives up on finding a readable config."""


def _check_unused(manifest: Manifest, overrides: dict[str, Any]) -> None:
    """Nothing to resume: the overrides are checked all the same (on the first element whose config
    reads), so a wrong value is exit 2 naming its key whatever the sweep's state, never a silent 0."""
    if not overrides:
        return
    for entry in manifest.entries[:SAMPLES]:
        try:
            element = sweeps.resumed_element(entry, overrides)
        except ConfigError as err:  # the element's own file: try another; the command line: refuse
            if mine := [p for p in err.problems if p.file == "command line"]:
                raise ConfigError(mine) from None
            continue
        problems = [
            dataclasses.replace(p, file="command line")
            for p in element_problems(element.config, element.data)
            if _overridden(p.key, overrides)
        ]
        if problems:
            raise ConfigError(problems)
        return
    raise ConfigError(
        [
            Problem(
                "cannot be checked: no element's config.yaml reads (nothing to resume)", "command line", k
            )
            for k in overrides
        ]
    )


def _overridden(key: str, overrides: dict) -> bool:
    """`key` was set on the command line, itself or inside a mapping given there (cluster.env.X)."""
    return any(key == k or key.startswith(f"{k}.") for k in overrides)
