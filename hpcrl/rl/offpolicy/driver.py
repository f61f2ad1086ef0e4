"""The async placement's step: the rollout pool generates the next batches while the training pool updates.

Asynchronous (off-policy) RL on two disjoint pools, as verl's one-step-off-policy recipe (verl PR #2231),
AReaL (Fu et al. 2025) and PipelineRL do: with m = `placement.max_off_policy_steps`, the batch trained at
step j is generated with weight version max(0, j - m) (version v = the weights after v updates), so every
sample's version lag (trained at step k with the weights of version k) is at most m, asserted at every
step and logged (async/version_lag_max). m = 0 is the colocated run's schedule exactly; m = 1 overlaps
the generation of batch k+1 with the update on batch k.

  rollout pool, step k                              training pool, step k
  1. swap to v_k (received during step k-1)         1. batch k not held yet (m = 0, first step): receive
  2. start receiving v_{k+1} into the back buffer   2. train on batch k  ->  v_{k+1}
  3. evaluate the held-out prompts on v_k, if due   3. send v_{k+1} (cross-pool transfer)
  4. batch k not sent yet: collect + send it        4. m >= 1: receive batch k+m
  5. m >= 1: collect batch k+m with v_k, send it
Both pools make the same decisions from the same counters, so every message is received where it is
sent. The rollout pool always keeps m batches in flight (a run extended to more steps continues exactly).

The loss on off-policy samples is the decoupled PPO objective (Hilton et al. 2022, "Batch size-invariance
for policy optimization", eq. 4; AReaL §5.2): the PPO ratio is taken against the proximal policy pi_old
(the actor's log-probs recomputed at version k, driver `_prepare`), and each token is weighted by the
truncated importance weight min(pi_old / pi_behav, C) (hpcrl.rl.losses.truncated_is_weights; Yao et al.
2025, eq. 3), where pi_behav is the rollout engine's log-prob at the version the sample was generated
with. One weight corrects both the staleness and the engine's numerics.

Exactly-once state (hpcrl.stages.checkpointing, key "async"): the weight version, the next batch index and
the in-flight batches (held by the training pool, saved as one tensor: hpcrl.rl.offpolicy.channel); the data
cursor saved is the rollout's, after the last batch it produced.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from hpcrl.ckpt.manifest import Manifest
from hpcrl.ckpt.shards import ShardedTensor, ShardSpec
from hpcrl.data.cursor import DataCursor
from hpcrl.errors import ConfigError, Problem
from hpcrl.rl.collector import Collector, RolloutBatch
from hpcrl.rl.learner import Learner
from hpcrl.rl.offpolicy.channel import (
    VERSION_KEY,
    BatchChannel,
    RolloutMessage,
    decode_batches,
    encode_batches,
)
from hpcrl.rl.offpolicy.weights import DoubleBufferedWeights
from hpcrl.rl.timing import PhaseTimer, timing_metrics
from hpcrl.rl.weight_sync import WeightSync
from hpcrl.stages.stateful import DataCursorState

if TYPE_CHECKING:
    from hpcrl.train.trainer import Trainer

STATE_KEY = "async"
"""RunState.algorithm_state key of the async placement's state."""
INFLIGHT = "async.inflight"
"""Checkpoint tensor of the in-flight batches (uint8, hpcrl.rl.offpolicy.channel.encode_batches)."""


@dataclass
class AsyncState:
    """The counters both pools keep in step (and the checkpoint restores)."""

    max_off_policy_steps: int
    next_batch: int = 0
    """Index of the next batch the rollout pool will produce (batches below it were sent)."""
    started: int | None = None
    """Step at which this process's run started (the first weights crossed); None before."""

    def to_json(self, version: int) -> dict[str, int]:
        return {
            "weight_version": version,
            "next_batch": self.next_batch,
            "max_off_policy_steps": self.max_off_policy_steps,
        }

    def restore(self, step: int, saved: dict[str, Any] | None) -> None:
        """The counters of a checkpoint taken after `step` steps (None: a checkpoint without them, e.g.
        the end of another placement's run: nothing in flight)."""
        if saved is None:
            self.next_batch = step
            return
        m = saved.get("max_off_policy_steps")
        if m != self.max_off_policy_steps or saved.get("weight_version") != step:
            raise ConfigError(
                Problem(
                    f"the checkpoint of step {step} was written with max_off_policy_steps={m} at weight "
                    f"version {saved.get('weight_version')}; this run has {self.max_off_policy_steps}",
                    key="placement.max_off_policy_steps",
                )
            )
        self.next_batch = int(saved["next_batch"])


@dataclass
class CursorMirror:
    """The rollout pool's data position as the training pool knows it (from each message): what the
    training pool's rank 0 saves as the checkpoint's data cursor. It never samples."""

    rows: list
    cursor: DataCursor


