"""What a stage checkpoints: a list of `Stateful`s, each component registering its own (torchtitan's
`CheckpointManager` over `Stateful`s), so a new component (an environment's state, an adapter) adds a
Stateful instead of a line in the checkpointing code.

A Stateful's JSON goes to `RunState.algorithm_state[key]` (rank 0's is committed; None: nothing to
record this time), its tensors are shards; on resume it names the tensors it wants from a candidate
(`checkpoint_specs`, which may also reject the candidate by raising: every rank then moves on to an older
one together) and gets them back with its JSON in `restore`. The data cursor's JSON has its own field,
`RunState.data_cursor` (DATA_CURSOR below): the format every checkpoint so far was written in.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from hpcrl.ckpt.manifest import Manifest
from hpcrl.ckpt.megatron import load_into_trainer, trainer_shards, trainer_specs
from hpcrl.ckpt.shards import ShardedTensor, ShardSpec
from hpcrl.data.cursor import DataCursor

if TYPE_CHECKING:
    import torch

    from hpcrl.train.trainer import Trainer

DATA_CURSOR = "data_cursor"
"""The key of the data cursor's Stateful; its JSON is `RunState.data_cursor`, not in algorithm_state."""
LOSS_SCALE = "loss_scale"
"""RunState.algorithm_state key: {trainer prefix: its fp16 loss-scale state} (absent without fp16)."""


class Stateful(Protocol):
    """One component's checkpointed state (see the module docstring)."""

    key: str

    def checkpoint_state(self) -> dict[str, Any] | None: ...

    def checkpoint_shards(self) -> list[ShardedTensor]: ...

    def checkpoint_specs(self, manifest: Manifest) -> list[ShardSpec]: ...

    def restore(self, step: int, saved: dict[str, Any] | None, tensors: dict[str, torch.Tensor]) -> None:
        """Continue after `step` completed steps from `saved` (None: the checkpoint has no such state)
        and the loaded `tensors` (those its `checkpoint_specs` asked for)."""


class TrainerStates:
    """The trainers of this rank by prefix ("actor." / "critic."): parameters and AdamW state as shards
    (hpcrl.ckpt.megatron's naming), an fp16 trainer's loss-scale state as JSON."""

    key = LOSS_SCALE

    def __init__(self, trainers: dict[str, Trainer]):
        self.trainers = dict(trainers)

    def checkpoint_state(self) -> dict[str, Any] | None:
        scales = {prefix: s for prefix, t in self.trainers.items() if (s := t.scaler_state())}
        return scales or None

    def checkpoint_shards(self) -> list[ShardedTensor]:
        return [s for prefix, t in self.trainers.items() for s in trainer_shards(t, prefix)]

    def checkpoint_specs(self, manifest: Manifest) -> list[ShardSpec]:
        """This rank's shards of every trainer, in the candidate's optimizer dtypes."""
        return [s for prefix, t in self.trainers.items() for s in trainer_specs(t, manifest, prefix)]

    def restore(self, step: int, saved: dict[str, Any] | None, tensors: dict[str, torch.Tensor]) -> None:
        for prefix, trainer in self.trainers.items():
            load_into_trainer(trainer, tensors, prefix)
        for prefix, trainer in self.trainers.items():
            trainer.load_scaler_state((saved or {}).get(prefix, {}))


class Sampler(Protocol):
    """Rows and a cursor into them, made from the two (PromptSampler; the async mirror of one)."""

    rows: Any
    cursor: DataCursor

    def __init__(self, rows: Any, cursor: DataCursor) -> None: ...


class SamplerOwner(Protocol):
    """The object whose `sampler` walks the training data (the RL or DPO driver); resume replaces it."""

    sampler: Sampler


class DataCursorState:
    """Where `owner.sampler` is in its data: the epoch, the position and the shuffle seed."""

    key = DATA_CURSOR

    def __init__(self, owner: SamplerOwner):
        self.owner = owner

    def checkpoint_state(self) -> dict[str, Any]:
        return self.owner.sampler.cursor.to_dict()

    def checkpoint_shards(self) -> list[ShardedTensor]:
        return []

    def checkpoint_specs(self, manifest: Manifest) -> list[ShardSpec]:
        """No tensors; the candidate's cursor is parsed here, so one this job cannot use rejects the
        candidate on every rank (the loader's agreed fallback) instead of failing this rank after the load."""
        DataCursor.from_dict(manifest.state.get(DATA_CURSOR, {}))
        return []

    def restore(self, step: int, saved: dict[str, Any] | None, tensors: dict[str, torch.Tensor]) -> None:
        """The owner's sampler, of its own kind (a PromptSampler, or the async training pool's mirror of
        the rollout pool's position), over the same rows at the saved position."""
        sampler = self.owner.sampler
        self.owner.sampler = type(sampler)(sampler.rows, DataCursor.from_dict(saved or {}))
