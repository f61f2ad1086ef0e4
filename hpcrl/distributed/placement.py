"""Where an RL job's roles run: HybridFlow's resource pools (EuroSys'25 §4.1), one class per placement.

    placement:                  # an experiment section of its own (ExperimentConfig.placement)
      kind: async               # colocated | split | async
      max_off_policy_steps: 1
      rollout_pool_data: 1

Each kind owns its arithmetic and the rules of its own keys, so nothing else compares placement names:
- `ranks(parallel, placement)`: the ranks one element needs, and `ranks_formula` for messages;
- `problems(parallel, placement)`: its own keys' rules (at expand/submit and on the ranks);
- `rollout_spans_element`: whether the rollout engine's groups can cover the whole element (a vLLM TP
  group over every rank needs it);
- `models_pool`: the critic and reference live on a pool of their own (the memory planner's roles);
- `single_pool`: every role on every rank (what offline DPO needs);
- `off_policy`: the rollout generates while the training pool trains, with weights up to
  `max_off_policy_steps` updates old.
How each kind builds its job (workers, pools, drivers) is the RL job's: hpcrl.rl.assemble. Rules that
read other sections too (split needs a critic or a reference; off-policy samples need TIS) are
hpcrl.experiment.rules'. Pure and torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from hpcrl.config.ranges import Count, Range
from hpcrl.distributed.config import ParallelConfig

MAX_OFF_POLICY_STEPS = 16
"""The staleness bound's bound: m batches are in flight, held in memory on both pools, and generated
ahead at once at the first step (AReaL reports learning degrading beyond a few steps of staleness)."""


@dataclass(kw_only=True)
class PlacementConfig:
    """Which ranks host which roles of an RL job (HybridFlow §4.1)."""

    kind: Literal["colocated", "split", "async"] = "colocated"
    """colocated: actor, reference and critic on all ranks, the actor resharded between training and
    generation; split: two disjoint pools of the training layout (critic + reference on the second);
    async: the rollout engine on its own pool, generating the next batches while the training pool
    (actor, + reference and critic) updates on this one (hpcrl.rl.offpolicy.driver; verl's
    one-step-off-policy recipe)."""
    max_off_policy_steps: Annotated[int, Range(ge=0, le=MAX_OFF_POLICY_STEPS)] = 1
    """async: staleness bound m. The batch trained at step k is generated with the weights after update
    max(0, k - m), so every sample's version lag is at most m. 1 = one-step off-policy (generation of
    batch k+1 overlaps the update on batch k); 0 = synchronous (the colocated run's samples exactly, for
    exactness tests); larger m keeps m batches in flight (at most 16)."""
    rollout_pool_data: Count = 1
    """async: generation data-parallel replicas of the rollout pool [d_r]. The rollout pool is
    parallel.rollout_tensor * parallel.rollout_pipeline * rollout_pool_data ranks, placed after the
    training pool's parallel.tensor * parallel.pipeline * parallel.data ranks."""


@dataclass(frozen=True)
class Placement:
    """One placement kind: colocated (the base behaviour)."""

    name: str
    rollout_spans_element: bool = True
    models_pool: bool = False
    rollout_pool: bool = False
    """The rollout engine on a pool of its own (the memory planner's generation role): it never sleeps,
    and a second copy of its weights receives the next version while it generates."""
    single_pool: bool = True
    off_policy: bool = False

    def ranks(self, parallel: ParallelConfig, placement: PlacementConfig) -> int:  # noqa: ARG002
        return parallel.world_size

    def ranks_formula(self, parallel: ParallelConfig, placement: PlacementConfig) -> tuple[str, str]:  # noqa: ARG002
        """(formula with config keys, the same with their values) of `ranks`."""
        p = parallel
        return "parallel.tensor*parallel.pipeline*parallel.data", f"{p.tensor}*{p.pipeline}*{p.data}"


@dataclass(frozen=True)
class _Split(Placement):
    """Two equal pools of the training layout p-t-d: actor + rollout, then critic + reference."""

    def ranks(self, parallel: ParallelConfig, placement: PlacementConfig) -> int:  # noqa: ARG002
        return 2 * parallel.world_size

    def ranks_formula(self, parallel: ParallelConfig, placement: PlacementConfig) -> tuple[str, str]:
        keys, values = super().ranks_formula(parallel, placement)
        return f"{keys} x 2 pools (placement.kind: split)", f"{values} x 2"


@dataclass(frozen=True)
class _Async(Placement):
    """A training pool at p-t-d, then a rollout pool at p_g-t_g-d_r."""

    def ranks(self, parallel: ParallelConfig, placement: PlacementConfig) -> int:
        p = parallel
        return p.world_size + p.rollout_tensor * p.rollout_pipeline * placement.rollout_pool_data

    def ranks_formula(self, parallel: ParallelConfig, placement: PlacementConfig) -> tuple[str, str]:
        keys, values = super().ranks_formula(parallel, placement)
        p = parallel
        return (
            f"{keys} + parallel.rollout_tensor*rollout_pipeline*placement.rollout_pool_data (async placement)",
            f"{values} + {p.rollout_tensor}*{p.rollout_pipeline}*{placement.rollout_pool_data}",
        )


PLACEMENTS: dict[str, Placement] = {
    "colocated": Placement("colocated"),
    "split": _Split("split", rollout_spans_element=False, models_pool=True, single_pool=False),
    "async": _Async(
        "async", rollout_spans_element=False, rollout_pool=True, single_pool=False, off_policy=True
    ),
}
"""Every placement kind by name (`placement.kind`'s values)."""


def placement_of(placement: PlacementConfig) -> Placement:
    return PLACEMENTS[placement.kind]
