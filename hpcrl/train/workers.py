"""A model trainer as a worker group over the data-parallel ranks of its pool, and the pool itself.

HybridFlow's transfer protocols (§4.2) as small classes, no role flags: a caller hands a GLOBAL batch to a
worker; the worker gives each data-parallel rank its share (`dispatch`), runs, and gathers the results back
into a global batch on every rank (`collect`). All ranks run the same code (the single controller is
replicated; without Ray, SPMD is how torch.distributed jobs run), so every rank sees the same global
tensors and takes the same decisions. Every stage that trains uses it: RL's actor, reference and critic
(hpcrl.rl.workers), the offline stages' policy, reference and reward model (hpcrl.posttrain).

Placement (HybridFlow's resource pools, §4.1): a worker group lives on a `Pool` of ranks. Colocated, every
pool is the whole world and `collect` already leaves the global result on every rank. Split, each role's
pool is a disjoint block of ranks; ranks outside a pool hold a stand-in of that worker (no engine, no
model) that only takes part in the hand-over: the pool's first rank broadcasts the collected result over
the default group (`Pool.share`), so the single-controller code runs unchanged on every rank.

Shape legend: B = sequences (global unless named local), S = sequence tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from hpcrl.train.batch import TrainBatch
from hpcrl.train.logprobs import HeadOutputs
from hpcrl.train.pipeline import LossFn
from hpcrl.train.token_budget import balance_over_ranks, imbalance


@dataclass(frozen=True)
class Shards:
    """`size` replicas over a process group; this rank serves replica `index`."""

    index: int
    size: int
    group: dist.ProcessGroup | None = None
    """Group over which `collect` gathers (None: a single process, nothing to gather)."""

    def bounds(self, n: int) -> tuple[int, int]:
        """This replica's contiguous share of n items (the first n % size replicas get one more)."""
        base, extra = divmod(n, self.size)
        start = self.index * base + min(self.index, extra)
        return start, start + base + (1 if self.index < extra else 0)

    def collect(self, local: object) -> list:
        """Every rank's `local` in group order (all ranks of `group` call it)."""
        if self.group is None or dist.get_world_size(self.group) == 1:
            return [local]
        out: list = [None] * dist.get_world_size(self.group)
        dist.all_gather_object(out, local, group=self.group)
        return out


@dataclass(frozen=True)
class Pool:
    """Ranks [start, start + size) of the default group that host one role (a resource pool)."""

    start: int
    size: int
    world: int

    @classmethod
    def everywhere(cls, world: int) -> Pool:
        return cls(0, world, world)

    def __contains__(self, rank: int) -> bool:
        return self.start <= rank < self.start + self.size

    @property
    def spans_world(self) -> bool:
        return self.start == 0 and self.size == self.world

    def share(self, local: object) -> object:
        """The pool's result on every rank of the world (all ranks call it; members pass their result,
        which is the same on every member after `Shards.collect`, others pass None)."""
        if self.spans_world:
            return local
        box = [local]
        dist.broadcast_object_list(box, src=self.start)
        return box[0]


@dataclass
class Pending:
    """A worker group's result, computed on its pool but not yet handed to the other ranks.

    `result()` is the hand-over (a collective over the default group when pools are split): every rank
    calls it, in the same order. Starting several roles' work before taking any result lets disjoint
    pools compute at the same time (the critic updates while the actor does, HybridFlow §4.1); colocated,
    the work simply runs one role after the other and `result()` costs nothing.
    """

    local: object
    share: Callable[[object], object]
    wrap: Callable[[object], object] | None = None

    def result(self):
        shared = self.share(self.local)
        return shared if self.wrap is None else self.wrap(shared)


def _cat_dicts(parts: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    return {k: torch.cat([p[k] for p in parts]) for k in parts[0]}


class TrainerWorker:
    """A megatron trainer (actor, reference or critic) over the training DP ranks of its pool.

    `forward` dispatches the global batch by DP rank, runs the trainer, and collects the outputs over the
    DP group, so every rank of the pool holds the global result (TP/PP ranks of a block already agree);
    `pool.share` then hands it to the ranks outside the pool. `trainer` is None outside the pool.
    """

    def __init__(
        self,
        trainer,
        micro_batch_size: int | None = None,
        pool: Pool | None = None,
        *,
        balance_tokens: bool = False,
    ):
        self.trainer = trainer
        self.pool = pool
        self.balance_tokens = balance_tokens
        """Rows go to DP ranks by tokens (hpcrl.train.token_budget.balance_over_ranks), not contiguously."""
        if trainer is None and (pool is None or pool.spans_world):
            raise ValueError("a TrainerWorker without a trainer needs the pool that hosts the model")
        groups = trainer.groups if trainer is not None else None
        self.shards = (
            Shards(groups.dp_rank, groups.data, groups.dp if groups.data > 1 else None)
            if groups is not None
            else Shards(0, 1)
        )
        self.micro_batch_size = micro_batch_size

    def _share(self, local: object) -> object:
        return local if self.pool is None else self.pool.share(local)

    def _partition(self, batch: TrainBatch) -> list[list[int]] | None:
        """Every DP rank's rows when balancing by tokens (the same on every rank), else None."""
        if not self.balance_tokens or self.shards.size == 1:
            return None
        return balance_over_ranks(self._row_tokens(batch), self.shards.size)

    def _row_tokens(self, batch: TrainBatch) -> list[int]:
        """What each row costs its DP rank: its real tokens when the trainer packs, else its width."""
        return batch.row_lengths() if self.trainer.pack_sequences else batch.row_widths()

    def _local(self, batch: TrainBatch, parts: list[list[int]] | None) -> TrainBatch:
        """This DP rank's rows: its part of `parts` (balanced), else its contiguous share."""
        if parts is not None:
            return batch.select(torch.tensor(parts[self.shards.index], dtype=torch.long))
        start, stop = self.shards.bounds(len(batch))
        return batch.slice(start, stop)

    def start_forward(self, batch: TrainBatch) -> Pending:
        """Run the forward on this worker's pool; `.result()` hands HeadOutputs to every rank, its rows in
        the batch's order."""
        merged = None
        if self.trainer is not None:
            parts = self._partition(batch)
            out = self.trainer.forward(self._local(batch, parts), self.micro_batch_size)
            merged = _cat_dicts(self.shards.collect({k: v.cpu() for k, v in out.tensors().items()}))
            if parts is not None:  # rank order -> batch order
                order = torch.tensor([i for rows in parts for i in rows], dtype=torch.long)
                merged = {k: v[torch.argsort(order)] for k, v in merged.items()}
        return Pending(merged, self._share, lambda tensors: HeadOutputs(**tensors))

    def start_update(self, batch: TrainBatch, loss_fn: LossFn) -> Pending:
        """Run one update on this worker's pool; `.result()` hands its metrics to every rank (with
        balancing, dp/token_imbalance: max/mean tokens per DP rank)."""
        stats = None
        if self.trainer is not None:
            parts = self._partition(batch)
            stats = self.trainer.update(self._local(batch, parts), loss_fn, self.micro_batch_size)
            if parts is not None:
                stats["dp/token_imbalance"] = imbalance(self._row_tokens(batch), parts)
        return Pending(stats, self._share)

    def forward(self, batch: TrainBatch) -> HeadOutputs:
        return self.start_forward(batch).result()

    def update(self, batch: TrainBatch, loss_fn: LossFn) -> dict[str, float]:
        return self.start_update(batch, loss_fn).result()
