"""`Checkpointer`: save (sync or async) and load sharded checkpoints under one root directory.

Async save contract (as Megatron's and torch DCP's async saves):
- `save()` waits for the previous save (at most one in flight: the next save WAITS for it rather than
  being refused, so no requested checkpoint is silently dropped; a failure of the previous save is raised
  there), runs the collective planning step, records every saved tensor's `_version` and returns. A
  snapshot thread then copies the tensors into host buffers owned by the checkpointer (reused between
  saves; torch copies release the GIL), and a write thread (lower CPU priority) writes the rank file;
  on rank 0 it also commits. Both threads are started once and make no collective calls, so training
  may use the same process group meanwhile.
- `fence()` blocks until the in-flight save's host copy is done (not the write). A caller that writes
  the saved tensors in place must call `fence()` first; writes after it never reach the checkpoint. The
  RL and DPO trainers call it right before each optimizer step (`Trainer.add_pre_step_hook`, registered
  by hpcrl.stages.checkpointing); with no save in flight, or already fenced, it returns at once.
- A write without a fence fails that save loudly, the error naming the tensor (the guard: hpcrl.ckpt.snapshot).
- A failing background save (that, a full disk, ...) is logged when it happens, never committed
  (`latest` untouched), and raised by the next `save()`, `wait()` or `close()`. `wait()` fences too.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch.distributed as dist

from hpcrl.ckpt.config import CheckpointConfig, checkpoint_root
from hpcrl.ckpt.load import Loaded, SpecSource, load_checkpoint
from hpcrl.ckpt.manifest import CheckpointError
from hpcrl.ckpt.save import SaveJob, abort_save, commit_save, mark_failed, run_sync, tidy_root, write_rank
from hpcrl.ckpt.save_plan import plan_save
from hpcrl.ckpt.shards import ShardedTensor
from hpcrl.ckpt.snapshot import HostBuffers, InFlightSave
from hpcrl.ckpt.state import RunState, capture_rng
from hpcrl.distributed.collectives import group_rank

log = logging.getLogger(__name__)

_WRITER_NICE = 10


class Checkpointer:
    """One per rank. `group` is the process group whose ranks save together (None: this process alone).

    `keep_last`, `keep_rejected` and `timeout_s` mean what CheckpointConfig's fields of those names mean and default to
    them. `async_save` has no default here: a caller that saves and then reads the files at once must
    not get a background save by omission, so each caller says which it wants (a run takes
    CheckpointConfig.async_save through `from_config`)."""

    def __init__(
        self,
        root: str | Path,
        *,
        async_save: bool,
        group: dist.ProcessGroup | None = None,
        keep_last: int = CheckpointConfig.keep_last,
        keep_rejected: int = CheckpointConfig.keep_rejected,
        timeout_s: float = CheckpointConfig.timeout_s,
    ) -> None:
        if keep_last < 1:
            raise ValueError(f"keep_last must be >= 1, got {keep_last}")
        if keep_rejected < 0:
            raise ValueError(f"keep_rejected must be >= 0, got {keep_rejected}")
        self.root = Path(root)
        self.group = group
        self.keep_last = keep_last
        self.keep_rejected = keep_rejected
        self.async_save = async_save
        self.timeout_s = timeout_s
        self.last_save_s: float | None = None
        """Seconds the last finished save took from `save()` to its commit (async: in the background)."""
        self._inflight: InFlightSave | None = None
        self._pending: Future | None = None
        """The in-flight save's snapshot stage; its result is the write stage's Future (None: failed)."""
        self._stages: tuple[ThreadPoolExecutor, ThreadPoolExecutor] | None = None
        self._error: BaseException | None = None
        self._committed: Path | None = None
        self.committed_step: int | None = None
        """The step of the last checkpoint this process committed (rank 0; set from the writer thread of an
        async save once it is committed), None before the first."""
        self._buffers = HostBuffers()

    def save(
        self,
        step: int,
        shards: list[ShardedTensor],
        state: RunState,
        layout: dict[str, Any] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        """Save `shards` and `state` as step `step` (collective over the group). `layout` and `extra`
        (JSON, e.g. model configs for export; rank 0's is used) go into the manifest. Async: write the
        saved tensors in place only after `fence()`."""
        if state.step != step:
            raise ValueError(f"state.step is {state.step}, saving step {step}")
        self.wait()
        start = time.perf_counter()
        plan = plan_save(shards, self.group)
        # inference tensors have no version counter to guard: copy those now
        tensors = {s.name: s.data.clone() if s.data.is_inference() else s.data for s in shards}
        job = SaveJob(
            self.root,
            plan,
            tensors,
            state,
            capture_rng(),
            dict(layout or {}),
            self.keep_last,
            self.keep_rejected,
            self.timeout_s,
            dict(extra or {}),
            background=self.async_save,
        )
        if not self.async_save:
            if plan.rank == 0:
                tidy_root(job)
            self._committed = run_sync(job, self.group)
            if self._committed is not None:
                self.committed_step = job.state.step
            self.last_save_s = time.perf_counter() - start
            return
        self._inflight = InFlightSave(step, tensors)
        self._pending = self._threads()[0].submit(self._snapshot, job, self._inflight, start)

    def fence(self) -> None:
        """Block until the in-flight save's host snapshot is taken; then the saved tensors may be written
        in place. Returns at once when no save is in flight or it was already fenced. Never raises for the
        save's own failures (those come from the next `save()`, `wait()` or `close()`)."""
        if self._inflight is not None:
            self._inflight.fence()

    def wait(self) -> Path | None:
        """Fence, then block until the save in flight finished; raise its error. Returns the last
        committed dir (rank 0)."""
        if self._inflight is not None:
            self._inflight.fence()
            write = self._pending.result()
            if write is not None:
                write.result()
            self._inflight = self._pending = None
        if self._error is not None:
            error, self._error = self._error, None
            raise CheckpointError(f"background save failed: {error}") from error
        return self._committed

    def close(self) -> None:
        """Wait for the save in flight (raising its error), free the host buffers and the threads."""
        try:
            self.wait()
        finally:
            self._buffers.clear()
            if self._stages is not None:
                for executor in self._stages:
                    executor.shutdown()
                self._stages = None

    def load(self, specs: SpecSource, *, fallback: bool = False, expect_run_id: str | None = None) -> Loaded:
        """Load the newest verified checkpoint under this root into tensors shaped by `specs` (or by
        `specs(manifest)`); NoCheckpoint when none is committed. With `fallback`, the checkpoints it had
        to reject are set aside (`step_N.rejected-<UTC time>`): this checkpointer commits into the same
        root, and a rejected `step_N` left in place would refuse its next commit of step N."""
        self.wait()
        return load_checkpoint(
            self.root,
            specs,
            group=self.group,
            fallback=fallback,
            expect_run_id=expect_run_id,
            set_aside_rejected=fallback,
        )

    @classmethod
    def from_config(
        cls, cfg: CheckpointConfig, run_dir: str | Path, group: dist.ProcessGroup | None
    ) -> Checkpointer:
        return cls(
            checkpoint_root(cfg, run_dir),
            group=group,
            keep_last=cfg.keep_last,
            keep_rejected=cfg.keep_rejected,
            async_save=cfg.async_save,
            timeout_s=cfg.timeout_s,
        )

    @property
    def rank(self) -> int:
        return group_rank(self.group)

    def _threads(self) -> tuple[ThreadPoolExecutor, ThreadPoolExecutor]:
        """(snapshot, write) threads, started once: `save()` only queues work (no thread start, which
        can take many milliseconds on a loaded machine). A save still in flight at interpreter exit may
        be dropped (never half-committed): call `close()` before exiting, as the jobs do."""
        if self._stages is None:
            self._stages = (
                ThreadPoolExecutor(1, thread_name_prefix="ckpt-snapshot"),
                ThreadPoolExecutor(1, thread_name_prefix="ckpt-write", initializer=_yield_cpu),
            )
            for executor in self._stages:
                executor.submit(lambda: None).result()
        return self._stages

    def _snapshot(self, job: SaveJob, inflight: InFlightSave, start: float) -> Future | None:
        """Snapshot stage, at the caller's priority (training may be waiting for it in `fence()`)."""
        try:
            try:
                snapshot = self._buffers.copy(job.tensors)
                inflight.check_copied()
            finally:
                inflight.snapshot_done.set()
        except BaseException as err:
            mark_failed(job, err)
            self._failed(job, err)
            return None
        return self._threads()[1].submit(
            self._write, dataclasses.replace(job, tensors=snapshot), inflight, start
        )

    def _write(self, job: SaveJob, inflight: InFlightSave, start: float) -> None:
        """Write stage: tidy the root (rank 0), write this rank's file, publish it, commit (rank 0)."""
        try:
            if job.plan.rank == 0:
                tidy_root(job)
            write_rank(job, before_record=inflight.seal)
            if job.plan.rank == 0:
                self._committed = commit_save(job)
                self.committed_step = job.state.step
            self.last_save_s = time.perf_counter() - start
        except BaseException as err:
            self._failed(job, err)

    def _failed(self, job: SaveJob, err: BaseException) -> None:
        log.error("async save of step %d failed (not committed): %s", job.state.step, err)
        self._error = err
        if job.plan.rank == 0:
            abort_save(job)


def _yield_cpu() -> None:
    """The write thread (and the checksum threads it starts, which inherit it) yields the CPU to training;
    it mostly waits on memory and the disk anyway. Linux: a thread's nice value is its own. Best effort."""
    with contextlib.suppress(AttributeError, OSError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), _WRITER_NICE)
