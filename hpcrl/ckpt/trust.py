"""What a loader may read: the checkpoint directory is a trust boundary.

A manifest and its files may come from anywhere (a copied run, a damaged disk, another tool), so before
any byte of a tensor is copied every rule below holds; a broken one is a `CorruptCheckpoint` naming the
file (and the dataset) and the rule, which the loader treats like any other corruption (fallback).
The loader (`hpcrl.ckpt.load`) and `hpcrl ckpt check` (`hpcrl.ckpt.verify.verify_directory`) share them.

Paths:
- a step directory found under a checkpoint root is a real directory there, not a symbolic link;
- its `manifest.json` and every file the manifest names are regular files directly in that directory:
  plain names (letters, digits, `_`, `.`, `-`; no `/`, no `..`, not absolute), no symbolic links;
- the manifest of a directory named `step_N` is the manifest of step N;
- each file is the file of a rank that saved it (`rank_NNNNN.h5`, rank below world_size).
HDF5 (each dataset about to be read):
- a plain name in the file's root group, reached by a hard link (no soft or external link);
- a dataset stored in the same file: not virtual (VDS), no external raw storage, contiguous or chunked
  layout (not compact), no filters, every chunk written (never fill values);
- its dtype is the manifest dtype's storage dtype (byte order included) and its shape the shard's shape;
- when the manifest records its byte offset (the writer always does), it is contiguous data at exactly
  that offset and size, so the checksum segments of that range are its bytes. A dataset without one
  lies in bytes no dataset claims; its file is then verified whole (`check_datasets` says which).
"""

from __future__ import annotations

import math
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np
from h5py import h5d

from hpcrl.ckpt.commit import candidates, step_of
from hpcrl.ckpt.manifest import MANIFEST, CorruptCheckpoint, Manifest, rank_of_file
from hpcrl.ckpt.shards import storage_dtype

_PLAIN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
"""A file or dataset name the writer could have made; anything else is refused before it is looked up."""


def checkpoint_dirs(path: Path) -> tuple[list[Path], Path | None]:
    """(directories to try, newest first; the root they were found under, or None when `path` is itself
    a checkpoint directory, which the caller named explicitly)."""
    if os.path.lexists(path / MANIFEST):
        return [path], None
    return candidates(path), path


def check_step_dir(directory: Path, root: Path | None) -> None:
    """A step directory found under `root` is a real directory there (not a link to elsewhere), and its
    manifest is a regular file in it (a missing manifest is left to `read_manifest` to report)."""
    if root is not None and directory.is_symlink():
        raise CorruptCheckpoint(
            f"{directory}: a symbolic link (to {os.readlink(directory)}); a step directory must be a "
            f"real directory inside the checkpoint root {root}"
        )
    _regular_or_absent(directory / MANIFEST)


def check_manifest(directory: Path, manifest: Manifest) -> None:
    """The names the manifest asks to look up are plain and local, and say the same step as `directory`."""
    step = step_of(directory)
    if step is not None and step != manifest.step:
        raise CorruptCheckpoint(
            f"{directory / MANIFEST}: says step {manifest.step}, but its directory is {directory.name}"
        )
    for file, entry in manifest.files.items():
        if not _PLAIN.fullmatch(file):
            raise CorruptCheckpoint(
                f"{directory / MANIFEST}: file name {file!r} is not a plain name inside the step directory"
            )
        rank = rank_of_file(file)
        if rank is None or rank >= manifest.world_size:
            raise CorruptCheckpoint(
                f"{directory / MANIFEST}: file {file!r} is not the file of a rank below world_size "
                f"{manifest.world_size} (the ranks that saved it)"
            )
        for dataset in entry.byte_offsets:
            _check_dataset_name(directory / file, dataset)
        _regular_or_absent(directory / file)
    for name, tensor in manifest.tensors.items():
        for shard in tensor.shards:
            _check_dataset_name(
                directory / shard.file, shard.dataset, f" (tensor {name}{shard.box.describe()})"
            )


def _check_dataset_name(path: Path, dataset: str, label: str = "") -> None:
    if not _PLAIN.fullmatch(dataset):
        raise CorruptCheckpoint(
            f"{path}: dataset name {dataset!r}{label} is not a plain name in the root group"
        )


