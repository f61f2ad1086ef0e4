"""`hpcrl cancel SWEEP [INDEX...]`: cancel some elements (or the whole sweep); the others keep running."""

from __future__ import annotations

import sys

from hpcrl.cli.pipeline import cancel_pipeline
from hpcrl.errors import ConfigError, Problem, printable
from hpcrl.launcher import sweeps
from hpcrl.launcher.sweep_manifest import load_manifest
from hpcrl.pipeline.manifest import is_pipeline_dir

HELP = "Cancel elements of a sweep (all when no index is given), or stages of a pipeline (--stage)."


def add_arguments(parser) -> None:
    parser.add_argument("sweep", help="Sweep directory.")
    parser.add_argument("indices", type=int, nargs="*", help="Element indices (default: all).")
    parser.add_argument(
        "--stage",
        default=None,
        help="A pipeline directory: cancel this stage and every stage downstream of it (default: all).",
    )


def main(args) -> int:
    if is_pipeline_dir(args.sweep):
        return cancel_pipeline(args)
    if args.stage is not None:
        raise ConfigError(Problem("--stage names a stage of a pipeline directory", key="--stage"))
    manifest = load_manifest(args.sweep)
    notes: list[str] = []
    chosen = sweeps.cancel(manifest, list(args.indices) or None, notes)
    for note in notes:
        print(f"hpcrl: note: {printable(note)}", file=sys.stderr)
    print(f"cancel requested for {len(chosen)} element(s): {' '.join(str(e.index) for e in chosen)}")
    return 0
