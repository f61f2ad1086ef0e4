"""`hpcrl compare SWEEP [--metric M] [--by KEY] [--out DIR]`: a sweep's elements side by side.

The elements' states are refreshed from the scheduler first, as `hpcrl status` does. Writes report.md
(a row per element: swept values, state, last step, final and best value of the metric;
then each group's final value as mean and range) and curves.png (the metric against the step, one colour
per group, seeds as a mean with a min..max band) to DIR, default SWEEP/compare (hpcrl.launcher.compare).
Exit 0; 1 when no element has logged the metric yet; 2 for a bad sweep, key or output directory.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

from hpcrl.errors import printable
from hpcrl.launcher import sweeps
from hpcrl.launcher.compare import compare, headline_metric, write_report
from hpcrl.launcher.sweep_manifest import load_manifest

HELP = "Compare a sweep's elements: a markdown report and overlaid curves of one metric."


def add_arguments(parser) -> None:
    parser.add_argument("sweep", help="Sweep directory (printed by submit).")
    parser.add_argument(
        "--metric",
        type=Optional[str],
        default=None,
        help="Metric to compare (default: the stage's held-out headline, e.g. reward/heldout, dpo/heldout_accuracy).",
    )
    parser.add_argument(
        "--by", type=Optional[str], default=None, help="Swept key to group by (default: the first but seed)."
    )
    parser.add_argument(
        "--out", type=Optional[str], default=None, help="Output directory (default: SWEEP/compare)."
    )


def main(args) -> int:
    notes: list[str] = []
    manifest = sweeps.refresh(load_manifest(args.sweep), notes)  # the states as `hpcrl status` shows them
    metric = args.metric or headline_metric(manifest, notes)
    for note in notes:
        print(f"hpcrl: note: {printable(note)}", file=sys.stderr)
    comparison = compare(manifest, metric, args.by)
    out = Path(args.out) if args.out is not None else Path(manifest.sweep_dir) / "compare"
    report, plot = write_report(comparison, out)
    read = sum(1 for c in comparison.curves if c.values)
    print(f"[compare] {read}/{len(comparison.curves)} element(s) logged {printable(metric)} -> {report}")
    if plot is not None:
        print(f"[compare] plot {plot}")
    return 0 if read else 1
