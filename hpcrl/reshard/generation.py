"""The generation weights of one rank in the generation layout, as one flat buffer a rollout model runs on.

HybridFlow's 3D-HybridEngine (EuroSys'25 §5.4) ends a train -> rollout transition with each rank holding
its generation shard (TP rank t_g, stage p_g). `HybridEngine.to_generation` leaves that shard as the
rank's own training shards (in place) plus the received member buffers; a rollout model needs each
parameter as one contiguous tensor in the generation layout (megatron-core's `linear_qkv`, `linear_fc1`,
... at TP = t_g). `GenerationStore` is that: one flat tensor holding every generation tensor of the rank,
laid out in plan order, whose views *are* the rollout model's parameters (`bind` points each
parameter's `.data` at its view once, so a weight sync writes the model's weights directly and the
model keeps no copy of its own).

Memory (per rank, M = model bytes): the store is M/(t_g·p_g) while it is awake. A sync
(`HybridEngine.gather_into`) writes it from the micro-DP all-gather's staging buffer (one local copy of
each piece; the bytes *received* stay the HybridFlow bound, counted by the transport) and frees the
staging right after, so at rest the extra memory of generation is the store alone. `sleep()` frees it between generation and training
(the CPU-engine counterpart of vLLM's `sleep(level=1)`), `wake()` allocates it again before the next
sync and re-points the parameters.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import torch

from hpcrl.errors import ConfigError, Problem
from hpcrl.reshard.engine import assemble
from hpcrl.reshard.planner import RankPlan


class GenerationStore:
    """This rank's generation tensors in one flat buffer; rollout parameters are views into it."""

    def __init__(self, plan: RankPlan, dtype: torch.dtype, device: torch.device | str = "cpu"):
        self.plan, self.dtype, self.device = plan, dtype, torch.device(device)
        self.offsets: dict[str, int] = {}
        offset = 0
        for gen in plan.gen:
            self.offsets[gen.name] = offset
            offset += math.prod(gen.shape)
        self.numel = offset
        self.flat: torch.Tensor | None = None
        self._params: dict[str, torch.Tensor] = {}

    @classmethod
    def for_engine(cls, engine) -> GenerationStore:
        """The store of a bound HybridEngine's plan, on the device and in the dtype of its training shards."""
        sample = next(iter(engine.store.flat.values()))
        return cls(engine.plan, sample.dtype, sample.device)

    @property
    def nbytes(self) -> int:
        return self.numel * torch.empty((), dtype=self.dtype).element_size()

    @property
    def awake(self) -> bool:
        return self.flat is not None

    def views(self) -> dict[str, torch.Tensor]:
        """Global Megatron name -> this rank's generation tensor (a view of the flat buffer)."""
        if self.flat is None:
            raise RuntimeError("generation store is asleep: wake() it first")
        return {
            gen.name: self.flat[self.offsets[gen.name] : self.offsets[gen.name] + math.prod(gen.shape)].view(
                gen.shape
            )
            for gen in self.plan.gen
        }

    def bind(self, params: Mapping[str, torch.Tensor]) -> None:
        """Make `params` (global name -> rollout model parameter) views of the store, now and after every
        `wake()`. Every generation tensor of the plan must be bound exactly once, with its planned shape."""
        planned = {gen.name: gen.shape for gen in self.plan.gen}
        problems = [Problem("not in the generation plan", key=name) for name in params if name not in planned]
        problems += [
            Problem(f"missing from the rollout model on rank {self.plan.rank}", key=name)
            for name in planned
            if name not in params
        ]
        problems += [
            Problem(f"rollout parameter shape {tuple(params[n].shape)} != generation shard {shape}", key=n)
            for n, shape in planned.items()
            if n in params and tuple(params[n].shape) != tuple(shape)
        ]
        if problems:
            raise ConfigError(problems)
        self._params = dict(params)
        self.wake()

    def wake(self) -> None:
        """Allocate the buffer (if asleep) and point every bound parameter at its view. A fresh buffer's
        contents are undefined until the next sync writes it (the RL step syncs before generating)."""
        if self.flat is None:
            self.flat = torch.empty(self.numel, dtype=self.dtype, device=self.device)
        views = self.views()
        for name, param in self._params.items():
            param.data = views[name]

    def sleep(self) -> None:
        """Free the buffer; bound parameters become empty until the next `wake()` (their weights are
        stale anyway: the next sync rewrites every element)."""
        empty = torch.empty(0, dtype=self.dtype, device=self.device)
        for param in self._params.values():
            param.data = empty
        self.flat = None

    def fill_stream(self, stream: str, source: Callable[[int], torch.Tensor]) -> int:
        """Write the generation tensors made of `stream`'s pieces; `source(member)` is that member's flat
        stream (a view of a staging buffer, a received buffer or the own training shards)."""
        views = self.views()
        gens = [gen for gen in self.plan.gen if gen.pieces[0].stream == stream]
        for gen in gens:
            assemble(gen, lambda _stream, member: source(member), out=views[gen.name])
        return len(gens)
