"""Loading with reshard: each rank reads only the hyperslabs of saved shards that intersect its new shards.

For a target shard T (box of the global tensor) and every saved shard S of the same tensor, the rank
reads S ∩ T with an h5py partial read (`read_direct` with a hyperslab selection) straight into the
matching slice of T's buffer. Saved shards tile the tensor exactly once, so the bytes read equal T's
bytes — counted exactly in `Loaded.bytes_read`.

Before any tensor byte is copied, every rank checks its candidate: the trust rules (hpcrl.ckpt.trust:
paths, HDF5 structure, dtypes and shapes against the manifest), the manifest (schema, self-consistency),
its specs against the manifest, its RNG state, and the checksums of the blocks it is about to read. The
ranks then agree (one all-reduce) on whether the candidate is good, and on a rejection share their
reasons (one all-gather). With `fallback=True` they move on to the previous committed checkpoint
together. Files are opened read-only: a failed load never modifies a checkpoint; a load that fell back
renames the rejected newer ones aside only when its caller owns the root and asks (`set_aside_rejected`).

A checkpoint written by another run (`expect_run_id`) is neither damaged nor skipped: it ends the load
with ForeignCheckpoint at once (no fallback to an older one, nothing set aside: the files are another
run's). A checkpoint without a run id (written before run ids were recorded) is accepted, with a warning.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h5py
import torch
import torch.distributed as dist

from hpcrl.ckpt.commit import LATEST, publish, set_aside
from hpcrl.ckpt.manifest import (
    MANIFEST,
    CheckpointError,
    CorruptCheckpoint,
    Manifest,
    ShardEntry,
    read_manifest,
)
from hpcrl.ckpt.shards import Box, ShardSpec, storage_dtype, torch_dtype
from hpcrl.ckpt.state import RunState, check_rng
from hpcrl.ckpt.trust import check_datasets, check_manifest, check_step_dir, checkpoint_dirs
from hpcrl.ckpt.verify import verify_files
from hpcrl.distributed.collectives import all_gather_json, group_rank, max_over_ranks

log = logging.getLogger(__name__)

_OK, _CORRUPT, _MISMATCH, _FOREIGN = 0, 1, 2, 3

SpecSource = list[ShardSpec] | Callable[[Manifest], list[ShardSpec]]
"""A rank's shard specs, or a function of a candidate checkpoint's manifest that returns them."""


class CheckpointMismatch(CheckpointError):
    """The checkpoint cannot load under the requested shard specs (another model or an impossible layout)."""


class ForeignCheckpoint(CheckpointError):
    """The checkpoint was written by another run than the one the caller expects (`expect_run_id`)."""

    def __init__(self, message: str, directory: Path, run_id: str) -> None:
        super().__init__(message)
        self.directory = directory
        """The candidate that was refused."""
        self.run_id = run_id
        """The run id it was written by ('' when this rank could not tell)."""


class NoCheckpoint(CheckpointError):
    """There is no committed checkpoint under the root (a run with nothing to resume starts afresh)."""


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
    dirs, _ = checkpoint_dirs(root)
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
    specs: SpecSource,
    *,
    group: dist.ProcessGroup | None = None,
    fallback: bool = False,
    expect_run_id: str | None = None,
    set_aside_rejected: bool = False,
) -> Loaded:
    """Load `specs` from the newest good checkpoint under `root` (or from `root` itself if it is one).

    `specs`: this rank's shard specs, or a function of a candidate's manifest returning them (it may
    raise ValueError, KeyError or TypeError to reject the candidate, e.g. for run state the job cannot
    use). Every rank checks a candidate before any tensor byte is copied, then all agree on one verdict.
    `expect_run_id`: a candidate written by another run raises ForeignCheckpoint (never a fallback).
    `fallback`: on a rejection, all move on to the next older candidate. `set_aside_rejected`: once one
    loads, group rank 0 renames the rejected newer ones out of the `step_N` namespace (commit.set_aside),
    so a rerun can commit those steps again; the owner of the root asks for it (`Checkpointer.load`)."""
    root = Path(root)
    dirs, under = _agreed_dirs(root, group)
    if not dirs:
        raise NoCheckpoint(f"{root}: no committed checkpoint")
    rejected: list[tuple[Path, str]] = []
    for directory in dirs:
        outcome, message, prepared = _prepare(directory, under, specs, expect_run_id, group)
        verdict = max_over_ranks(outcome, group)
        if verdict == _OK:
            _report(rejected, directory if set_aside_rejected and under is not None else None, group)
            return _load(directory, prepared, [why for _, why in rejected])
        message = _reasons(directory, message, group)
        if verdict == _FOREIGN:
            raise ForeignCheckpoint(message, directory, _saved_run_id(directory))
        if verdict == _MISMATCH:
            raise CheckpointMismatch(message)
        if not fallback:
            raise CorruptCheckpoint(message)
        rejected.append((directory, message))
    raise CorruptCheckpoint(f"{root}: no checkpoint verifies: " + " | ".join(why for _, why in rejected))


@dataclass
class _Prepared:
    manifest: Manifest
    specs: list[ShardSpec]
    reads: dict[str, list[tuple[ShardEntry, Box]]]
    hashed: int
    state: RunState
    rng: dict[str, Any] | None


def _agreed_dirs(root: Path, group: dist.ProcessGroup | None) -> tuple[list[Path], Path | None]:
    """Group rank 0's candidates (`trust.checkpoint_dirs`) on every rank: on a shared file system ranks
    may briefly list different directories, and ranks trying different ones would pair up their
    collectives wrongly. A rank that cannot see a directory rejects it like a damaged one."""
    dirs, under = checkpoint_dirs(root)
    if group is None:
        return dirs, under
    agreed = all_gather_json({"dirs": [str(d) for d in dirs], "under": under is not None}, group)[0]
    return [Path(d) for d in agreed["dirs"]], root if agreed["under"] else None


def _prepare(
    directory: Path,
    under: Path | None,
    specs: SpecSource,
    expect_run_id: str | None,
    group: dist.ProcessGroup | None,
) -> tuple[int, str, _Prepared | None]:
    """This rank's verdict on `directory` and what it needs to read it; never raises (it must vote)."""
    try:
        check_step_dir(directory, under)
        manifest = read_manifest(directory)
        check_manifest(directory, manifest)
        state = RunState.from_json(manifest.state)  # cannot fail: read_manifest checked it
        if _foreign(directory, state.run_id, expect_run_id, group):
            return _FOREIGN, _foreign_message(directory, state.run_id, expect_run_id), None
        rng = _own_rng(directory, manifest, group_rank(group))
        wanted = _specs_for(directory, manifest, specs)
        problems = compatibility_problems(manifest, wanted)
        if problems:
            return _MISMATCH, f"{directory / MANIFEST}: cannot load: " + "; ".join(problems), None
        reads = plan_reads(manifest, wanted)
        needs: dict[str, set[str]] = defaultdict(set)
        for hits in reads.values():
            for shard, _ in hits:
                needs[shard.file].add(shard.dataset)
        hashed = verify_files(directory, manifest, dict(needs))
        whole = check_datasets(directory, manifest, dict(needs))
        if whole:  # datasets whose bytes no checksum segment is tied to: verify those files whole
            hashed += verify_files(directory, manifest, dict.fromkeys(whole))
    except CorruptCheckpoint as err:
        return _CORRUPT, str(err), None
    except (OSError, ValueError, KeyError) as err:  # e.g. an I/O error: this rank must still vote
        return _CORRUPT, f"{directory}: unreadable: {err!r}", None
    return _OK, "", _Prepared(manifest, wanted, reads, hashed, state, rng)


