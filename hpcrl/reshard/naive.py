"""The measured baseline: gather every tensor over the training TP group, broadcast it over PP (what verl
does since 2025; same volume as HybridFlow-V's all-gather over the TP×PP group, Table 2 row 2).

Per rank it receives (t·p−1)/(t·p)·M_split: for the 1/p of M on its own stage (t−1)/t of each tensor via
the TP all-gather, the other (p−1)/p of M whole via the PP broadcast. Each full tensor is then sliced to
the rank's generation shard, which is kept as a separate copy (redundancy M/(t·p)); peak extra memory is
the generation shard plus the largest full tensor. Same interface as HybridEngine.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import torch

from hpcrl.errors import ConfigError
from hpcrl.reshard.engine import BufferMeter
from hpcrl.reshard.params import ParamMeta, Split, gather_shards, shard_of
from hpcrl.reshard.planner import REPLICATED, SPLIT, RankPlan
from hpcrl.reshard.transport import Group, Transport


@dataclass
class NaiveGenerationShard:
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    released: bool = False

    def megatron_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        if self.released:
            raise RuntimeError("generation shard was released (to_training); reshard again first")
        yield from self.tensors.items()


class NaiveEngine:
    """Per-tensor TP all-gather + PP broadcast, then slice; one instance per rank."""

    def __init__(
        self, plan: RankPlan, metas: list[ParamMeta], transport: Transport, groups: Mapping[str, Group]
    ):
        layout = plan.layout
        self.plan, self.metas, self.transport = plan, metas, transport
        self.tp, self.pp, self.dp = layout.train_coords(plan.rank)
        self.groups = {}
        for family, size in (("train_tensor", layout.tensor), ("train_pipeline", layout.pipeline)):
            ranks = tuple(layout.group_of(family, plan.rank))
            group = groups.get(family) if size > 1 else Group(family, ranks)
            if group is None or tuple(group.ranks) != ranks:
                raise ConfigError(f"{family} group of rank {plan.rank} must be {list(ranks)}")
            self.groups[family] = group
        self.gen_shapes = {g.name: g.shape for g in plan.gen}
        self.params: dict[str, torch.Tensor] = {}
        self.meter = BufferMeter()

    def attach(self, params: Mapping[str, torch.Tensor]) -> None:
        """Read the training shards from `params` at each transition (never copied ahead, never repointed)."""
        self.params = dict(params)

    def to_generation(self) -> NaiveGenerationShard:
        layout = self.plan.layout
        shard = NaiveGenerationShard()
        g_tp = layout.rollout_coords(self.plan.rank).tensor
        for meta in self.metas:
            full, allocated = self._full_tensor(meta, REPLICATED if meta.split is Split.REPLICATED else SPLIT)
            if meta.name in self.gen_shapes:
                gen = shard_of(full, meta, g_tp, layout.rollout_tensor)
                kept = self.meter.alloc(gen.numel(), gen.dtype, gen.device).view(gen.shape)
                shard.tensors[meta.name] = kept.copy_(gen)
            if allocated:
                self.meter.free(full)
            del full
        return shard

    def _full_tensor(self, meta: ParamMeta, tag: str) -> tuple[torch.Tensor, bool]:
        """The full tensor on every rank of the TP×PP block; True when it was allocated here."""
        layout = self.plan.layout
        sample = next(iter(self.params.values()))
        dtype = getattr(torch, meta.dtype)
        if meta.stage != self.pp:
            full, allocated = self.meter.alloc(meta.numel, dtype, sample.device).view(meta.shape), True
        elif meta.split is Split.REPLICATED or layout.tensor == 1:
            full, allocated = self.params[meta.name].detach(), False
        else:
            own = self.params[meta.name].detach()
            staging = self.meter.alloc(meta.numel, own.dtype, own.device)
            self.transport.all_gather(staging, own.reshape(-1), self.groups["train_tensor"], tag)
            shards = [
                s.view(meta.shard_shape(layout.tensor)) for s in staging.view(layout.tensor, -1).unbind(0)
            ]
            full, allocated = self.meter.track(gather_shards(shards, meta)), True
            self.meter.free(staging)
            del staging, shards
        if layout.pipeline > 1:
            src = layout.train_rank(self.tp, meta.stage, self.dp)
            self.transport.broadcast(full, src, self.groups["train_pipeline"], tag)
        return full, allocated

    def to_training(self, shard: NaiveGenerationShard) -> None:
        for tensor in shard.tensors.values():
            self.meter.free(tensor)
        shard.tensors.clear()
        shard.released = True
