"""One writer per run: an advisory lock on the run directory (and on the checkpoint root when it lies
elsewhere), held by group rank 0 of the job for the whole run.

Why: two `hpcrl run` of the same config share one run directory (the config id names it); both would
append to metrics.jsonl, overwrite launcher.json and commit into one checkpoint root, whose `latest`
and pruning assume a single writer. Two runs with one `checkpoint.dir` break `latest` the same way.

How: `fcntl.flock(LOCK_EX | LOCK_NB)` on `<dir>/writer.lock`. The kernel releases the lock when the
holder's last descriptor closes, so a SIGKILLed or crashed holder never leaves a stale lock behind
(no pid files to clean up, no "is that pid still alive" guess across hosts). The holder writes its host,
pid, Slurm job id and start time into the file, so a second writer is refused at once with a message
naming them. The file itself is never deleted (deleting a lock file races with a writer about to lock
it). On NFS, Linux implements flock with byte-range locks that the server arbitrates between clients.

The descriptor is opened close-on-exec: programs the holder starts do not inherit the lock; a child
forked without exec (multiprocessing "fork") shares it until it exits.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from hpcrl.errors import ConfigError, Problem

LOCK_FILE = "writer.lock"


class RunLocked(ConfigError):
    """Another process holds the writer lock of a run directory or checkpoint root (exit 2)."""


@dataclass(frozen=True)
class LockTarget:
    """A directory that must have a single writer, and the config key a refusal names."""

    directory: Path
    key: str


def lock_targets(run_dir: Path, checkpoint_dir: str | None) -> list[LockTarget]:
    """The run directory, plus the checkpoint root when it is not the run's own `checkpoints/` (inside
    the run directory the run lock already covers it)."""
    targets = [LockTarget(Path(run_dir), "run_dir")]
    if checkpoint_dir:
        root = Path(checkpoint_dir).absolute()
        if not root.resolve().is_relative_to(Path(run_dir).resolve()):
            targets.append(LockTarget(root, "checkpoint.dir"))
    return targets


@contextlib.contextmanager
def writer_lock(targets: list[LockTarget]) -> Iterator[None]:
    """Hold the writer lock of every target for the duration of the block (all or none: a refusal
    releases the ones already taken). Raises RunLocked naming the holder."""
    with contextlib.ExitStack() as stack:
        for target in targets:
            stack.enter_context(_locked(target))
        yield


@contextlib.contextmanager
def _locked(target: LockTarget) -> Iterator[None]:
    target.directory.mkdir(parents=True, exist_ok=True)
    path = target.directory / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)  # never O_TRUNC: the holder's info
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RunLocked(Problem(_refusal(path, _read_holder(fd)), key=target.key)) from None
        _write_holder(fd)
        yield
    finally:
        os.close(fd)  # releases the lock


def holder_info() -> dict[str, object]:
    """Who holds a lock: enough to find the process (host and pid) and the job it belongs to."""
    return {
        "host": os.environ.get("SLURMD_NODENAME") or socket.gethostname(),
        "pid": os.getpid(),
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
        "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def _write_holder(fd: int) -> None:
    data = json.dumps(holder_info()).encode()
    os.ftruncate(fd, 0)
    os.pwrite(fd, data, 0)


def _read_holder(fd: int) -> dict[str, object]:
    """The holder's info; empty when it has only just taken the lock (or the file is garbled)."""
    try:
        return json.loads(os.pread(fd, 4096, 0) or b"{}")
    except (OSError, ValueError):
        return {}


def _refusal(path: Path, holder: dict[str, object]) -> str:
    if holder.get("pid") is None:
        who = "another process (it has only just started)"
    else:
        job = f", Slurm job {holder['slurm_job_id']}" if holder.get("slurm_job_id") else ""
        who = f"pid {holder['pid']} on host {holder.get('host')} (since {holder.get('since')}{job})"
    return (
        f"{path.parent} is in use by another writer: {who}. One writer per run: wait for it to end or "
        f"stop it (lock file {path})"
    )