def _foreign(directory: Path, saved: str, expected: str | None, group: dist.ProcessGroup | None) -> bool:
    """Whether a candidate was written by another run than `expected` (None: any run will do). A
    checkpoint without a run id predates run ids: it cannot be told apart, so it is accepted."""
    if expected is None or saved == expected:
        return False
    if not saved:
        if group_rank(group) == 0:
            log.warning("%s has no run id (written before run ids were recorded): accepted", directory)
        return False
    return True


def _foreign_message(directory: Path, saved: str, expected: str | None) -> str:
    return f"{directory / MANIFEST}: written by run {saved!r}, expected {expected!r}"


def _saved_run_id(directory: Path) -> str:
    """The run id a refused candidate was written by, read again for the error ('' if unreadable now)."""
    try:
        return RunState.from_json(read_manifest(directory).state).run_id
    except (CheckpointError, OSError, ValueError):
        return ""


def _own_rng(directory: Path, manifest: Manifest, rank: int) -> dict[str, Any] | None:
    """This rank's saved RNG state, checked to restore (None: no rank of this number saved)."""
    rng = manifest.rng.get(str(rank))
    if rng is not None:
        try:
            check_rng(rng)
        except ValueError as err:
            raise CorruptCheckpoint(f"{directory / MANIFEST}: rank {rank}: {err}") from None
    return rng


def _specs_for(directory: Path, manifest: Manifest, specs: SpecSource) -> list[ShardSpec]:
    if not callable(specs):
        return list(specs)
    try:
        return list(specs(manifest))
    except (ValueError, KeyError, TypeError) as err:
        raise CorruptCheckpoint(f"{directory / MANIFEST}: not usable by this job: {err!r}") from None


def _reasons(directory: Path, message: str, group: dist.ProcessGroup | None) -> str:
    """Every rank's reason for a rejection (one all-gather, only on a rejection), so the error and the
    warning on every rank say which file broke which rule, not just that another rank said no."""
    if group is None:
        return message
    gathered = all_gather_json(message, group)
    if len(gathered) == 1:
        return gathered[0]
    reasons = [f"rank {rank}: {why}" for rank, why in enumerate(gathered) if why]
    return "; ".join(reasons) or f"{directory}: rejected"


def _report(rejected: list[tuple[Path, str]], loaded: Path | None, group: dist.ProcessGroup | None) -> None:
    """After a load that fell back (every rank agreed on every rejection): group rank 0 warns what was
    rejected and why. With `loaded` (the owner of the root asked) it also renames each rejected directory
    aside and points `latest` at the one that loaded, so the root is consistent again."""
    if group_rank(group) != 0 or not rejected:
        return
    for directory, why in rejected:
        if loaded is None:
            log.warning("checkpoint %s rejected: %s", directory, why)
            continue
        try:
            target = set_aside(directory)
        except OSError as err:
            log.warning("checkpoint %s rejected: %s; could not set it aside: %s", directory, why, err)
            continue
        log.warning("checkpoint %s rejected and set aside as %s: %s", directory, target.name, why)
    if loaded is not None:
        try:
            publish(loaded.parent, loaded)
        except OSError as err:  # readers bound by a stale `latest` still find `loaded` or an older one
            log.warning("could not point %s at %s: %s", loaded.parent / LATEST, loaded.name, err)


def _load(directory: Path, prepared: _Prepared, skipped: list[str]) -> Loaded:
    tensors, nbytes = _read(directory, prepared.specs, prepared.reads)
    return Loaded(
        directory,
        prepared.manifest,
        tensors,
        prepared.state,
        prepared.rng,
        nbytes,
        prepared.hashed,
        skipped,
    )


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