def _regular_or_absent(path: Path) -> None:
    """`path` is a regular file (not a link, device, FIFO or directory), or does not exist."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if stat.S_ISLNK(mode):
        raise CorruptCheckpoint(
            f"{path}: a symbolic link (to {os.readlink(path)}); checkpoint files must be regular files "
            f"inside the step directory"
        )
    if not stat.S_ISREG(mode):
        raise CorruptCheckpoint(f"{path}: not a regular file")


@dataclass(frozen=True)
class Expected:
    """What the manifest says one dataset is."""

    label: str
    """'tensor[box]' for messages."""
    shape: tuple[int, ...]
    dtype: np.dtype
    manifest_dtype: str
    offset: int | None
    """Recorded byte offset of its data (None: not recorded)."""
    nbytes: int


def expected_datasets(manifest: Manifest, file: str, wanted: set[str] | None) -> dict[str, Expected]:
    """Dataset -> what it must be, for the non-empty shards in `file` (of the `wanted` datasets; None: all)."""
    offsets = manifest.files[file].byte_offsets
    out = {}
    for name, tensor in manifest.tensors.items():
        for shard in tensor.shards:
            if (
                shard.file != file
                or not shard.box.numel
                or (wanted is not None and shard.dataset not in wanted)
            ):
                continue
            dtype = storage_dtype(tensor.dtype)
            out[shard.dataset] = Expected(
                f"{name}{shard.box.describe()}",
                shard.shape,
                dtype,
                tensor.dtype,
                offsets.get(shard.dataset),
                shard.box.numel * dtype.itemsize,
            )
    return out


def check_datasets(directory: Path, manifest: Manifest, needs: dict[str, set[str] | None]) -> set[str]:
    """Check the HDF5 structure of the `needs` datasets (file -> dataset names; None: all of the file's)
    against the manifest. Returns the files holding a dataset whose byte offset the manifest does not
    record: their checksum segments do not map to it, so the caller verifies those files whole."""
    whole = set()
    for file in sorted(needs):
        path = directory / file
        expected = expected_datasets(manifest, file, needs[file])
        if not expected:
            continue
        try:
            fh = h5py.File(path, "r")
        except OSError as err:
            raise CorruptCheckpoint(f"{path}: not a readable HDF5 file ({err})") from None
        with fh:
            for dataset, expect in sorted(expected.items()):
                check_dataset(path, fh, dataset, expect)
                if expect.offset is None:
                    whole.add(file)
    return whole


def check_dataset(path: Path, fh: h5py.File, name: str, expect: Expected) -> None:
    """One dataset against the HDF5 rules of the module docstring."""
    where = f"{path}: dataset {name!r} (tensor {expect.label})"
    link = fh.get(name, getlink=True)
    if link is None:
        raise CorruptCheckpoint(f"{where}: missing")
    if not isinstance(link, h5py.HardLink):
        raise CorruptCheckpoint(
            f"{where}: is a {type(link).__name__}; datasets must be stored in the file itself"
        )
    dset = fh[name]
    if not isinstance(dset, h5py.Dataset):
        raise CorruptCheckpoint(f"{where}: is a {type(dset).__name__}, not a dataset")
    _check_storage(where, dset, expect)
    if dset.dtype != expect.dtype:
        raise CorruptCheckpoint(
            f"{where}: dtype {dset.dtype.str} in the file, the manifest says {expect.manifest_dtype} "
            f"(stored as {expect.dtype.str})"
        )
    if dset.shape != expect.shape:
        raise CorruptCheckpoint(f"{where}: shape {dset.shape} in the file, the manifest says {expect.shape}")
    if expect.offset is not None:
        _check_offset(where, dset, expect)


def _check_storage(where: str, dset: h5py.Dataset, expect: Expected) -> None:
    """Stored in this file, as plain contiguous or chunked data, all of it written."""
    if dset.is_virtual:
        raise CorruptCheckpoint(
            f"{where}: a virtual dataset (VDS); datasets must be stored in the file itself"
        )
    if dset.external:
        raise CorruptCheckpoint(
            f"{where}: external raw storage in {dset.external[0][0]!r}; datasets must be stored in the file itself"
        )
    plist = dset.id.get_create_plist()
    layout = plist.get_layout()
    if layout not in (h5d.CONTIGUOUS, h5d.CHUNKED):
        name = {h5d.COMPACT: "compact", h5d.VIRTUAL: "virtual"}.get(layout, str(layout))
        raise CorruptCheckpoint(f"{where}: {name} layout; datasets must be contiguous or chunked")
    if plist.get_nfilters():
        raise CorruptCheckpoint(
            f"{where}: stored through {plist.get_nfilters()} filter(s); the format has none"
        )
    if layout == h5d.CHUNKED:
        chunks = math.prod(-(-n // c) for n, c in zip(dset.shape, dset.chunks, strict=True))
        if dset.id.get_num_chunks() != chunks:
            raise CorruptCheckpoint(
                f"{where}: {dset.id.get_num_chunks()} of its {chunks} chunks written (the rest would read as fill)"
            )
    elif dset.id.get_offset() is None:
        raise CorruptCheckpoint(f"{where}: its storage was never written (it would read as fill)")


def _check_offset(where: str, dset: h5py.Dataset, expect: Expected) -> None:
    """The data lies exactly in the byte range the manifest records (and its checksums cover)."""
    offset = dset.id.get_offset()  # None for chunked data
    size = dset.id.get_storage_size()
    if offset != expect.offset or size != expect.nbytes:
        raise CorruptCheckpoint(
            f"{where}: data at byte {offset} ({size} bytes), the manifest records byte {expect.offset} "
            f"({expect.nbytes} bytes)"
        )