def _version_lag(step: int, batch: RolloutBatch, limit: int) -> dict[str, float]:
    """Lag of every sample of `batch` trained at `step`; an error beyond `limit` (a broken schedule)."""
    versions = batch.exp.tensors.get(VERSION_KEY, torch.full((len(batch.exp),), batch.version))
    lag = step - versions
    if len(lag) and (int(lag.max()) > limit or int(lag.min()) < 0):
        raise RuntimeError(f"step {step}: version lag {lag.min()}..{lag.max()} outside [0, {limit}]")
    return {
        "async/version_lag_max": float(lag.max()) if len(lag) else 0.0,
        "async/version_lag_mean": float(lag.double().mean()) if len(lag) else 0.0,
        "async/batch_version": float(batch.version),
    }


class AsyncTrainDriver:
    """The training pool's side: train on the batch of this step, send the new weights, take the next."""

    key = STATE_KEY

    def __init__(
        self,
        learner: Learner,
        channel: BatchChannel,
        weight_sync: WeightSync,
        max_off_policy_steps: int,
        sampler: CursorMirror,
    ):
        self.learner, self.channel, self.weight_sync = learner, channel, weight_sync
        self.state = AsyncState(max_off_policy_steps)
        self.queue: dict[int, RolloutBatch] = {}
        self.sampler = sampler
        self.version = 0
        """Weight version of the actor (updates applied)."""

    def trainers(self) -> dict[str, Trainer]:
        """The trainers checkpointed on this rank, by prefix."""
        return self.learner.models.trainers()

    def data_cursor(self) -> DataCursorState:
        """The rollout pool's data position as this pool last heard it: what rank 0 saves."""
        return DataCursorState(self)

    def _start(self, step: int) -> None:
        """First step (or final evaluation) of this process: the rollout pool gets this version."""
        if self.state.started is None:
            self.weight_sync.publish(step)
            self.state.started, self.version = step, step

    def _receive(self, timer: PhaseTimer) -> RolloutMessage:
        with timer.phase("wait"):
            message = self.channel.receive()
        for batch in message.batches:
            self.queue[batch.index] = batch
            self.state.next_batch = batch.index + 1
        self.sampler = CursorMirror(self.sampler.rows, DataCursor.from_dict(message.cursor))
        return message

    def step(self, step: int) -> dict[str, float]:
        self._start(step)
        start, timer, messages = time.perf_counter(), PhaseTimer(), []
        m = self.state.max_off_policy_steps
        if step not in self.queue:
            messages.append(self._receive(timer))
        batch = self.queue.pop(step)
        metrics: dict[str, float] = {"step": step} | batch.metrics
        metrics |= {f"time/{phase}_s": seconds for phase, seconds in batch.seconds.items()}
        metrics |= _version_lag(step, batch, m)
        tokens = self.learner.train(step, batch, timer, metrics)
        with timer.phase("transfer"):
            metrics |= self.weight_sync.publish(step + 1)
        self.version = step + 1
        if m >= 1:
            messages.append(self._receive(timer))
        heldout = [msg.heldout for msg in messages if msg.heldout is not None]
        if heldout:
            metrics |= heldout[0]
        timing = timing_metrics(timer, *tokens)
        timing = {k: v for k, v in timing.items() if not k.startswith(("share/", "tps/generate"))}
        return (
            metrics
            | timing
            | {
                "time/step_s": time.perf_counter() - start,
                "time/rollout_busy_s": sum(msg.busy_s for msg in messages),
                "async/inflight": float(len(self.queue)),
            }
        )

    def final_evaluation(self, step: int) -> dict[str, float]:
        """Held-out reward of the final weights: evaluated by the rollout pool, received here."""
        self._start(step)
        message = self.channel.receive()
        return {"step": step} | (message.heldout or {})

    # ------------------------------------------------------------------------- checkpointed state
    def checkpoint_state(self) -> dict[str, int]:
        return self.state.to_json(self.version)

    def checkpoint_shards(self) -> list[ShardedTensor]:
        blob = encode_batches([self.queue[j] for j in sorted(self.queue)])
        return [ShardedTensor(INFLIGHT, blob, tuple(blob.shape), (0,))]

    def checkpoint_specs(self, manifest: Manifest) -> list[ShardSpec]:
        if INFLIGHT not in manifest.tensors:
            return []
        shape = tuple(manifest.tensors[INFLIGHT].global_shape)
        return [ShardSpec(INFLIGHT, shape, (0,), shape, "uint8")]

    def restore(self, step: int, saved: dict[str, Any] | None, tensors: dict[str, torch.Tensor]) -> None:
        self.state.restore(step, saved)
        batches = decode_batches(tensors[INFLIGHT]) if saved is not None and INFLIGHT in tensors else []
        self.queue = {b.index: b for b in batches}
        if sorted(self.queue) != list(range(step, self.state.next_batch)):
            raise ValueError(
                f"checkpoint of step {step}: in-flight batches {sorted(self.queue)}, expected "
                f"{list(range(step, self.state.next_batch))}"
            )
        self.version = step

    def close(self, wait: bool = True) -> None:
        """Nothing runs in the background on the training pool."""


