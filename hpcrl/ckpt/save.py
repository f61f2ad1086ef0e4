"""Saving a checkpoint: every rank writes its file, rank 0 writes the manifest and commits.

Sequence (one save; `group` passed explicitly, None = a single process):
1. `plan_save` — one all-gather of shard metadata (collective, caller's thread); rank 0 tidies the root.
2. each rank writes `rank_XXXXX.h5` into `step_N.tmp-<token>/`, fsyncs it, and leaves a record
   `rank_XXXXX.json` (file size, block checksums, dataset offsets, its RNG state) — or
   `rank_XXXXX.failed` with the error.
3. rank 0 waits for every record (file system, no collective: this also works from a background
   thread while training runs collectives), writes `manifest.json`, commits (see commit.py), checks the
   committed directory (`check_committed`), and only then prunes to keep-last-k.
The synchronous path adds two collectives so every rank raises when any rank failed.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from hpcrl import __version__
from hpcrl.ckpt.commit import commit, prune, prune_rejected, remove_leftovers, tmp_dir
from hpcrl.ckpt.integrity import file_digest, fsync_dir, write_durable, write_last
from hpcrl.ckpt.manifest import MANIFEST, CheckpointError, FileEntry, Manifest, rank_file
from hpcrl.ckpt.rankfile import write_rank_file
from hpcrl.ckpt.save_plan import SavePlan
from hpcrl.ckpt.state import RunState
from hpcrl.ckpt.verify import check_committed
from hpcrl.distributed.collectives import any_rank

_POLL_S = 0.005


@dataclass(frozen=True)
class SaveJob:
    """Everything one rank needs to finish a planned save (possibly in a background thread)."""

    root: Path
    plan: SavePlan
    tensors: dict[str, torch.Tensor]
    """Tensor name -> this rank's local data (a host snapshot for async saves)."""
    state: RunState
    rng: dict[str, Any]
    layout: dict[str, Any]
    keep_last: int
    keep_rejected: int
    timeout_s: float
    extra: dict[str, Any]
    background: bool = False
    """Written by an async save's thread: one busy thread at a time (training keeps the other cores)."""

    @property
    def tmp(self) -> Path:
        return tmp_dir(self.root, self.state.step, self.plan.token)


def write_rank(job: SaveJob, before_record: Callable[[], None] | None = None) -> None:
    """Step 2 for this rank. `before_record` runs after the file is written and before the record that
    publishes it (it may raise: the async write guard). On failure leaves a `.failed` marker (so rank 0
    never commits) and raises."""
    job.tmp.mkdir(parents=True, exist_ok=True)
    stem = job.tmp / rank_file(job.plan.rank).removesuffix(".h5")
    try:
        arrays = {dataset: to_numpy(job.tensors[name]) for dataset, name in job.plan.owned.items()}
        record: dict[str, Any] = {"rank": job.plan.rank, "rng": job.rng, "file": None}
        if arrays:
            attrs = {"hpcrl_step": str(job.state.step), "hpcrl_run_id": job.state.run_id}
            written = write_rank_file(job.tmp / rank_file(job.plan.rank), arrays, attrs, job.background)
            record["file"] = {
                "name": written.file,
                "size": written.size,
                "segments": written.segments,
                "byte_offsets": written.byte_offsets,
            }
        if before_record is not None:
            before_record()
        write_last(stem.with_suffix(".json"), json.dumps(record).encode())  # rank 0 may commit at once
    except BaseException as err:
        mark_failed(job, err)
        raise


def mark_failed(job: SaveJob, err: BaseException) -> None:
    """Leave this rank's `.failed` marker: rank 0 then fails the save at once instead of waiting for it."""
    stem = job.tmp / rank_file(job.plan.rank).removesuffix(".h5")
    # the disk may be full; rank 0 then times out waiting, which also never commits
    with contextlib.suppress(OSError):
        job.tmp.mkdir(parents=True, exist_ok=True)
        write_durable(stem.with_suffix(".failed"), repr(err).encode())


