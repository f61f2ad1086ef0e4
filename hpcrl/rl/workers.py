"""Worker groups of the RL dataflow: each wraps one role's engine and owns its dispatch/collect.

HybridFlow's transfer protocols (§4.2) as small classes, no role flags: the driver hands a GLOBAL batch
to a worker; the worker gives each data-parallel rank its share (`dispatch`), runs, and gathers the
results back into a global batch on every rank (`collect`). All ranks run the same driver code (the
single controller is replicated; without Ray, SPMD is how torch.distributed jobs run), so every rank
sees the same global tensors and takes the same decisions.

Shape legend: B = sequences (global unless named local), T = response tokens, S = sequence tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from hpcrl.rl.experience import Experience
from hpcrl.rollout.base import GenerationOutput, RolloutEngine, SamplingParams
from hpcrl.train.batch import TrainBatch
from hpcrl.train.logprobs import HeadOutputs
from hpcrl.train.pipeline import LossFn


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


def _cat_dicts(parts: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    return {k: torch.cat([p[k] for p in parts]) for k in parts[0]}


class RolloutWorker:
    """Generation replicas: each generation-DP rank samples its share of the prompts.

    `shards` is over the generation data-parallel index (p_g x t_g blocks share one index and produce
    identical outputs; `collect` keeps one copy per index).
    """

    def __init__(
        self, engine: RolloutEngine, shards: Shards, world_group: dist.ProcessGroup | None, pad_id: int
    ):
        self.engine, self.shards, self.world_group, self.pad_id = engine, shards, world_group, pad_id

    def load_weights(self, weights) -> int:
        return self.engine.load_weights(weights)

    def generate(
        self, prompt_ids: Sequence[Sequence[int]], sampling: SamplingParams, seed: int
    ) -> GenerationOutput:
        start, stop = self.shards.bounds(len(prompt_ids))
        torch.manual_seed(seed * 7919 + self.shards.index)  # distinct per replica, reproducible per step
        local = self.engine.generate(prompt_ids[start:stop], sampling) if stop > start else None
        if local is not None:
            local = _pad_generation(local, sampling.max_new_tokens, self.pad_id)
        gathered = Shards(0, 1, self.world_group).collect((self.shards.index, local))
        by_index = {}
        for index, out in gathered:
            by_index.setdefault(index, out)
        parts = [by_index[i] for i in sorted(by_index) if by_index[i] is not None]
        return GenerationOutput(
            torch.cat([p.response_ids_BT for p in parts]),
            torch.cat([p.response_mask_BT for p in parts]),
            torch.cat([p.logprobs_BT for p in parts]),
        )


def _pad_generation(out: GenerationOutput, width: int, pad_id: int) -> GenerationOutput:
    extra = width - out.response_ids_BT.shape[1]
    if extra <= 0:
        return out
    pad = torch.nn.functional.pad
    return GenerationOutput(
        pad(out.response_ids_BT, (0, extra), value=pad_id),
        pad(out.response_mask_BT, (0, extra)),
        pad(out.logprobs_BT, (0, extra)),
    )


class TrainerWorker:
    """A megatron trainer (actor, reference or critic) over the training DP ranks.

    `forward` dispatches the global batch by DP rank, runs the trainer, and collects the outputs over the
    DP group, so every rank holds the global result (TP/PP ranks of a block already agree).
    """

    def __init__(self, trainer, micro_batch_size: int | None = None):
        self.trainer = trainer
        groups = trainer.groups
        self.shards = Shards(groups.dp_rank, groups.data, groups.dp if groups.data > 1 else None)
        self.micro_batch_size = micro_batch_size

    def _local(self, batch: TrainBatch) -> TrainBatch:
        start, stop = self.shards.bounds(len(batch))
        return batch.slice(start, stop)

    def forward(self, batch: TrainBatch) -> HeadOutputs:
        out = self.trainer.forward(self._local(batch), self.micro_batch_size)
        merged = _cat_dicts([p for p in self.shards.collect({k: v.cpu() for k, v in out.tensors().items()})])
        return HeadOutputs(**merged)

    def update(self, batch: TrainBatch, loss_fn: LossFn) -> dict[str, float]:
        return self.trainer.update(self._local(batch), loss_fn, self.micro_batch_size)


class ActorWorker(TrainerWorker):
    """The policy: log-probs/entropy, PPO updates, and the train -> rollout weight hand-off (reshard)."""

    def __init__(self, trainer, reshard, micro_batch_size: int | None = None):
        super().__init__(trainer, micro_batch_size)
        self.reshard = reshard
        """Callable(rollout_worker) -> tensors loaded: moves weights through the reshard engine."""

    def sync_weights_to(self, rollout: RolloutWorker) -> int:
        return self.reshard(rollout)


def logprobs_of(worker: TrainerWorker, exp: Experience) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(logprobs_BT, entropy_BT) of the responses in response space (global)."""
    out = worker.forward(exp.train_batch())
    entropy = None if out.entropy_BT is None else exp.to_response(out.entropy_BT)
    return exp.to_response(out.logprobs_BT), entropy


def values_of(worker: TrainerWorker, exp: Experience) -> torch.Tensor:
    return exp.to_response(worker.forward(exp.train_batch()).values_BT)
