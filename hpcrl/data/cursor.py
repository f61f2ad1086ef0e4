"""Resumable prompt order: a data cursor (epoch, index, seed) and a sampler that follows it.

The order of epoch e is a permutation drawn from `seed + e`, so (epoch, index, seed) alone restores the
exact stream after a restart; the checkpoint stores `DataCursor.to_dict()`.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass
class DataCursor:
    epoch: int = 0
    """Epochs completed."""
    index: int = 0
    """Position inside the current epoch's permutation."""
    seed: int = 0
    """Base seed of the per-epoch shuffles."""

    def to_dict(self) -> dict[str, int]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> DataCursor:
        unknown = set(data) - {"epoch", "index", "seed"}
        if unknown:
            raise ValueError(f"data cursor has unknown keys {sorted(unknown)}")
        return cls(int(data["epoch"]), int(data["index"]), int(data["seed"]))


class PromptSampler(Generic[T]):
    """Batches of rows in shuffled epochs; a batch that crosses an epoch end continues in the next one."""

    def __init__(self, rows: Sequence[T], cursor: DataCursor):
        if not rows:
            raise ValueError("cannot sample from an empty dataset")
        self.rows = rows
        self.cursor = cursor
        self._order = self._permutation(cursor.epoch)

    def _permutation(self, epoch: int) -> list[int]:
        order = list(range(len(self.rows)))
        random.Random(self.cursor.seed * 1_000_003 + epoch).shuffle(order)
        return order

    def next_batch(self, size: int) -> list[T]:
        batch: list[T] = []
        while len(batch) < size:
            if self.cursor.index >= len(self._order):
                self.cursor.epoch += 1
                self.cursor.index = 0
                self._order = self._permutation(self.cursor.epoch)
            batch.append(self.rows[self._order[self.cursor.index]])
            self.cursor.index += 1
        return batch
