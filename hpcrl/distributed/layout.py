"""ParallelLayout: the training layout p-t-d and the generation layout p_g-t_g-d_g-d of one job.

Pure arithmetic (no process groups; `create_groups` below builds them from the rank lists).

Notation (HybridFlow, EuroSys'25, §5 and Table 2):
  t, p, d       training tensor / pipeline / data parallel sizes, world N = t·p·d
  t_g, p_g      generation tensor / pipeline sizes, t_g | t and p_g | p
  d_g           micro-DP size = (t·p)/(t_g·p_g); generation DP size = d_g·d
  a = t/t_g     training TP ranks merged into one generation TP rank
  b = p/p_g     training PP stages merged into one generation PP stage (d_g = a·b)

Training rank order: tp fastest, then pp, then dp:  rank = tp + t·(pp + p·dp)  ("tp-pp-dp" in
megatron-core's `order` argument), so each model-parallel block (t·p ranks) is consecutive.

Generation grouping rule (HybridFlow §5.3): inside each model-parallel block the generation shard of
a rank must contain its training shard, so a generation TP rank owns a consecutive run of `a` training
TP shards and a generation PP stage owns `b` consecutive training stages:
  gen_tp = tp // a, gen_pp = pp // b, micro-DP rank = (tp % a) + a·(pp % b).
Micro-DP groups are therefore consecutive ranks along TP (stride t across merged stages) and generation
TP/PP groups take ranks at strides: e.g. t=4,d=2 -> t_g=2 gives generation TP groups [0,2],[1,3],[4,6],
[5,7] and micro-DP groups [0,1],[2,3],[4,5],[6,7] (DESIGN.md's example).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from hpcrl.errors import ConfigError, Problem

if TYPE_CHECKING:
    from hpcrl.distributed.config import ParallelConfig


class TrainCoords(NamedTuple):
    """A rank's place in the training layout."""

    tensor: int
    pipeline: int
    data: int


class RolloutCoords(NamedTuple):
    """A rank's place in the generation layout (`data` = micro + d_g·training dp)."""

    tensor: int
    pipeline: int
    micro: int
    data: int


class ModelDims(Protocol):
    """The model sizes the layout must divide (hpcrl.train.config.ModelConfig satisfies this)."""

    vocab_size: int
    num_layers: int
    num_attention_heads: int
    num_query_groups: int
    ffn_hidden_size: int