class AsyncRolloutDriver:
    """The rollout pool's side: swap to the newest version, collect the batches due, send them."""

    key = STATE_KEY

    def __init__(
        self,
        collector: Collector,
        channel: BatchChannel | None,
        weights: DoubleBufferedWeights,
        max_off_policy_steps: int,
        eval_every: int,
    ):
        self.collector, self.weights = collector, weights
        self.channel = channel
        """None on rollout ranks other than the first (which sends for the pool)."""
        self.state = AsyncState(max_off_policy_steps)
        self.eval_every = eval_every

    def trainers(self) -> dict[str, Trainer]:
        """None on the rollout pool: its engine receives the weights every step."""
        return {}

    def data_cursor(self) -> DataCursorState:
        """The collector's sampler, which this pool draws prompts from."""
        return DataCursorState(self.collector)

    def _start(self, step: int) -> None:
        if self.state.started is None:
            self.weights.receive_now(step)
            self.state.started = step

    def _swap_to(self, version: int, timer: PhaseTimer) -> dict[str, float]:
        if self.weights.version == version:
            return {}
        with timer.phase("swap"):
            return self.weights.swap(version)

    def step(self, step: int) -> dict[str, float]:
        self._start(step)
        timer = PhaseTimer()
        metrics: dict[str, float] = {"step": step} | self._swap_to(step, timer)
        self.weights.start_receive(step + 1)  # overlaps this step's generation
        heldout = None
        if self.eval_every and step % self.eval_every == 0:
            with timer.phase("eval"):
                heldout = self.collector.evaluate(step)
        sent = 0
        if self.state.next_batch <= step:  # m = 0, or the first step: the batch trained now
            sent += self._produce(step, step, timer, heldout)
            heldout = None
        if self.state.max_off_policy_steps >= 1:
            sent += self._produce(step + self.state.max_off_policy_steps, step, timer, heldout)
        return metrics | {"weights/version": float(self.weights.version), "async/batches_sent": float(sent)}

    def _produce(self, last: int, step: int, timer: PhaseTimer, heldout: dict[str, float] | None) -> int:
        """Collect batches next_batch..last with the front weights (version `step`) and send them in
        one message with this step's busy time so far; returns how many."""
        if self.weights.version != step:
            raise RuntimeError(f"step {step}: the rollout engine holds version {self.weights.version}")
        batches = []
        while self.state.next_batch <= last:
            index = self.state.next_batch
            batch_timer = PhaseTimer()
            batch = self.collector.collect(index, step, batch_timer)
            batch.exp.tensors[VERSION_KEY] = torch.full((len(batch.exp),), step, dtype=torch.int64)
            batches.append(batch)
            self.state.next_batch += 1
            for phase, seconds in batch_timer.seconds.items():
                timer.seconds[phase] = timer.seconds.get(phase, 0.0) + seconds
        busy = sum(timer.seconds.values())
        timer.seconds.clear()  # the next message of this step counts its own work
        if self.channel is not None:
            self.channel.send(RolloutMessage(batches, self.collector.sampler.cursor.to_dict(), heldout, busy))
        return len(batches)

    def final_evaluation(self, step: int) -> dict[str, float]:
        """Held-out reward of the final weights (those of the last update), sent to the training pool."""
        self._start(step)
        timer = PhaseTimer()
        self._swap_to(step, timer)
        heldout = self.collector.evaluate(step)
        if self.channel is not None:
            self.channel.send(
                RolloutMessage(
                    [], self.collector.sampler.cursor.to_dict(), heldout, timer.seconds.get("swap", 0.0)
                )
            )
        return {"step": step} | heldout

    # ------------------------------------------------------------------------- checkpointed state
    def checkpoint_state(self) -> dict[str, int]:
        """This pool's view (rank 0, a training rank, writes the checkpoint's): the training pool's version
        is the one being received (or, between a run's steps and its end, the one loaded)."""
        latest = self.weights.receiving if self.weights.receiving is not None else self.weights.version
        return self.state.to_json(latest or 0)

    def checkpoint_shards(self) -> list[ShardedTensor]:
        return []  # the training pool holds the in-flight batches

    def checkpoint_specs(self, manifest: Manifest) -> list[ShardSpec]:
        return []

    def restore(self, step: int, saved: dict[str, Any] | None, tensors: dict[str, torch.Tensor]) -> None:
        self.state.restore(step, saved)

    def close(self, wait: bool = True) -> None:
        """Stop the background receive (`wait`: let one in flight finish first; see DoubleBufferedWeights)."""
        self.weights.close(wait)
