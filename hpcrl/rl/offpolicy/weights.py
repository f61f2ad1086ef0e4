"""The actor's weights across the async placement's two pools: versions sent, double-buffered, swapped.

Version v = the weights after v updates (the initial weights are version 0). After each update the
training ranks send their shards of version v+1 through the cross-pool transfer (helper
hpcrl.reshard.cross_pool_transfer: every receiver gets exactly its generation shard, once).

On the rollout pool the engine holds the *front* version; the next one is received into a separate *back*
buffer by a background thread while the engine keeps generating with the front (so the transfer overlaps
generation). `swap(v)` waits until version v is completely received and only then loads the back buffer
into the engine (through the same per-engine loader as the colocated hand-off, hpcrl.rl.handoff.
shard_loader): a half-written weight is never used, and the version each batch is generated with is fixed
by the schedule, never by timing (hpcrl.rl.offpolicy.driver).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future

import torch

from hpcrl.reshard.convert import NamedShard
from hpcrl.reshard.cross_pool_transfer import CrossPoolTransfer


class _BackgroundReceiver:
    """One daemon thread that runs receives one at a time. A daemon, so that a job failing elsewhere
    exits at once instead of waiting for a receive whose sender is gone (the transfer's group timeout)."""

    def __init__(self, receive: Callable[[], int], device: torch.device):
        self._receive, self._device = receive, device
        self._jobs: queue.SimpleQueue[Future | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="weights-receive", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        if self._device.type == "cuda":  # the current CUDA device is per thread: the buffer's, for NCCL
            torch.cuda.set_device(self._device)
        while (future := self._jobs.get()) is not None:
            try:
                future.set_result(self._receive())
            except BaseException as err:  # noqa: BLE001 - handed to the caller through the future
                future.set_exception(err)

    def submit(self) -> Future:
        future: Future = Future()
        self._jobs.put(future)
        return future

    def stop(self) -> None:
        self._jobs.put(None)


class WeightSender:
    """A training rank's WeightSync (hpcrl.rl.weight_sync): send this rank's training shards as version
    `version` to the rollout pool.

    `params()` returns {global Megatron name: this rank's training shard}, read at send time (the
    parameters themselves; the send completes before the next optimizer step writes them)."""

    def __init__(self, transfer: CrossPoolTransfer, params: Callable[[], Mapping[str, torch.Tensor]]):
        self.transfer, self.params = transfer, params

    def publish(self, version: int) -> dict[str, float]:
        start = time.perf_counter()
        sent = self.transfer.send(self.params())
        return {
            "weights/version_sent": float(version),
            "weights/bytes_sent": float(sent),
            "time/transfer_s": time.perf_counter() - start,
        }


class DoubleBufferedWeights:
    """A rollout rank's side: the engine's weights (front, `version`) and a back buffer for the next.

    `back`: {name: generation-shard tensor} to receive into (CrossPoolTransfer.allocate), owned here.
    `load`: puts a NamedShard into the engine (hpcrl.rl.handoff.shard_loader). One receive is in
    flight at most; every rank of the rollout pool follows the same schedule."""

    def __init__(
        self,
        transfer: CrossPoolTransfer,
        back: dict[str, torch.Tensor],
        load: Callable[[NamedShard], int],
    ):
        self.transfer, self.back, self.load = transfer, back, load
        self.version: int | None = None
        """The version the engine generates with (None: no weights received yet)."""
        self._pending: tuple[int, Future] | None = None
        self._receiver: _BackgroundReceiver | None = None

    @property
    def receiving(self) -> int | None:
        """The version being received into the back buffer (None: no receive in flight)."""
        return None if self._pending is None else self._pending[0]

    def start_receive(self, version: int) -> None:
        """Post the receive of `version` into the back buffer and return; the engine keeps the front."""
        if self._pending is not None:
            raise RuntimeError(f"version {self._pending[0]} is still being received; swap before {version}")
        if self._receiver is None:
            device = next(iter(self.back.values())).device
            self._receiver = _BackgroundReceiver(lambda: self.transfer.receive(self.back), device)
        self._pending = (version, self._receiver.submit())

    def wait_received(self, timeout_s: float | None = None) -> bool:
        """Block until the receive in flight is complete (or `timeout_s` passed); True when it is. The
        engine still generates with the front: only `swap` changes its weights."""
        if self._pending is None:
            return True
        done = threading.Event()
        self._pending[1].add_done_callback(lambda _: done.set())
        return done.wait(timeout_s)

    def swap(self, version: int) -> dict[str, float]:
        """Wait until `version` is completely in the back buffer, then load it into the engine."""
        if self._pending is None or self._pending[0] != version:
            raise RuntimeError(f"swap to version {version}, but the receive in flight is {self.receiving}")
        start = time.perf_counter()
        _, future = self._pending
        received = future.result()  # re-raises the transfer's error (a dead peer: its timeout)
        self._pending = None
        waited = time.perf_counter() - start
        tensors = self.load(NamedShard(self.back))
        self.version = version
        return {
            "weights/bytes_received": float(received),
            "weights/tensors": float(tensors),
            "time/weights_wait_s": waited,
            "time/swap_s": time.perf_counter() - start - waited,
        }

    def receive_now(self, version: int) -> dict[str, float]:
        """Receive `version` and load it before returning (the first weights of a run or a resume)."""
        self.start_receive(version)
        return self.swap(version)

    def close(self, wait: bool = True) -> None:
        """Stop the receive thread. `wait`: first let a receive in flight finish (a run that ended well:
        its sender already sent it, and the process group must outlive it); a failed run does not wait."""
        try:
            if wait and self._pending is not None:
                self._pending[1].result()
                self._pending = None
        finally:
            if self._receiver is not None:
                self._receiver.stop()
                self._receiver = None
