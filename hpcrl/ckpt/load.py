"""Loading with reshard: each rank reads only the hyperslabs of saved shards that intersect its new shards.

For a target shard T (box of the global tensor) and every saved shard S of the same tensor, the rank
reads S ∩ T with an h5py partial read (`read_direct` with a hyperslab selection) straight into the
matching slice of T's buffer. Saved shards tile the tensor exactly once, so the bytes read equal T's
bytes — counted exactly in `Loaded.bytes_read`.

Before any tensor is read, every rank checks the manifest, the compatibility of its specs, and the
checksums of the blocks it is about to read (plus the file structure); the ranks then agree (one
all-reduce) on whether the candidate is good. With `fallback=True` they move on to the previous committed
checkpoint together. Files are opened read-only: a failed load never modifies a checkpoint.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h5py
import torch
import torch.distributed as dist

from hpcrl.ckpt.collectives import group_rank, max_over_ranks
from hpcrl.ckpt.commit import candidates
from hpcrl.ckpt.manifest import (
    MANIFEST,
    CheckpointError,
    CorruptCheckpoint,
    Manifest,
    ShardEntry,
    read_manifest,
)
from hpcrl.ckpt.shards import Box, ShardSpec, storage_dtype, torch_dtype
from hpcrl.ckpt.state import RunState
from hpcrl.ckpt.verify import verify_files

_OK, _CORRUPT, _MISMATCH = 0, 1, 2


class CheckpointMismatch(CheckpointError):
    """The checkpoint cannot load under the requested shard specs (another model or an impossible layout)."""


@dataclass
class Loaded:
    path: Path
    manifest: Manifest
    tensors: dict[str, torch.Tensor]
    state: RunState
    rng: dict[str, Any] | None
    """This rank's RNG state as saved by the same group rank (None if that rank did not exist)."""
    bytes_read: int
    """Tensor bytes read from the files (hyperslab reads), exact."""
    bytes_verified: int
    """File bytes hashed to verify the blocks this rank read."""
    skipped: list[str] = field(default_factory=list)
    """Why newer checkpoints were not used (fallback)."""


def compatibility_problems(manifest: Manifest, specs: list[ShardSpec]) -> list[str]:
    """Why `specs` cannot be loaded from this checkpoint (empty: they can). First mismatch first."""
    problems = []
    for spec in specs:
        entry = manifest.tensors.get(spec.name)
        if entry is None:
            problems.append(f"tensor {spec.name!r}: not in the checkpoint")
        elif entry.global_shape != tuple(spec.global_shape):
            problems.append(
                f"tensor {spec.name!r}: global shape {tuple(spec.global_shape)} requested, "
                f"checkpoint has {entry.global_shape}"
            )
        elif entry.dtype != spec.dtype:
            problems.append(
                f"tensor {spec.name!r}: dtype {spec.dtype} requested, checkpoint has {entry.dtype}"
            )
        elif any(
            o < 0 or o + n > g
            for o, n, g in zip(spec.global_offset, spec.local_shape, spec.global_shape, strict=True)
        ) or len(spec.global_offset) != len(entry.global_shape):
            problems.append(f"tensor {spec.name!r}: shard {spec.box.describe()} outside {entry.global_shape}")
    return problems


def can_load(root: str | Path, specs: list[ShardSpec]) -> list[str]:
    """Check without loading: why `specs` cannot load from the newest checkpoint under `root` (or from
    `root` itself); empty when they can. Reads only the manifest — no tensor, no checksum."""
    root = Path(root)
    dirs = [root] if (root / MANIFEST).exists() else candidates(root)
    if not dirs:
        return [f"{root}: no committed checkpoint"]
    try:
        return compatibility_problems(read_manifest(dirs[0]), specs)
    except CorruptCheckpoint as err:
        return [str(err)]


def plan_reads(manifest: Manifest, specs: list[ShardSpec]) -> dict[str, list[tuple[ShardEntry, Box]]]:
    """Tensor name -> the saved shards that intersect the target and the intersections."""
    reads = {}
    for spec in specs:
        hits = []
        for shard in manifest.tensors[spec.name].shards:
            both = shard.box.intersect(spec.box)
            if both is not None and both.numel > 0:
                hits.append((shard, both))
        reads[spec.name] = hits
    return reads


