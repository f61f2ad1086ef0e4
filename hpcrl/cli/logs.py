"""`hpcrl logs SWEEP INDEX`: the log of one element (rank 0's stdout and stderr)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from hpcrl.errors import ConfigError, Problem, printable
from hpcrl.launcher import local, slurm, sweeps
from hpcrl.launcher.sweep_manifest import load_manifest

HELP = "Print the log of one element of a sweep (rank 0 stdout/stderr)."


def add_arguments(parser) -> None:
    parser.add_argument("sweep", help="Sweep directory.")
    parser.add_argument("index", type=int, help="Element index.")


def log_files(manifest, index: int) -> list[Path]:
    entry = manifest.entry(index)
    if entry.job_id is None:
        raise ConfigError(Problem(f"element {index} was never submitted (state {entry.state})", key="index"))
    if manifest.executor == "local":
        return [local.log_path(Path(manifest.sweep_dir), index)]
    return slurm.log_paths(Path(manifest.sweep_dir) / sweeps.SLURM_DIR, entry.job_id)


def main(args) -> int:
    manifest = load_manifest(args.sweep)
    for path in log_files(manifest, args.index):
        print(f"==> {printable(str(path))} <==")
        print(terminal_text(_log_text(path)))
    return 0


def terminal_text(log: str) -> str:
    """A log as a terminal may be shown it: each line as it last read (a progress bar redraws it after a
    carriage return: the text after the last one; a CRLF line end is a line end), every other control
    character escaped ('\\x1b[2J' prints, it does not clear the screen: a job's output must not drive the
    reader's terminal)."""
    return "\n".join(printable(line.removesuffix("\r").rsplit("\r", 1)[-1]) for line in log.split("\n"))


def _log_text(path: Path) -> str:
    """A log's text; a FIFO or device in its place is named, never read (it would hang or never end)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return "(not written yet)"
    except OSError as err:
        return f"(cannot be read: {err.strerror or err})"
    with os.fdopen(fd, "rb") as file:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return "(not a regular file: not read)"
        return file.read().decode(errors="replace")
