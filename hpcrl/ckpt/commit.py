"""The commit protocol on the checkpoint root directory.

    root/step_00000010.tmp-<token>/   being written (ignored by readers, removed by the next save)
    root/step_00000010/               committed: renamed from tmp after every file and the dir were fsynced
    root/latest                       "step_00000010" — replaced atomically (tmp + rename + fsync)
    root/step_00000004.trash-<token>/ being deleted by keep-last-k (ignored by readers)
    root/step_00000012.rejected-<UTC time>/  failed verification on a load that fell back past it: kept
                                      for inspection (the newest keep_rejected: `prune_rejected`), never
                                      read or committed over (`set_aside`)

A crash at any moment leaves `latest` naming a complete, committed directory (or no `latest` before
the first commit). Old checkpoints are deleted only after the new one committed and verified, and a
directory is first renamed out of the `step_N` namespace, so a half-deleted one is never trusted.
Readers treat `latest` as the newest step they may use (directories above it are an abandoned future);
without a usable `latest` (missing, empty, garbled) they consider every committed directory.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import stat
import threading
from datetime import datetime, timezone
from pathlib import Path

from hpcrl.ckpt.integrity import fsync_dir, write_durable
from hpcrl.ckpt.manifest import CheckpointError
from hpcrl.config.safe_read import read_text_capped

log = logging.getLogger(__name__)

LATEST = "latest"
REJECTED = ".rejected-"
_COMMITTED = re.compile(r"^step_(\d+)$")


def step_name(step: int) -> str:
    return f"step_{step:08d}"


def tmp_dir(root: Path, step: int, token: str) -> Path:
    return root / f"{step_name(step)}.tmp-{token}"


def committed(root: Path) -> list[tuple[int, Path]]:
    """Committed checkpoint directories under `root`, newest step first."""
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := _COMMITTED.match(p.name)) and p.is_dir()]
    return sorted(found, reverse=True)


def step_of(path: Path) -> int | None:
    """N of a `step_N` directory name, else None."""
    match = _COMMITTED.match(path.name)
    return int(match.group(1)) if match else None


LATEST_MAX_BYTES = 4096
"""`latest` holds one directory name (step_N)."""


def read_latest(root: Path) -> Path | None:
    """The directory `latest` names, or None when there is no usable `latest`: none yet, unreadable,
    empty, garbled, or naming anything but a real directory (absent, a plain file, a symlink: a loop, or
    a link out of the root, which the loader refuses anyway). A damaged root must stop neither a save
    nor a resume: readers then consider every committed directory (`candidates`, which says so)."""
    try:  # O_NONBLOCK and regular files only: a FIFO named `latest` would block a plain read forever
        name = read_text_capped(root / LATEST, LATEST_MAX_BYTES).strip()
    except (OSError, ValueError):  # missing, a directory, a FIFO, a loop, too long, not UTF-8
        return None
    if not _COMMITTED.match(name) or not _real_dir(root / name):
        return None
    return root / name


def _real_dir(path: Path) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def candidates(root: Path) -> list[Path]:
    """Committed directories a reader may try, newest first: `latest`'s target and older ones (never one
    newer than `latest`: `remove_leftovers`); all of them when there is no usable `latest`."""
    latest = read_latest(root)
    if latest is None and os.path.lexists(root / LATEST):
        log.warning("%s: names no step directory; trying every committed checkpoint", root / LATEST)
    bound = None if latest is None else _step(latest)
    return [p for step, p in committed(root) if bound is None or step <= bound]


def set_aside(path: Path) -> Path:
    """Rename a checkpoint that failed verification to `<name>.rejected-<UTC time>`: out of the `step_N`
    namespace (a rerun that reaches step N again commits it anew), kept on disk for inspection."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")
    target = path.with_name(f"{path.name}{REJECTED}{stamp}")
    os.rename(path, target)
    fsync_dir(path.parent)
    return target


def publish(root: Path, directory: Path) -> None:
    """Point `latest` at `directory` (atomically, durably): after a commit, or after a load that set
    newer checkpoints aside, so that the directories above it are again an abandoned future."""
    write_durable(root / LATEST, (directory.name + "\n").encode())


def commit(tmp: Path, root: Path, step: int) -> Path:
    """Rename a fully written and fsynced tmp dir to step_N and point `latest` at it."""
    final = root / step_name(step)
    if final.exists():
        raise CheckpointError(f"{final}: step {step} is already committed; refusing to overwrite it")
    fsync_dir(tmp)
    os.rename(tmp, final)
    fsync_dir(root)
    publish(root, final)
    return final


def prune(root: Path, keep_last: int, token: str, *, background: bool = False) -> list[Path]:
    """Delete all but the newest `keep_last` committed checkpoints (never `latest`'s target).

    Each goes first to a `.trash-` name (one atomic rename: from then on no reader sees it), then its
    files are deleted. With `background` the deletion runs in a daemon thread: unlinking a large file
    costs ~25 ms per 128 MiB on ext4 (seconds on parallel filesystems), and a sync save should not wait
    for it. Trash that outlives the process is removed before the next save (`remove_leftovers`)."""
    latest = read_latest(root)
    removed, trash = [], []
    for index, (step, path) in enumerate(committed(root)):
        if index < keep_last or path == latest:
            continue
        trash.append(root / f"{step_name(step)}.trash-{token}")
        os.rename(path, trash[-1])
        fsync_dir(root)
        removed.append(path)
    if background and trash:
        threading.Thread(target=_delete_all, args=(trash,), name="hpcrl-ckpt-prune", daemon=True).start()
    else:
        _delete_all(trash)
    return removed


def prune_rejected(root: Path, keep: int) -> list[Path]:
    """Delete all but the newest `keep` rejected checkpoints (`set_aside`'s `<name>.rejected-<UTC time>`;
    newest by that time, whatever step they were). Returns the ones deleted."""
    if not root.is_dir():
        return []
    rejected = [p for p in root.iterdir() if REJECTED in p.name and p.is_dir() and not p.is_symlink()]
    rejected.sort(key=lambda p: p.name.rpartition(REJECTED)[2], reverse=True)  # the stamp sorts as text
    removed = rejected[keep:]
    _delete_all(removed)
    return removed


def _delete_all(paths: list[Path]) -> None:
    for path in paths:
        shutil.rmtree(path, ignore_errors=True)


def remove_leftovers(root: Path, keep: Path | None = None) -> None:
    """Before a save: remove tmp dirs of interrupted saves, trash of interrupted prunes (never `keep`), and
    committed dirs newer than `latest` — a crash between their rename and the `latest` update left them
    unpublished, and the run resumed from `latest`, so they belong to an abandoned future."""
    if not root.is_dir():
        return
    latest = read_latest(root)
    if latest is not None:
        for step, path in committed(root):
            if step > _step(latest):
                trash = path.with_name(f"{path.name}.trash-unpublished")
                os.rename(path, trash)
                fsync_dir(root)
    for path in root.iterdir():
        if path != keep and (".tmp-" in path.name or ".trash-" in path.name) and path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        elif path.name == LATEST + ".tmp":
            path.unlink(missing_ok=True)


def _step(path: Path) -> int:
    return int(_COMMITTED.match(path.name).group(1))