@dataclass(frozen=True)
class ParallelLayout:
    """Training (tensor, pipeline, data) and generation (rollout_tensor, rollout_pipeline) sizes.

    Construction checks the structural rules; `check_model` / `check_world` check the rest, each
    raising ConfigError that names the rule and the config key.
    """

    tensor: int = 1
    pipeline: int = 1
    data: int = 1
    rollout_tensor: int = 1
    rollout_pipeline: int = 1

    def __post_init__(self) -> None:
        problems = _structure_problems(self)
        if problems:
            raise ConfigError(problems)

    @classmethod
    def from_config(cls, config: ParallelConfig) -> ParallelLayout:
        return cls(
            tensor=config.tensor,
            pipeline=config.pipeline,
            data=config.data,
            rollout_tensor=config.rollout_tensor,
            rollout_pipeline=config.rollout_pipeline,
        )

    # ---- derived sizes -------------------------------------------------------------------------
    @property
    def world_size(self) -> int:
        return self.tensor * self.pipeline * self.data

    @property
    def model_parallel_size(self) -> int:
        """t·p: ranks of one training model-parallel block."""
        return self.tensor * self.pipeline

    @property
    def tensor_merge(self) -> int:
        """a = t / t_g."""
        return self.tensor // self.rollout_tensor

    @property
    def stage_merge(self) -> int:
        """b = p / p_g."""
        return self.pipeline // self.rollout_pipeline

    @property
    def micro_data(self) -> int:
        """d_g = (t·p) / (t_g·p_g)."""
        return self.tensor_merge * self.stage_merge

    @property
    def rollout_data(self) -> int:
        """Generation data-parallel size d_g·d."""
        return self.micro_data * self.data

    def describe(self) -> str:
        return (
            f"t={self.tensor},p={self.pipeline},d={self.data}"
            f"->t_g={self.rollout_tensor},p_g={self.rollout_pipeline}"
        )

    # ---- coordinates ---------------------------------------------------------------------------
    def train_coords(self, rank: int) -> TrainCoords:
        self._check_rank(rank)
        tp = rank % self.tensor
        pp = (rank // self.tensor) % self.pipeline
        dp = rank // self.model_parallel_size
        return TrainCoords(tp, pp, dp)

    def train_rank(self, tensor: int, pipeline: int, data: int) -> int:
        return tensor + self.tensor * (pipeline + self.pipeline * data)

    def rollout_coords(self, rank: int) -> RolloutCoords:
        tp, pp, dp = self.train_coords(rank)
        a, b = self.tensor_merge, self.stage_merge
        micro = tp % a + a * (pp % b)
        return RolloutCoords(tp // a, pp // b, micro, micro + self.micro_data * dp)

    def rollout_rank(self, tensor: int, pipeline: int, data: int) -> int:
        """Rank of generation coordinates (`data` in [0, d_g·d))."""
        a, b = self.tensor_merge, self.stage_merge
        micro, dp = data % self.micro_data, data // self.micro_data
        return self.train_rank(tensor * a + micro % a, pipeline * b + micro // a, dp)

    # ---- training groups -----------------------------------------------------------------------
    def train_tensor_groups(self) -> list[list[int]]:
        return self._groups(lambda c: (c.pipeline, c.data), lambda c: c.tensor)

    def train_pipeline_groups(self) -> list[list[int]]:
        return self._groups(lambda c: (c.tensor, c.data), lambda c: c.pipeline)

    def train_data_groups(self) -> list[list[int]]:
        return self._groups(lambda c: (c.tensor, c.pipeline), lambda c: c.data)

    def model_parallel_groups(self) -> list[list[int]]:
        """Training TP×PP blocks (t·p consecutive ranks): the naive gather's group."""
        mp = self.model_parallel_size
        return [list(range(b * mp, (b + 1) * mp)) for b in range(self.data)]

    # ---- generation groups ---------------------------------------------------------------------
    def rollout_tensor_groups(self) -> list[list[int]]:
        return self._rollout_groups(lambda c: (c.pipeline, c.data), lambda c: c.tensor)

    def rollout_pipeline_groups(self) -> list[list[int]]:
        return self._rollout_groups(lambda c: (c.tensor, c.data), lambda c: c.pipeline)

    def micro_data_groups(self) -> list[list[int]]:
        """Micro-DP groups: the ranks whose training shards form one generation shard."""
        return self._rollout_groups(lambda c: (c.tensor, c.pipeline, c.data - c.micro), lambda c: c.micro)

    def rollout_data_groups(self) -> list[list[int]]:
        return self._rollout_groups(lambda c: (c.tensor, c.pipeline), lambda c: c.data)

    def rollout_model_parallel_groups(self) -> list[list[int]]:
        """The t_g·p_g ranks of one generation replica (same generation data index)."""
        return self._rollout_groups(lambda c: c.data, lambda c: (c.pipeline, c.tensor))

    def stage_merge_groups(self) -> list[list[int]]:
        """Micro-DP members with the same training TP rank: they exchange TP-replicated parameters
        (norms) of the b merged pipeline stages. Size b; singletons when p_g = p."""
        return self._groups(
            lambda c: (c.tensor, c.pipeline // self.stage_merge, c.data), lambda c: c.pipeline
        )

    def all_groups(self) -> dict[str, list[list[int]]]:
        """Every group family by name, in the fixed order in which `create_groups` builds them."""
        return {
            "train_tensor": self.train_tensor_groups(),
            "train_pipeline": self.train_pipeline_groups(),
            "train_data": self.train_data_groups(),
            "model_parallel": self.model_parallel_groups(),
            "rollout_tensor": self.rollout_tensor_groups(),
            "rollout_pipeline": self.rollout_pipeline_groups(),
            "micro_data": self.micro_data_groups(),
            "rollout_data": self.rollout_data_groups(),
            "rollout_model_parallel": self.rollout_model_parallel_groups(),
            "stage_merge": self.stage_merge_groups(),
        }

    def group_of(self, family: str, rank: int) -> list[int]:
        """The ranks of `family` that contain `rank`."""
        for ranks in self.all_groups()[family]:
            if rank in ranks:
                return ranks
        raise KeyError(f"rank {rank} is in no {family} group of {self.describe()}")

    # ---- validation against a world and a model ------------------------------------------------
    def check_world(self, world_size: int) -> None:
        if world_size != self.world_size:
            raise ConfigError(
                Problem(
                    f"rule world = tensor*pipeline*data: {self.tensor}*{self.pipeline}*{self.data} = "
                    f"{self.world_size}, but the job has {world_size} ranks",
                    key="parallel",
                )
            )

    def check_model(self, model: ModelDims) -> None:
        problems = model_problems(self, model)
        if problems:
            raise ConfigError(problems)

    # ---- helpers -------------------------------------------------------------------------------
    def _check_rank(self, rank: int) -> None:
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} outside world of {self.world_size} ({self.describe()})")

    def _groups(self, key: Any, order: Any) -> list[list[int]]:
        return _group_by([(r, self.train_coords(r)) for r in range(self.world_size)], key, order)

    def _rollout_groups(self, key: Any, order: Any) -> list[list[int]]:
        return _group_by([(r, self.rollout_coords(r)) for r in range(self.world_size)], key, order)


def _group_by(ranked: list[tuple[int, Any]], key: Any, order: Any) -> list[list[int]]:
    groups: dict[Any, list[tuple[int, int]]] = {}
    for rank, coords in ranked:
        groups.setdefault(key(coords), []).append((order(coords), rank))
    # Groups sorted by their lowest rank; members by their coordinate along the group's axis.
    members = [[rank for _, rank in sorted(group)] for group in groups.values()]
    return sorted(members, key=min)


def _structure_problems(layout: ParallelLayout) -> list[Problem]:
    problems = []
    for name in ("tensor", "pipeline", "data", "rollout_tensor", "rollout_pipeline"):
        value = getattr(layout, name)
        if not isinstance(value, int) or value < 1:
            problems.append(Problem(f"must be a positive integer, got {value!r}", key=f"parallel.{name}"))
    if problems:
        return problems
    if layout.tensor % layout.rollout_tensor:
        problems.append(
            Problem(
                f"rule t_g | t: rollout_tensor={layout.rollout_tensor} does not divide tensor={layout.tensor}",
                key="parallel.rollout_tensor",
            )
        )
    if layout.pipeline % layout.rollout_pipeline:
        problems.append(
            Problem(
                f"rule p_g | p: rollout_pipeline={layout.rollout_pipeline} does not divide "
                f"pipeline={layout.pipeline}",
                key="parallel.rollout_pipeline",
            )
        )
    return problems


def model_problems(layout: ParallelLayout, model: ModelDims) -> list[Problem]:
    """Every divisibility rule the model must satisfy for this layout, each naming the keys."""
    t, t_g, p = layout.tensor, layout.rollout_tensor, layout.pipeline
    heads, groups = model.num_attention_heads, model.num_query_groups
    rules = [
        (
            heads % t == 0,
            f"rule heads % t == 0: num_attention_heads={heads} not divisible by tensor={t}",
            "model.num_attention_heads",
        ),
        (
            heads % groups == 0,
            f"rule heads % kv_heads == 0: num_attention_heads={heads} not divisible by "
            f"num_query_groups={groups}",
            "model.num_query_groups",
        ),
        (
            groups % t == 0,
            f"rule kv_heads % t == 0: num_query_groups={groups} not divisible by tensor={t} (megatron-core's "
            f"attention splits the kv heads over TP ranks)",
            "model.num_query_groups",
        ),
        (
            groups % t_g == 0,
            f"rule kv_heads % t_g == 0: num_query_groups={groups} not divisible by "
            f"rollout_tensor={t_g} (a generation TP shard must hold whole kv heads; replicating kv heads for "
            f"t_g > kv_heads is not supported by the reshard engine)",
            "parallel.rollout_tensor",
        ),
        (
            model.vocab_size % t == 0,
            f"rule vocab % t == 0: vocab_size={model.vocab_size} not divisible by "
            f"tensor={t} (GPTModel does not pad the vocabulary)",
            "model.vocab_size",
        ),
        (
            model.ffn_hidden_size % t == 0,
            f"rule ffn % t == 0: ffn_hidden_size={model.ffn_hidden_size} not divisible by tensor={t}",
            "model.ffn_hidden_size",
        ),
        (
            model.num_layers % p == 0,
            f"rule layers % p == 0: num_layers={model.num_layers} not divisible by pipeline={p}",
            "model.num_layers",
        ),
    ]
    return [Problem(message, key=key) for ok, message, key in rules if not ok]


def create_groups(layout: ParallelLayout, timeout_s: float | None = None) -> dict[str, Any]:
    """Create a torch.distributed group for every group of every family; return the caller's.

    Every rank must call this: new_group is collective over the whole world and must be called for
    every group in the same order on every rank. Size-1 groups are created too, so the call sequence
    never depends on the rank. Returns {family: the ProcessGroup of that family containing this rank}.
    `timeout_s` bounds every collective on these groups (a dead peer -> error, not a hang).
    """
    # torch here only: the layout arithmetic above runs at expand/submit for every element, torch-free
    import torch.distributed as dist

    from hpcrl.distributed.groups import (
        new_group,  # torch.distributed: this module stays importable without it
    )

    me = dist.get_rank()
    mine: dict[str, Any] = {}
    for family, groups in layout.all_groups().items():
        for ranks in groups:
            group = new_group(ranks, timeout_s)
            if me in ranks:
                mine[family] = group
    return mine