def commit_save(job: SaveJob) -> Path:
    """Step 3 (rank 0): wait for every rank's record, write the manifest, commit, verify, prune."""
    records = _wait_for_records(job)
    files = {
        rec["file"]["name"]: FileEntry(
            rec["file"]["size"],
            [tuple(g) for g in rec["file"]["segments"]],
            file_digest([g[2] for g in rec["file"]["segments"]]),
            rec["file"]["byte_offsets"],
        )
        for rec in records
        if rec["file"] is not None
    }
    manifest = Manifest(
        step=job.state.step,
        world_size=job.plan.world_size,
        layout=job.layout,
        tensors=job.plan.tensors,
        files=files,
        rng={str(rec["rank"]): rec["rng"] for rec in records},
        state=job.state.to_json(),
        hpcrl_version=__version__,
        extra=job.extra,
    )
    with open(job.tmp / MANIFEST, "wb") as fh:
        fh.write(json.dumps(manifest.to_json(), indent=1).encode())
        fh.flush()
        os.fsync(fh.fileno())
    for rank in range(job.plan.world_size):
        (job.tmp / rank_file(rank).replace(".h5", ".json")).unlink()
    fsync_dir(job.tmp)
    final = commit(job.tmp, job.root, job.state.step)
    check_committed(final)
    # a sync save returns without waiting for old checkpoints' files to be deleted; an async save is
    # in its writer thread already (one background thread at a time)
    prune(job.root, job.keep_last, job.plan.token, background=not job.background)
    return final


def tidy_root(job: SaveJob) -> None:
    """Rank 0, before writing: a crash may have left tmp dirs, unpublished dirs, or skipped the last prune;
    a load may have set rejected checkpoints aside (kept: the newest `keep_rejected`)."""
    remove_leftovers(job.root, keep=job.tmp)
    prune(job.root, job.keep_last, job.plan.token)
    prune_rejected(job.root, job.keep_rejected)


def abort_save(job: SaveJob) -> None:
    """Remove the tmp dir of a failed save (rank 0); committed checkpoints are untouched."""
    remove_leftovers(job.root)


def run_sync(job: SaveJob, group: dist.ProcessGroup | None) -> Path | None:
    """Steps 2-3 in the caller's thread; raises on every rank if any rank failed."""
    error: BaseException | None = None
    try:
        write_rank(job)
    except Exception as err:
        error = err
    if any_rank(error is not None, group):
        if job.plan.rank == 0:
            abort_save(job)
        raise CheckpointError(
            f"save of step {job.state.step} failed: {error or 'on another rank'}"
        ) from error
    final = None
    if job.plan.rank == 0:
        try:
            final = commit_save(job)
        except Exception as err:
            error = err
            abort_save(job)
    if any_rank(error is not None, group):
        raise CheckpointError(f"commit of step {job.state.step} failed: {error or 'on rank 0'}") from error
    return final


def _wait_for_records(job: SaveJob) -> list[dict[str, Any]]:
    deadline = time.monotonic() + job.timeout_s
    pending = set(range(job.plan.world_size))
    records = []
    while pending:
        for rank in sorted(pending):
            stem = job.tmp / rank_file(rank).removesuffix(".h5")
            if stem.with_suffix(".failed").exists():
                raise CheckpointError(
                    f"rank {rank} failed to write step {job.state.step}: {stem.with_suffix('.failed').read_text()}"
                )
            if stem.with_suffix(".json").exists():
                records.append(json.loads(stem.with_suffix(".json").read_bytes()))
                pending.discard(rank)
        if pending:
            if time.monotonic() > deadline:
                raise CheckpointError(
                    f"ranks {sorted(pending)} did not finish step {job.state.step} in {job.timeout_s}s"
                )
            time.sleep(_POLL_S)
    return sorted(records, key=lambda rec: rec["rank"])


def to_numpy(tensor: torch.Tensor) -> np.ndarray:
    """Host, C-contiguous array of the tensor's bytes (bf16/fp8 as raw unsigned integers)."""
    tensor = tensor.detach().to("cpu").contiguous()
    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.int16).numpy().view("<u2")
    if tensor.dtype in (torch.float8_e4m3fn, torch.float8_e5m2, torch.bool):
        return tensor.view(torch.uint8).numpy()
    return tensor.numpy()
