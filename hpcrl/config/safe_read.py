"""Read a file that someone else may have put there: a regular file only, and never more than a cap.

A path read from a sweep directory, a run directory or a model directory may name a FIFO (the open
blocks until a writer comes: forever), a device (/dev/zero reads without end) or a file far larger
than what the reader expects. `read_capped` opens with O_NONBLOCK (a FIFO's open returns at once),
checks with fstat that the file it opened is regular (no race between a stat and the open), and reads
at most `limit` + 1 bytes. Every refusal is an OSError, so callers that already treat an unreadable
file (OSError) as absent or as an error keep doing so. Used for sweep-directory files (hpcrl.launcher) and
an HF directory's config.json (hpcrl.train.hf_config).
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path


class UnsafeFile(OSError):
    """The path is not a regular file, or it is larger than the reader accepts."""


def read_capped(path: str | Path, limit: int, *, follow_symlinks: bool = True) -> bytes:
    """The bytes of the regular file `path`, at most `limit` of them (UnsafeFile when larger).

    OSError when it cannot be opened (FileNotFoundError included); UnsafeFile (an OSError) for a FIFO,
    a device, a directory or a socket, for a symlink when not `follow_symlinks` (a file inside a sweep
    directory hpcrl wrote itself is never one: a link there leads outside it), and for a file over
    `limit`. ValueError for a path with a NUL byte (as `open` raises)."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow_symlinks else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except OSError as err:
        if err.errno == errno.ELOOP and not follow_symlinks:
            raise UnsafeFile(errno.ELOOP, "is a symlink (refused here)", str(path)) from None
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UnsafeFile(errno.EINVAL, "is not a regular file", str(path))
        chunks, left = [], limit + 1
        while left > 0 and (chunk := os.read(fd, min(left, 1 << 24))):
            chunks.append(chunk)
            left -= len(chunk)
    finally:
        os.close(fd)
    if left <= 0:
        raise UnsafeFile(errno.EFBIG, f"is larger than {limit:,} bytes", str(path))
    return b"".join(chunks)


def read_text_capped(path: str | Path, limit: int, *, follow_symlinks: bool = True) -> str:
    """`read_capped`, decoded as UTF-8 (UnicodeDecodeError, a ValueError, when it is not)."""
    return read_capped(path, limit, follow_symlinks=follow_symlinks).decode("utf-8")
