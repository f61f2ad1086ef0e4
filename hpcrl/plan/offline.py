"""Memory plan of the offline stages (sft, dpo, rm): one trained model over the training layout, DPO's
frozen reference beside it, no rollout engine, KV cache or reshard.

    plan = predict_offline(cfg)       # cfg.stage in OFFLINE_STAGES

Per rank: the trained model's params, grads and optimizer state (hpcrl.plan.memory.trainable_components:
the update backend's layout), DPO's reference params (kl to it is the loss), and the train phase of one
micro-batch of b rows of s tokens (hpcrl.plan.memory.train_phase; the reward model's scalar head has no
logits buffer). s is the model's context, max_position_embeddings: the longest row the stage accepts
(hpcrl.stages.sequences refuses a longer one), since offline rows have no generation budget to bound
them. b = min(optim.micro_batch_size, the rows of a step on one DP rank). Host: the async checkpoint's
snapshot, the step's and the held-out batch's token rows.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING

from hpcrl.plan import formulas as fm
from hpcrl.plan.capacity import device_capacity
from hpcrl.plan.memory import (
    PERSISTENT,
    Component,
    MemoryPlan,
    dims_of,
    snapshot_components,
    train_phase,
    trainable_components,
)
from hpcrl.train.hf_config import with_hf_architecture

if TYPE_CHECKING:
    from hpcrl.experiment.config import ExperimentConfig


@dataclass(frozen=True)
class OfflineShape:
    """What an offline stage holds and trains on."""

    role: str
    """The trained model's name in the plan."""
    examples_per_step: Callable[[ExperimentConfig], int]
    """Examples (rows, or pairs) of one step's batch."""
    rows_per_example: int = 1
    """Token rows of an example: a preference pair is two."""
    scalar_head: bool = False
    """A scalar head on the trunk (the reward model): no output layer, no logits buffer."""
    reference: bool = False
    """A frozen copy of the initial model beside it (DPO, IPO, KTO)."""


OFFLINE_STAGES = MappingProxyType(
    {
        "sft": OfflineShape("policy", lambda cfg: cfg.sft.examples_per_step),
        "dpo": OfflineShape("policy", lambda cfg: cfg.dpo.pairs_per_step, 2, reference=True),
        "rm": OfflineShape("reward model", lambda cfg: cfg.rm.pairs_per_step, 2, scalar_head=True),
    }
)
"""The offline stages by `stage` (hpcrl.experiment.stage_kinds.STAGE_KINDS names them)."""


def context_tokens(cfg: ExperimentConfig) -> int:
    """s: the model's context (from config.json where `model.hf_path` is readable here)."""
    return with_hf_architecture(cfg.model, need=("max_position_embeddings",)).max_position_embeddings


def rows_per_step(cfg: ExperimentConfig) -> int:
    """Token rows of one step's batch of an offline stage."""
    shape = OFFLINE_STAGES[cfg.stage]
    return shape.examples_per_step(cfg) * shape.rows_per_example


def predict_offline(cfg: ExperimentConfig, *, host_bytes: float | None = None) -> MemoryPlan:
    """The memory plan of an offline stage's worst rank (one pool: every rank holds the same parts)."""
    shape = OFFLINE_STAGES[cfg.stage]
    par, dims = cfg.parallel, dims_of(cfg)
    e = fm.DTYPE_BYTES[cfg.model.dtype]
    device, host = device_capacity(cfg, host_bytes=host_bytes)
    layout = f"t={par.tensor},p={par.pipeline},d={par.data}"
    plan = MemoryPlan(layout=layout, device=device, host=host, trained=shape.role)
    params = fm.rank_params(dims, par.tensor, par.pipeline, value_head=shape.scalar_head).total
    plan.components += trainable_components(shape.role, params, cfg)
    if shape.reference:
        plan.components.append(
            Component("reference params", PERSISTENT, params * e, f"{params:,} params × {e} B")
        )
    s, rows = context_tokens(cfg), rows_per_step(cfg)
    b = max(1, min(cfg.optim.micro_batch_size, rows // par.data))
    plan.components += train_phase(cfg, dims, e, s=s, b=b, logits=not shape.scalar_head)
    plan.components += snapshot_components(cfg, params, e)
    held = cfg.data.heldout_size * shape.rows_per_example
    batches = (rows + held) * s * 3 * 8
    formula = f"({rows} step + {held} held-out rows) × s={s} × 3 tensors (ids, attention, mask) × 8 B"
    plan.components.append(Component("token batches", "host", batches, formula))
    return plan