def load_checkpoint(
    root: str | Path,
    specs: list[ShardSpec],
    *,
    group: dist.ProcessGroup | None = None,
    fallback: bool = False,
    expect_run_id: str | None = None,
) -> Loaded:
    """Load `specs` from the newest good checkpoint under `root` (or from `root` itself if it is one)."""
    root = Path(root)
    dirs = [root] if (root / MANIFEST).exists() else candidates(root)
    if not dirs:
        raise CheckpointError(f"{root}: no committed checkpoint")
    skipped: list[str] = []
    for directory in dirs:
        outcome, message, prepared = _prepare(directory, specs, expect_run_id)
        verdict = max_over_ranks(outcome, group)
        if verdict == _OK:
            manifest, reads, hashed = prepared
            tensors, nbytes = _read(directory, specs, reads)
            return Loaded(
                directory,
                manifest,
                tensors,
                RunState.from_json(manifest.state),
                manifest.rng.get(str(group_rank(group))),
                nbytes,
                hashed,
                skipped,
            )
        message = message or f"{directory}: rejected by another rank"
        if verdict == _MISMATCH:
            raise CheckpointMismatch(message)
        if not fallback:
            raise CorruptCheckpoint(message)
        skipped.append(message)
    raise CorruptCheckpoint(f"{root}: no checkpoint verifies: " + " | ".join(skipped))


def _prepare(directory: Path, specs: list[ShardSpec], expect_run_id: str | None) -> tuple[int, str, Any]:
    try:
        manifest = read_manifest(directory)
        if expect_run_id is not None and manifest.state.get("run_id") != expect_run_id:
            raise CorruptCheckpoint(
                f"{directory / MANIFEST}: written by run {manifest.state.get('run_id')!r}, expected {expect_run_id!r}"
            )
        problems = compatibility_problems(manifest, specs)
        if problems:
            return _MISMATCH, f"{directory}: cannot load: " + "; ".join(problems), None
        reads = plan_reads(manifest, specs)
        needs: dict[str, set[str]] = defaultdict(set)
        for hits in reads.values():
            for shard, _ in hits:
                needs[shard.file].add(shard.dataset)
        hashed = verify_files(directory, manifest, dict(needs))
    except CorruptCheckpoint as err:
        return _CORRUPT, str(err), None
    except (OSError, ValueError, KeyError) as err:  # unreadable files: this rank must still vote, not raise
        return _CORRUPT, f"{directory}: {err!r}", None
    return _OK, "", (manifest, reads, hashed)


def _read(
    directory: Path, specs: list[ShardSpec], reads: dict[str, list[tuple[ShardEntry, Box]]]
) -> tuple[dict[str, torch.Tensor], int]:
    tensors = {}
    nbytes = 0
    by_file: dict[str, list[tuple[ShardSpec, ShardEntry, Box]]] = defaultdict(list)
    for spec in specs:
        tensors[spec.name] = torch.empty(spec.local_shape, dtype=torch_dtype(spec.dtype))
        for shard, both in reads[spec.name]:
            by_file[shard.file].append((spec, shard, both))
    for file, items in sorted(by_file.items()):
        with h5py.File(directory / file, "r") as fh:
            for spec, shard, both in items:
                target = _storage_view(tensors[spec.name], spec.dtype)
                fh[shard.dataset].read_direct(
                    target, source_sel=both.slices_within(shard.box), dest_sel=both.slices_within(spec.box)
                )
                nbytes += both.numel * target.itemsize
    return tensors, nbytes


def _storage_view(tensor: torch.Tensor, dtype: str):
    """A numpy view of `tensor`'s memory in the dataset's storage dtype (bf16 as uint16 bits)."""
    storage = storage_dtype(dtype)
    if tensor.dtype in (torch.bfloat16,):
        return tensor.view(torch.int16).numpy().view(storage)
    if tensor.dtype in (torch.float8_e4m3fn, torch.float8_e5m2, torch.bool):
        return tensor.view(torch.uint8).numpy()
    return tensor.numpy()
