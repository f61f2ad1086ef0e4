"""`hpcrl cancel SWEEP [INDEX...]`: cancel some elements (or the whole sweep); the others keep running."""

from __future__ import annotations

import sys

from hpcrl.errors import printable
from hpcrl.launcher import sweeps
from hpcrl.launcher.sweep_manifest import load_manifest

HELP = "Cancel elements of a sweep (all when no index is given)."


def add_arguments(parser) -> None:
    parser.add_argument("sweep", help="Sweep directory.")
    parser.add_argument("indices", type=int, nargs="*", help="Element indices (default: all).")


def main(args) -> int:
    manifest = load_manifest(args.sweep)
    notes: list[str] = []
    chosen = sweeps.cancel(manifest, list(args.indices) or None, notes)
    for note in notes:
        print(f"hpcrl: note: {printable(note)}", file=sys.stderr)
    print(f"cancel requested for {len(chosen)} element(s): {' '.join(str(e.index) for e in chosen)}")
    return 0
