"""Verify a checkpoint directory against its manifest before any tensor is used.

Errors name the file and the tensor whose bytes are affected, e.g.
``step_00000010/rank_00001.h5: checksum mismatch in bytes [6144, 6656): tensor w[0:8,0:16]``.
"""

from __future__ import annotations

import os
from pathlib import Path

from hpcrl.ckpt.integrity import algorithm_of, hash_segments
from hpcrl.ckpt.manifest import MANIFEST, CorruptCheckpoint, Manifest, read_manifest
from hpcrl.ckpt.shards import itemsize
from hpcrl.ckpt.state import check_rng
from hpcrl.ckpt.trust import check_datasets, check_manifest, check_step_dir


def dataset_ranges(manifest: Manifest, file: str) -> dict[str, tuple[int, int, str]]:
    """Dataset -> (start byte, stop byte, 'tensor[box]') for every non-empty shard stored in `file`."""
    offsets = manifest.files[file].byte_offsets
    ranges = {}
    for name, tensor in manifest.tensors.items():
        for shard in tensor.shards:
            if shard.file == file and shard.dataset in offsets:
                start = offsets[shard.dataset]
                ranges[shard.dataset] = (
                    start,
                    start + shard.box.numel * itemsize(tensor.dtype),
                    f"{name}{shard.box.describe()}",
                )
    return ranges


def segment_owners(manifest: Manifest, file: str) -> list[str | None]:
    """For each checksum segment of `file`: the dataset containing it, or None (HDF5 structure)."""
    ranges = dataset_ranges(manifest, file)
    owners = []
    for start, stop, _ in manifest.files[file].segments:
        inside = [ds for ds, (lo, hi, _) in ranges.items() if lo <= start and stop <= hi]
        owners.append(inside[0] if inside else None)
    return owners


def verify_files(directory: Path, manifest: Manifest, needs: dict[str, set[str] | None]) -> int:
    """Check existence, size and checksums of the listed files — for each, the segments of the named
    datasets (None: all) plus the HDF5 structure h5py reads to find them. Returns the bytes hashed."""
    hashed = 0
    for file in sorted(needs):
        path = directory / file
        if file not in manifest.files:
            raise CorruptCheckpoint(f"{path}: not listed in the manifest")
        entry = manifest.files[file]
        holds = ", ".join(manifest.tensors_in_file(file)) or "no tensors"
        try:
            size = os.path.getsize(path)
        except FileNotFoundError:
            raise CorruptCheckpoint(f"{path}: shard file missing; it holds tensors {holds}") from None
        if size != entry.size:
            raise CorruptCheckpoint(
                f"{path}: size {size} bytes, manifest says {entry.size} (truncated or replaced); "
                f"it holds tensors {holds}"
            )
        owners = segment_owners(manifest, file)
        wanted = needs[file]
        chosen = [i for i, ds in enumerate(owners) if wanted is None or ds is None or ds in wanted]
        # one algorithm per file: the one its recorded digests name (older checkpoints: SHA-256)
        algorithm = algorithm_of(entry.segments[0][2]) if entry.segments else None
        try:
            digests = hash_segments(path, [entry.segments[i][:2] for i in chosen], algorithm=algorithm)
        except ValueError as err:
            raise CorruptCheckpoint(f"{path}: {err}") from None
        labels = dataset_ranges(manifest, file)
        for index, digest in zip(chosen, digests, strict=True):
            start, stop, expected = entry.segments[index]
            if digest != expected:
                owner = owners[index]
                what = f"tensor {labels[owner][2]}" if owner else f"HDF5 structure of a file holding {holds}"
                raise CorruptCheckpoint(f"{path}: checksum mismatch in bytes [{start}, {stop}): {what}")
            hashed += stop - start
    return hashed


def verify_directory(directory: Path, root: Path | None = None) -> Manifest:
    """Full verification (`hpcrl ckpt check`): the trust rules (hpcrl.ckpt.trust) for the directory (found
    under `root`, or named itself: None), the manifest and every dataset; every segment of every file;
    every rank's RNG state."""
    check_step_dir(directory, root)
    manifest = read_manifest(directory)
    check_manifest(directory, manifest)
    everything = dict.fromkeys(manifest.files)
    verify_files(directory, manifest, everything)
    check_datasets(directory, manifest, everything)
    for rank, rng in sorted(manifest.rng.items()):
        try:
            check_rng(rng)
        except ValueError as err:
            raise CorruptCheckpoint(f"{directory / MANIFEST}: rank {rank}: {err}") from None
    return manifest


def check_committed(directory: Path) -> Manifest:
    """Cheap verification of a checkpoint this process just wrote: the manifest parses and every file
    exists with its recorded size. (Its checksums were computed from the bytes just written, so a full
    re-hash would read the same bytes again; loaders and `hpcrl ckpt check` do the full verification.)"""
    manifest = read_manifest(directory)
    for file, entry in manifest.files.items():
        path = directory / file
        size = path.stat().st_size if path.exists() else None
        if size != entry.size:
            raise CorruptCheckpoint(f"{path}: size {size}, manifest says {entry.size}")
    return manifest
