"""The record an HF export carries of its own files: `<export>/hpcrl-export.json`, every file's size and
sha256, written last (hpcrl.ckpt.export), so that the next stage of a pipeline can tell a complete
export from a partial, altered or foreign one before it loads it (`verify_export`).

Why a file list and not only a checksum of the weights: transformers also reads config.json and the
tokenizer files, and an edited config.json (another vocabulary, another layer count) loads "fine" into
a different model. A file that is not listed (a stray `pytorch_model.bin` next to the safetensors, which
some loaders prefer) is refused too.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any

from hpcrl.config.safe_read import read_capped
from hpcrl.config.yaml_io import atomic_write

EXPORT_MANIFEST = "hpcrl-export.json"
VERSION = 1
CHUNK = 8 << 20
MAX_MANIFEST_BYTES = 1 << 20
RACY_NS = 2_000_000_000
"""A file modified less than this before a check is not stamped (coarse file-system clocks, NFS skew)."""


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.rglob("*") if p.is_file() and p.name != EXPORT_MANIFEST)


def write_export_manifest(directory: Path) -> None:
    """Record every file of `directory` (size, sha256): the last file an export writes."""
    files = {
        p.relative_to(directory).as_posix(): {"bytes": p.stat().st_size, "sha256": file_sha256(p)}
        for p in _files(directory)
    }
    atomic_write(directory / EXPORT_MANIFEST, json.dumps({"version": VERSION, "files": files}, indent=1))


def export_problem(directory: Path) -> str | None:
    """Why `directory` is not a complete, unaltered hpcrl export (None when it is): missing, no record,
    an unreadable record, a listed file missing or of another size or checksum, a file not listed, or a
    symlink (it may point anywhere). Every file is hashed (`check_export` can skip unchanged ones)."""
    return check_export(directory)[0]


def check_export(
    directory: Path, trusted: dict[str, Any] | None = None
) -> tuple[str | None, dict[str, list]]:
    """`export_problem`'s answer, and the stamps of the export's files when it has none: per file
    [size, mtime_ns, inode, the record's sha256]. A file whose stamp equals its `trusted` one (the stamps
    of an earlier check that passed) is not hashed again: a restarted consumer of a 140 GB export re-reads
    only what changed since (a file rewritten gets a new mtime or inode; one edited in place with its
    mtime set back by hand is the case this lets through). The record itself is read every time. A file
    modified within RACY_NS of the check gets no stamp (git's "racily clean" rule: a write in the same
    timestamp tick as the check would leave mtime as it was), so it is hashed again next time."""
    if not directory.is_dir():
        return f"{directory} is missing (the upstream stage wrote no export)", {}
    try:
        raw = read_capped(directory / EXPORT_MANIFEST, MAX_MANIFEST_BYTES, follow_symlinks=False)
        listed = json.loads(raw.decode("utf-8"))["files"]
        if not isinstance(listed, dict) or not all(isinstance(v, dict) for v in listed.values()):
            raise ValueError("files must map names to records")
    except FileNotFoundError:
        return f"{directory} has no {EXPORT_MANIFEST}: a partial export, or not one hpcrl wrote", {}
    except (OSError, ValueError, KeyError, TypeError, RecursionError) as err:
        return f"{directory / EXPORT_MANIFEST} is unreadable ({type(err).__name__})", {}
    present = {p.relative_to(directory).as_posix(): p for p in _files(directory)}
    links = [p for p in directory.rglob("*") if p.is_symlink()]
    if links:
        return f"{links[0]} is a symbolic link", {}
    extra = sorted(set(present) - set(listed))
    if extra:
        return f"{present[extra[0]]} is not one of the export's files (added after it was written)", {}
    trusted = trusted if isinstance(trusted, dict) else {}
    stamps: dict[str, list] = {}
    settled_before = time.time_ns() - RACY_NS
    for name, record in sorted(listed.items()):
        path = present.get(name)
        if path is None:
            return f"{directory / name} is missing (a partial export)", {}
        info = path.stat()
        stamp = [info.st_size, info.st_mtime_ns, info.st_ino, record.get("sha256")]
        unchanged = trusted.get(name) == stamp and info.st_size == record.get("bytes")
        if not unchanged and (
            info.st_size != record.get("bytes") or file_sha256(path) != record.get("sha256")
        ):
            return f"{path} is not the file the export wrote (size or sha256 differs: altered)", {}
        if info.st_mtime_ns < settled_before:
            stamps[name] = stamp
    return None, stamps
