"""`hpcrl submit TEMPLATE [--dry-run] [overrides]`: write configs + manifest, submit the array job(s).

Non-blocking: prints the sweep directory and the job ids, then returns. Before anything is written,
every rule runs (config rules at resolve, the memory plan) and, on Slurm, the preflight against the
live cluster (hpcrl.launcher.preflight: partition, CPUs x memory x GRES per node, MaxTime, then
`sbatch --test-only`): a problem is one line naming its key, exit 2, nothing written or submitted;
no controller is exit 1 (a cluster error), nothing written.

--dry-run writes the configs, the manifest and the exact sbatch script of every array job inside the
sweep directory, prints every script (a sweep over resource shapes has several: each is shown, not
only the first) and calls no sbatch but `sbatch --test-only`. With a controller the scripts carry what
a submit sends (CPUs per task derived from the node) and the preflight's problems are printed as
warnings; without one, one line says so and the script is rendered with the fallbacks.
"""

from __future__ import annotations

import sys
from pathlib import Path

from hpcrl.cli.common import add_template_arguments, overrides_from, print_config_if_asked, print_notes
from hpcrl.cli.pipeline import submit_pipeline
from hpcrl.errors import ConfigError, Problem
from hpcrl.experiment.resolve import resolve
from hpcrl.launcher import preflight, sweeps
from hpcrl.launcher.memory_preflight import memory_preflight
from hpcrl.pipeline.spec import is_pipeline_file
from hpcrl.progress import DelayedProgress, Track

HELP = "Submit a template's sweep as array job(s) (non-blocking); --dry-run renders the sbatch script only."


def add_arguments(parser) -> None:
    add_template_arguments(parser)
    parser.add_argument(
        "--dry-run", action="store_true", help="Write configs and sbatch script(s); submit nothing."
    )
    parser.add_argument(
        "--sweep_dir",
        type=str,
        default=None,
        help="Sweep directory to create; null: a new one under <run_root>/<name>/sweeps/.",
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="Submit into a --sweep_dir that already holds a submitted sweep (its manifest is replaced).",
    )
    parser.add_argument(
        "--ignore_memory_plan",
        action="store_true",
        help="Submit even when `hpcrl plan` predicts an element does not fit its device memory.",
    )


def main(args) -> int:
    if is_pipeline_file(args.template):
        return submit_pipeline(args)
    with DelayedProgress() as track:
        return _submit(args, track)


def _submit(args, track: Track) -> int:
    """Check everything (nothing is written on a problem), then write the sweep and submit or render it."""
    overrides = overrides_from(args)
    sweep = resolve(args.template, overrides, track=track)
    if print_config_if_asked(args, sweep):
        return 0
    sweep_dir, key = _sweep_dir(args, sweep)
    if not args.ignore_memory_plan:
        memory = memory_preflight(sweep.elements, track)
        print_notes(memory.notes)
        if memory.problems:
            hint = Problem("see `hpcrl plan TEMPLATE`; --ignore_memory_plan submits anyway")
            raise ConfigError([*memory.problems, hint])
    executor = sweep.elements[0].config.cluster.executor
    if args.dry_run:
        return _dry_run(sweep, sweep_dir, key, overrides, track)
    arrays = None
    if executor == "slurm":  # ask the controller first: when Slurm is unreachable nothing is written at all
        checked = preflight.plan(
            track(sweep.elements, len(sweep.elements), "planning arrays"),
            sweep.name,
            sweep_dir / sweeps.SLURM_DIR,
            need_controller=True,
        )
        print_notes(checked.notes)
        if checked.problems:
            raise ConfigError(checked.problems)
        arrays = checked.arrays
    with sweeps.writing(sweep_dir, key):
        manifest = sweeps.prepare(sweep, sweep_dir, overrides, track=track)
    print(f"sweep: {sweep_dir}", flush=True)
    sweeps.submit_elements(manifest, sweep.elements, arrays=arrays)
    for array in manifest.arrays:
        print(f"submitted {executor} job {array['job_id']}: {len(array['indices'])} element(s)")
    print(f"next: hpcrl status {sweep_dir}")
    return 0


def _sweep_dir(args, sweep) -> tuple[Path, str]:
    """The checked sweep directory and the option that chose it (named in messages)."""
    if args.sweep_dir:
        sweep_dir, key = Path(args.sweep_dir).absolute(), "--sweep_dir"
    else:
        sweep_dir, key = sweeps.default_sweep_dir(sweep), "run_root"
    problems = sweeps.sweep_dir_problems(sweep_dir, key) or sweeps.existing_sweep_problems(
        sweep_dir, key, args.force
    )
    if not args.dry_run:  # a dry run writes inside the sweep directory only
        problems += sweeps.run_root_problems(sweeps.run_roots(sweep))
    if problems:
        raise ConfigError(problems)
    return sweep_dir, key


def _dry_run(sweep, sweep_dir: Path, key: str, overrides: dict, track: Track) -> int:
    """Write configs, manifest and every array job's script inside `sweep_dir`; print every script."""
    elements = len(sweep.elements)
    checked = preflight.plan(
        track(sweep.elements, elements, "planning arrays"),
        sweep.name,
        sweep_dir / sweeps.SLURM_DIR,
        need_controller=False,
        fit_to_cluster=sweep.elements[0].config.cluster.executor == "slurm",
    )
    print_notes(checked.notes)
    if checked.problems:
        print(
            f"hpcrl: warning: a submit would refuse this sweep ({len(checked.problems)} problem(s)):",
            file=sys.stderr,
        )
        for problem in checked.problems:
            print(f"  - {problem}", file=sys.stderr)
    with sweeps.writing(sweep_dir, key):
        sweeps.prepare(sweep, sweep_dir, overrides, dry_run=True, track=track)
        scripts = sweeps.render_scripts(checked.arrays, sweep_dir, sys.executable)
    print(f"sweep: {sweep_dir}")
    print(f"dry run: {elements} config(s) written, {len(scripts)} sbatch script(s), nothing submitted")
    for path, indices in scripts:
        print(f"# {path} (indices {indices[0]}..{indices[-1]})")
    for path, _ in scripts:
        print(f"# ----- {path}")
        print(path.read_text())
    return 0
