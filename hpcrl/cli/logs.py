"""`hpcrl logs SWEEP INDEX`: the log of one element (rank 0's stdout and stderr)."""

from __future__ import annotations

from hpcrl.errors import printable
from hpcrl.launcher.element_logs import log_files, log_text, terminal_text
from hpcrl.launcher.sweep_manifest import load_manifest

HELP = "Print the log of one element of a sweep (rank 0 stdout/stderr)."


def add_arguments(parser) -> None:
    parser.add_argument("sweep", help="Sweep directory.")
    parser.add_argument("index", type=int, help="Element index.")


def main(args) -> int:
    manifest = load_manifest(args.sweep)
    for path in log_files(manifest, args.index):
        print(f"==> {printable(str(path))} <==")
        print(terminal_text(log_text(path)))
    return 0
