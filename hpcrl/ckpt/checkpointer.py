"""`Checkpointer`: save (sync or async) and load sharded checkpoints under one root directory.

Async saves: `save()` first waits for the previous save (at most one in flight: the next save WAITS for
it rather than being refused, so no requested checkpoint is silently dropped; a failure of the previous
save is raised there), runs the collective planning step, copies every local tensor into host buffers
owned by the checkpointer (reused between saves — a later in-place optimizer step cannot leak into the
save), and returns. A background thread writes the rank file; on rank 0 it also commits. A failing
background save is never committed and its error is raised by the next `save()`, `wait()` or `close()`.
The background thread makes no collective calls, so training may use the same process group meanwhile.
"""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from hpcrl.ckpt.collectives import group_rank
from hpcrl.ckpt.commit import prune, remove_leftovers, tmp_dir
from hpcrl.ckpt.config import CheckpointConfig
from hpcrl.ckpt.load import Loaded, load_checkpoint
from hpcrl.ckpt.manifest import CheckpointError
from hpcrl.ckpt.plan import plan_save
from hpcrl.ckpt.save import SaveJob, abort_save, commit_save, run_sync, write_rank
from hpcrl.ckpt.shards import ShardedTensor, ShardSpec
from hpcrl.ckpt.state import RunState, capture_rng

_WRITER_NICE = 10


class Checkpointer:
    """One per rank. `group` is the process group whose ranks save together (None: this process alone)."""

    def __init__(
        self,
        root: str | Path,
        *,
        group: dist.ProcessGroup | None = None,
        keep_last: int = 2,
        async_save: bool = False,
        timeout_s: float = 600.0,
    ) -> None:
        if keep_last < 1:
            raise ValueError(f"keep_last must be >= 1, got {keep_last}")
        self.root = Path(root)
        self.group = group
        self.keep_last = keep_last
        self.async_save = async_save
        self.timeout_s = timeout_s
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._committed: Path | None = None
        self._buffers: dict[str, torch.Tensor] = {}

    def save(
        self,
        step: int,
        shards: list[ShardedTensor],
        state: RunState,
        layout: dict[str, Any] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        """Save `shards` and `state` as step `step` (collective over the group). `layout` and `extra`
        (JSON, e.g. model configs for export; rank 0's is used) go into the manifest."""
        if state.step != step:
            raise ValueError(f"state.step is {state.step}, saving step {step}")
        self.wait()
        plan = plan_save(shards, self.group)
        if plan.rank == 0:  # a crash may have left tmp dirs, unpublished dirs, or skipped the last prune
            remove_leftovers(self.root, keep=tmp_dir(self.root, step, plan.token))
            prune(self.root, self.keep_last, plan.token)
        tensors = {s.name: s.data for s in shards}
        if self.async_save:
            tensors = self._snapshot(tensors)
        job = SaveJob(
            self.root,
            plan,
            tensors,
            state,
            capture_rng(),
            dict(layout or {}),
            self.keep_last,
            self.timeout_s,
            dict(extra or {}),
        )
        if not self.async_save:
            self._committed = run_sync(job, self.group)
            return
        self._thread = threading.Thread(target=self._background, args=(job,), name=f"ckpt-save-{step}")
        self._thread.start()

    def wait(self) -> Path | None:
        """Block until the save in flight finished; raise its error. Returns the last committed dir (rank 0)."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise CheckpointError(f"background save failed: {error}") from error
        return self._committed

    def close(self) -> None:
        self.wait()
        self._buffers.clear()

    def load(
        self, specs: list[ShardSpec], *, fallback: bool = False, expect_run_id: str | None = None
    ) -> Loaded:
        """Load the newest verified checkpoint under this root into tensors shaped by `specs`."""
        self.wait()
        return load_checkpoint(
            self.root, specs, group=self.group, fallback=fallback, expect_run_id=expect_run_id
        )

    @classmethod
    def from_config(
        cls, cfg: CheckpointConfig, run_dir: str | Path, group: dist.ProcessGroup | None
    ) -> Checkpointer:
        root = Path(cfg.dir) if cfg.dir else Path(run_dir) / "checkpoints"
        return cls(
            root, group=group, keep_last=cfg.keep_last, async_save=cfg.async_save, timeout_s=cfg.timeout_s
        )

    @property
    def rank(self) -> int:
        return group_rank(self.group)

    def _snapshot(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        snapshot = {}
        for name, tensor in tensors.items():
            buffer = self._buffers.get(name)
            if buffer is None or buffer.shape != tensor.shape or buffer.dtype != tensor.dtype:
                # pinned host memory makes device-to-host snapshot copies fast on GPUs
                buffer = torch.empty(
                    tensor.shape, dtype=tensor.dtype, device="cpu", pin_memory=tensor.is_cuda
                )
                self._buffers[name] = buffer
            buffer.copy_(tensor.detach())
            snapshot[name] = buffer
        for stale in self._buffers.keys() - tensors.keys():
            del self._buffers[stale]
        return snapshot

    def _background(self, job: SaveJob) -> None:
        # Linux: a thread's nice value is its own. The writer yields the CPU to training; it mostly waits
        # on the disk anyway. Best effort (other platforms: no-op).
        with contextlib.suppress(AttributeError, OSError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), _WRITER_NICE)
        try:
            write_rank(job)
            if job.plan.rank == 0:
                self._committed = commit_save(job)
        except BaseException as err:
            self._error = err
            if job.plan.rank == 0:
                abort_save(job)
