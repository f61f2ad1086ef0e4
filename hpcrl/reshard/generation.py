"""The generation weights of one rank in the generation layout, as one flat buffer a rollout model runs on.

HybridFlow's 3D-HybridEngine (EuroSys'25 §5.4) ends a train -> rollout transition with each rank holding
its generation shard (TP rank t_g, stage p_g). `HybridEngine.to_generation` leaves that shard as the
rank's own training shards (in place) plus the received member buffers; a rollout model needs each
parameter as one contiguous tensor in the generation layout (megatron-core's `linear_qkv`, `linear_fc1`,
... at TP = t_g). `GenerationStore` is that: one flat tensor holding every generation tensor of the rank,
laid out in plan order (one flat tensor per dtype for a mixed-precision model), whose views *are* the
rollout model's parameters (`bind` points each
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
from collections.abc import Mapping

import torch

from hpcrl.errors import ConfigError, Problem
from hpcrl.reshard.engine import PieceSource, assemble
from hpcrl.reshard.params import ITEMSIZE, dtype_name
from hpcrl.reshard.planner import RankPlan


class GenerationStore:
    """This rank's generation tensors in one flat buffer per dtype; rollout parameters are views into it."""

    def __init__(self, plan: RankPlan, device: torch.device | str = "cpu"):
        self.plan, self.device = plan, torch.device(device)
        self.offsets: dict[str, int] = {}
        self.numels: dict[str, int] = {}
        """dtype name -> elements of its flat buffer."""
        for gen in plan.gen:
            self.offsets[gen.name] = self.numels.get(gen.dtype, 0)
            self.numels[gen.dtype] = self.offsets[gen.name] + math.prod(gen.shape)
        self.flats: dict[str, torch.Tensor] | None = None
        self._params: dict[str, torch.Tensor] = {}

    @classmethod
    def for_engine(cls, engine) -> GenerationStore:
        """The store of an attached HybridEngine's plan, on the device of its training shards."""
        sample = next(iter(engine.shards.params.values()))
        return cls(engine.plan, sample.device)

    @property
    def nbytes(self) -> int:
        return sum(numel * ITEMSIZE[dtype] for dtype, numel in self.numels.items())

    @property
    def awake(self) -> bool:
        return self.flats is not None

    def views(self) -> dict[str, torch.Tensor]:
        """Global Megatron name -> this rank's generation tensor (a view of its dtype's flat buffer)."""
        if self.flats is None:
            raise RuntimeError("generation store is asleep: wake() it first")
        out = {}
        for gen in self.plan.gen:
            start = self.offsets[gen.name]
            out[gen.name] = self.flats[gen.dtype][start : start + math.prod(gen.shape)].view(gen.shape)
        return out

    def bind(self, params: Mapping[str, torch.Tensor]) -> None:
        """Make `params` (global name -> rollout model parameter) views of the store, now and after every
        `wake()`. Every generation tensor of the plan must be bound exactly once, with its planned shape
        and dtype."""
        planned = {gen.name: gen for gen in self.plan.gen}
        problems = [Problem("not in the generation plan", key=name) for name in params if name not in planned]
        problems += [
            Problem(f"missing from the rollout model on rank {self.plan.rank}", key=name)
            for name in planned
            if name not in params
        ]
        for name, gen in planned.items():
            if name not in params:
                continue
            if tuple(params[name].shape) != tuple(gen.shape):
                problems.append(
                    Problem(
                        f"rollout parameter shape {tuple(params[name].shape)} != generation shard {gen.shape}",
                        key=name,
                    )
                )
            if dtype_name(params[name].dtype) != gen.dtype:
                problems.append(
                    Problem(f"rollout parameter dtype {params[name].dtype} != planned {gen.dtype}", key=name)
                )
        if problems:
            raise ConfigError(problems)
        self._params = dict(params)
        self.wake()

    def wake(self) -> None:
        """Allocate the buffers (if asleep) and point every bound parameter at its view. A fresh buffer's
        contents are undefined until the next sync writes it (the RL step syncs before generating)."""
        if self.flats is None:
            self.flats = {
                dtype: torch.empty(numel, dtype=getattr(torch, dtype), device=self.device)
                for dtype, numel in self.numels.items()
            }
        views = self.views()
        for name, param in self._params.items():
            param.data = views[name]

    def sleep(self) -> None:
        """Free the buffers; bound parameters become empty until the next `wake()` (their weights are
        stale anyway: the next sync rewrites every element)."""
        for param in self._params.values():
            param.data = torch.empty(0, dtype=param.dtype, device=self.device)
        self.flats = None

    def fill_stream(self, stream: str, piece_of: PieceSource) -> int:
        """Write the generation tensors made of `stream`'s pieces; `piece_of(piece)` is that piece's data
        (a view of a staging buffer, a received buffer or the own training parameters)."""
        views = self.views()
        gens = [gen for gen in self.plan.gen if gen.stream == stream]
        for gen in gens:
            assemble(gen, piece_of, out=views[gen.name])
        return len(gens)
