"""An element's log (rank 0's stdout and stderr), found by its index in the sweep's manifest and never by
a path from the caller, and shown as a terminal would show it: `hpcrl logs` prints it, `hpcrl serve`
shows its tail."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from hpcrl.errors import ConfigError, Problem, printable
from hpcrl.launcher import local, slurm, sweeps
from hpcrl.launcher.sweep_manifest import Manifest


def log_files(manifest: Manifest, index: int) -> list[Path]:
    """The log files of element `index` (ConfigError naming `index` when it was never submitted)."""
    entry = manifest.entry(index)
    if entry.job_id is None:
        raise ConfigError(Problem(f"element {index} was never submitted (state {entry.state})", key="index"))
    if manifest.executor == "local":
        return [local.log_path(Path(manifest.sweep_dir), index)]
    return slurm.log_paths(Path(manifest.sweep_dir) / sweeps.SLURM_DIR, entry.job_id)


def terminal_text(log: str) -> str:
    """A log as a terminal may be shown it: each line as it last read (a progress bar redraws it after a
    carriage return: the text after the last one; a CRLF line end is a line end), every other control
    character escaped ('\\x1b[2J' prints, it does not clear the screen: a job's output must not drive the
    reader's terminal)."""
    return "\n".join(printable(line.removesuffix("\r").rsplit("\r", 1)[-1]) for line in log.split("\n"))


def log_text(path: Path, tail_bytes: int | None = None) -> str:
    """A log's text (its last `tail_bytes` only, from a line start, when given); a FIFO or device in its
    place is named, never read (it would hang or never end)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return "(not written yet)"
    except OSError as err:
        return f"(cannot be read: {err.strerror or err})"
    with os.fdopen(fd, "rb") as file:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return "(not a regular file: not read)"
        if tail_bytes is None or info.st_size <= tail_bytes:
            return file.read().decode(errors="replace")
        file.seek(info.st_size - tail_bytes)
        return file.read().split(b"\n", 1)[-1].decode(errors="replace")
