"""`hpcrl status SWEEP`: each element's state, why (reason), restarts, and a summary.

States come from sacct, or, on a cluster without accounting, from squeue, `scontrol show job` and
submitit's result files (hpcrl.launcher.slurm.element_states; one line on stderr says so); locally from
the runner. The reason column: sbatch's error for SUBMIT_FAILED, the first line of the exception an
element raised, or Slurm's reason (a PENDING element's Resources, PartitionTimeLimit, ...).
"""

from __future__ import annotations

import json
import sys
from collections import Counter

from hpcrl.cli.common import cell
from hpcrl.cli.pipeline import status_pipeline
from hpcrl.errors import printable
from hpcrl.launcher import sweeps
from hpcrl.launcher.sweep_manifest import FINAL, load_manifest
from hpcrl.pipeline.manifest import is_pipeline_dir

HELP = "Show the state of every element of a sweep, and why, with a progress summary."
REASON_WIDTH = 60


def add_arguments(parser) -> None:
    parser.add_argument("sweep", help="Sweep or pipeline directory (printed by submit).")
    parser.add_argument("--json", action="store_true", help="Print one JSON object.")


def main(args) -> int:
    if is_pipeline_dir(args.sweep):
        return status_pipeline(args)
    notes: list[str] = []
    manifest = sweeps.refresh(load_manifest(args.sweep), notes)
    for note in notes:
        print(f"hpcrl: note: {printable(note)}", file=sys.stderr)
    counts = Counter(e.state for e in manifest.entries)
    if args.json:
        print(
            json.dumps(
                {
                    "sweep": manifest.sweep_dir,
                    "counts": dict(counts),
                    "elements": [
                        {
                            "index": e.index,
                            "config_id": e.config_id,
                            "job_id": e.job_id,
                            "state": e.state,
                            "reason": e.reason,
                            "restarts": sweeps.restart_count(e),
                            "run_dir": e.run_dir,
                        }
                        for e in manifest.entries
                    ],
                }
            )
        )
        return 0
    from rich.console import Console
    from rich.progress_bar import ProgressBar
    from rich.table import Table

    # Every cell is data read back from the manifest (hand-edited or not): escaped (cell), never markup.
    table = Table(title=cell(f"{manifest.name}: {manifest.sweep_dir}"))
    for column in ("index", "id", "job", "state", "reason", "restarts", *manifest.keys):
        table.add_column(cell(column), max_width=REASON_WIDTH if column == "reason" else None)
    for e in manifest.entries:
        table.add_row(
            *map(cell, (e.index, e.config_id, e.job_id or "-", e.state, e.reason or "-")),
            cell(sweeps.restart_count(e)),
            *(cell(e.swept.get(k, "")) for k in manifest.keys),
        )
    console = Console(width=200)
    console.print(table)
    done = sum(n for state, n in counts.items() if state in FINAL)
    total = len(manifest.entries)
    console.print(ProgressBar(total=total, completed=done, width=40))
    console.print()
    summary = ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))
    console.print(f"{done}/{total} finished: {summary}")
    return 0
