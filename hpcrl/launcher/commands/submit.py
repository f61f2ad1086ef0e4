"""`hpcrl submit TEMPLATE [--dry-run] [overrides]`: write configs + manifest, submit the array job(s).

Non-blocking: prints the sweep directory and the job ids, then returns. --dry-run writes the configs,
the manifest and the exact sbatch script(s) and calls no sbatch.
"""

from __future__ import annotations

import sys
from pathlib import Path

from hpcrl.launcher.cli_common import add_template_arguments, overrides_from, print_config_if_asked

HELP = "Submit a template's sweep as array job(s) (non-blocking); --dry-run renders the sbatch script only."


def add_arguments(parser) -> None:
    add_template_arguments(parser)
    parser.add_argument(
        "--dry-run", action="store_true", help="Write configs and sbatch script(s); submit nothing."
    )
    parser.add_argument(
        "--sweep_dir", type=str, default=None, help="Sweep directory (default: under run_root)."
    )


def main(args) -> int:
    from hpcrl.config.resolve import resolve
    from hpcrl.launcher import slurm, sweeps

    overrides = overrides_from(args)
    sweep = resolve(args.template, overrides)
    if print_config_if_asked(args, sweep):
        return 0
    sweep_dir = Path(args.sweep_dir).absolute() if args.sweep_dir else sweeps.default_sweep_dir(sweep)
    executor = sweep.elements[0].config.cluster.executor
    if args.dry_run:
        try:
            limit = slurm.max_array_size()
        except Exception:  # noqa: BLE001 - a dry run must work without a reachable controller
            limit = slurm.DEFAULT_MAX_ARRAY_SIZE
        manifest = sweeps.prepare(sweep, sweep_dir, overrides)
        for entry in manifest.entries:
            entry.state = "DRY_RUN"
        manifest.save()
        scripts = sweeps.render_scripts(sweep, manifest, limit, sys.executable)
        print(f"sweep: {sweep_dir}")
        print(
            f"dry run: {len(sweep.elements)} config(s) written, {len(scripts)} sbatch script(s), nothing submitted"
        )
        for path, indices in scripts:
            print(f"# {path} (indices {indices[0]}..{indices[-1]})")
        if scripts:
            print(scripts[0][0].read_text())
        return 0
    # Ask the controller first: when Slurm is unreachable nothing is written at all.
    limit = slurm.max_array_size() if executor == "slurm" else None
    manifest = sweeps.prepare(sweep, sweep_dir, overrides)
    print(f"sweep: {sweep_dir}", flush=True)
    sweeps.submit_elements(manifest, sweep.elements, limit)
    for array in manifest.arrays:
        print(f"submitted {executor} job {array['job_id']}: {len(array['indices'])} element(s)")
    print(f"next: hpcrl status {sweep_dir}")
    return 0
