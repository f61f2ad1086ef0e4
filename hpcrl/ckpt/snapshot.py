"""The host snapshot of an async save, its fence, and the guard against in-place writes that skip the fence.

An async save copies the saved tensors to host memory in a background thread (torch copies release the
GIL), so `Checkpointer.save()` returns after planning only. Until that copy is done the caller must not
write the saved tensors in place: `fence()` blocks until it is (Megatron's and torch DCP's async saves
have the same rule). The RL and DPO trainers call it right before each optimizer step, the first
in-place write of parameters and optimizer state in a step.

Safety net (a forgotten fence must never commit torn or stale weights): `save()` records every saved
tensor's `_version` (torch's in-place write counter, shared by views and `.detach()`; it moves when a
write has finished). A save fails — never committed, `latest` untouched — when a version moved
  - by the end of the copy (any thread's write that finished meanwhile), or
  - before this rank's file is published, unless the caller fenced first, or
  - by the time the caller fences (`fence()` / `wait()`), unless the file was already published.
A write issued by the caller's thread has finished before the caller's next call, so an unfenced one
fails the save unless it was still running when the file was published (one in-place op outlasting the
copy, write and fsync of the whole file); found after publication, it logs a warning. Blind spot: a
write through an alias with its own counter (`t.data.add_(...)`, or storage shared after `p.data = view`)
does not move the saved tensor's version; fence before those as well.
"""

from __future__ import annotations

import logging
import threading

import torch

from hpcrl.ckpt.manifest import CheckpointError

log = logging.getLogger(__name__)


def _version(tensor: torch.Tensor) -> int | None:
    """The in-place write counter (None for inference tensors, which have none: `Checkpointer.save`
    hands in private copies of those)."""
    return None if tensor.is_inference() else tensor._version


class HostBuffers:
    """Host buffers of the snapshot, kept across saves of the same tensors (no page faults of fresh
    memory after the first save; pinned when the source is on a GPU, for fast device-to-host copies)."""

    def __init__(self) -> None:
        self._buffers: dict[str, torch.Tensor] = {}

    def copy(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        snapshot = {}
        for name, tensor in tensors.items():
            buffer = self._buffers.get(name)
            if buffer is None or buffer.shape != tensor.shape or buffer.dtype != tensor.dtype:
                buffer = torch.empty(
                    tensor.shape, dtype=tensor.dtype, device="cpu", pin_memory=tensor.is_cuda
                )
                self._buffers[name] = buffer
            buffer.copy_(tensor.detach())
            snapshot[name] = buffer
        for stale in self._buffers.keys() - tensors.keys():
            del self._buffers[stale]
        return snapshot

    def clear(self) -> None:
        self._buffers.clear()


class InFlightSave:
    """One async save from `save()` until its thread ended: the fence and the write guard (module doc)."""

    def __init__(self, step: int, tensors: dict[str, torch.Tensor]) -> None:
        self.step = step
        self.sources = tensors
        self.versions = {name: _version(t) for name, t in tensors.items()}
        self.snapshot_done = threading.Event()
        self._lock = threading.Lock()
        self._fenced = False
        self._published = False
        self._violation: str | None = None

    def _written(self) -> str | None:
        for name, tensor in self.sources.items():
            if self.versions[name] is not None and tensor._version != self.versions[name]:
                return name
        return None

    def _message(self, name: str, when: str) -> str:
        return (
            f"tensor {name!r} was written in place {when} of the async save of step {self.step}: the "
            f"checkpoint could hold torn or stale values, so this save fails and is not committed. "
            f"Call Checkpointer.fence() before writing saved tensors in place (a trainer: "
            f"add_pre_step_hook(checkpointer.fence))"
        )

    def check_copied(self) -> None:
        """Writer thread, right after the copy: raise if a saved tensor changed while it was copied."""
        name = self._written()
        if name is not None:
            raise CheckpointError(self._message(name, "while the background thread copied it (no fence)"))

    def fence(self) -> None:
        """Caller's thread: wait for the snapshot; an unfenced write before this call fails the save."""
        self.snapshot_done.wait()
        with self._lock:
            if self._fenced:
                return
            self._fenced = True
            name = self._written()
            if name is None:
                return
            if self._published:
                log.warning(
                    "tensor %r was written in place before Checkpointer.fence(), after the save of step %d "
                    "had been written (that checkpoint is intact); fence before in-place writes",
                    name,
                    self.step,
                )
            else:
                self._violation = self._message(name, "before Checkpointer.fence()")

    def seal(self) -> None:
        """Writer thread, before this rank publishes its file: raise if an unfenced write happened."""
        with self._lock:
            if self._violation is not None:
                raise CheckpointError(self._violation)
            if not self._fenced:
                name = self._written()
                if name is not None:
                    raise CheckpointError(self._message(name, "before Checkpointer.fence()"))
            self._published = True
