"""Worker groups of the RL dataflow: each wraps one role's engine and owns its dispatch/collect.

HybridFlow's transfer protocols (§4.2) as small classes, no role flags: the driver hands a GLOBAL batch
to a worker; the worker gives each data-parallel rank its share (`dispatch`), runs, and gathers the
results back into a global batch on every rank (`collect`). All ranks run the same driver code (the
single controller is replicated; without Ray, SPMD is how torch.distributed jobs run), so every rank
sees the same global tensors and takes the same decisions.

Placement (HybridFlow's resource pools, §4.1): a worker group lives on a `Pool` of ranks. Colocated, every
pool is the whole world and `collect` already leaves the global result on every rank. Split, each role's
pool is a disjoint block of ranks; ranks outside a pool hold a stand-in of that worker (no engine, no
model) that only takes part in the hand-over: the pool's first rank broadcasts the collected result over
the default group (`Pool.share`), so the single-controller code runs unchanged on every rank.

Shape legend: B = sequences (global unless named local), T = response tokens, S = sequence tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from hpcrl.rl.experience import Experience
from hpcrl.rollout.base import GenerationOutput, RolloutEngine, SamplingParams, row_seeds
from hpcrl.rows import concat_rows, pad_columns
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


class RolloutWorker:
    """Generation replicas: each generation-DP rank samples its share of the prompts.

    `shards` is over the generation data-parallel index (p_g x t_g blocks share one index and produce
    identical outputs; `collect` keeps one copy per index). `engine` is None on ranks outside the rollout
    pool (split placement): they contribute nothing to the all-gather over `world_group` and receive the
    global output like every other rank.
    """

    def __init__(
        self,
        engine: RolloutEngine | None,
        shards: Shards,
        world_group: dist.ProcessGroup | None,
        pad_id: int,
        sleep: Callable[[], None] | None = None,
        max_num_seqs: int | None = None,
    ):
        self.engine, self.shards, self.world_group, self.pad_id = engine, shards, world_group, pad_id
        self._sleep = sleep
        self.max_num_seqs = max_num_seqs
        """Rows per engine call (waves; rollout.max_num_seqs); None = the whole share in one call."""

    def sleep(self) -> None:
        """Free the engine's generation memory until the next weight sync (between rollout and training)."""
        if self._sleep is not None:
            self._sleep()

    def generate(
        self, prompt_ids: Sequence[Sequence[int]], sampling: SamplingParams, seed: int
    ) -> GenerationOutput:
        local = None
        if self.engine is not None:
            start, stop = self.shards.bounds(len(prompt_ids))
            # Engines that take per-row seeds sample the same rows whatever the replica split; others
            # draw from the process RNG, seeded distinct per replica and reproducible per step.
            torch.manual_seed((seed * 7919 + self.shards.index) % 2**63)  # any int seed (torch takes < 2^64)
            if stop > start:
                local = self._generate_waves(prompt_ids, start, stop, sampling, seed)
        gathered = Shards(0, 1, self.world_group).collect((self.shards.index, local))
        by_index = {}
        for index, out in gathered:
            by_index.setdefault(index, out)
        return concat_rows([by_index[i] for i in sorted(by_index) if by_index[i] is not None])

    def _generate_waves(self, prompt_ids, start: int, stop: int, sampling: SamplingParams, seed: int):
        """Rows [start, stop) in waves of at most max_num_seqs; each row keeps its own seed."""
        wave = self.max_num_seqs or (stop - start)
        parts = []
        for a in range(start, stop, wave):
            b = min(stop, a + wave)
            out = self.engine.generate(prompt_ids[a:b], sampling, row_seeds(seed, a, b - a))
            parts.append(pad_columns(out, sampling.max_new_tokens, {"response_ids_BT": self.pad_id}))
        return concat_rows(parts)


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
        return balance_over_ranks(batch.row_widths(), self.shards.size)

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
                stats["dp/token_imbalance"] = imbalance(batch.row_widths(), parts)
        return Pending(stats, self._share)

    def forward(self, batch: TrainBatch) -> HeadOutputs:
        return self.start_forward(batch).result()

    def update(self, batch: TrainBatch, loss_fn: LossFn) -> dict[str, float]:
        return self.start_update(batch, loss_fn).result()


class ActorWorker(TrainerWorker):
    """The policy: log-probs/entropy and PPO updates. Its weights reach the rollout engine through the
    job's WeightSync (hpcrl.rl.weight_sync), which the driver holds."""


def response_logprobs(exp: Experience, out: HeadOutputs) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(logprobs_BT, entropy_BT) of a forward's outputs, moved to response space."""
    entropy = None if out.entropy_BT is None else exp.to_response(out.entropy_BT)
    return exp.to_response(out.logprobs_BT), entropy
