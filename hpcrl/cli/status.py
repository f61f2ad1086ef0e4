"""`hpcrl status SWEEP`: each element's state (sacct, or the local runner), restarts, and a summary."""

from __future__ import annotations

import json
from collections import Counter

HELP = "Show the state of every element of a sweep (from sacct) with a progress summary."


def add_arguments(parser) -> None:
    parser.add_argument("sweep", help="Sweep directory (printed by submit).")
    parser.add_argument("--json", action="store_true", help="Print one JSON object.")


def main(args) -> int:
    from hpcrl.launcher import sweeps
    from hpcrl.launcher.manifest import FINAL, load_manifest

    manifest = sweeps.refresh(load_manifest(args.sweep))
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

    table = Table(title=f"{manifest.name}: {manifest.sweep_dir}")
    for column in ("index", "id", "job", "state", "restarts", *manifest.keys):
        table.add_column(column)
    for e in manifest.entries:
        table.add_row(
            str(e.index),
            e.config_id,
            e.job_id or "-",
            e.state,
            str(sweeps.restart_count(e)),
            *(str(e.swept.get(k, "")) for k in manifest.keys),
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
