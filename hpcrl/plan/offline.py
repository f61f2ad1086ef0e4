"""Memory plan of the offline stages (sft, dpo, rm): one trained model over the training layout, DPO's
frozen reference beside it, no rollout engine, KV cache or reshard.

    plan = predict_offline(cfg)       # stage_of(cfg).offline is not None

Per rank: the trained model's params, grads and optimizer state (hpcrl.plan.memory.trainable_components:
the update backend's layout), DPO's reference params (kl to it is the loss), and the train phase of one
micro-batch of b rows of s tokens (hpcrl.plan.memory.train_phase; the reward model's scalar head has no
logits buffer). s is the model's context, max_position_embeddings: the longest row the stage accepts
(hpcrl.stages.sequences refuses a longer one), since offline rows have no generation budget to bound
them. b = min(optim.micro_batch_size, the rows of a step on one DP rank). Host: the async checkpoint's
snapshot, the step's and the held-out batch's token rows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hpcrl.experiment.kinds.kind import OfflineShape
from hpcrl.experiment.stage_kinds import stage_of
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


def context_tokens(cfg: ExperimentConfig) -> int:
    """s: the model's context (from config.json where `model.hf_path` is readable here)."""
    return with_hf_architecture(cfg.model, need=("max_position_embeddings",)).max_position_embeddings


def rows_per_step(cfg: ExperimentConfig) -> int:
    """Token rows of one step's batch of an offline stage."""
    shape = _shape_of(cfg)
    return shape.examples_per_step(cfg) * shape.rows_per_example


def predict_offline(cfg: ExperimentConfig, *, host_bytes: float | None = None) -> MemoryPlan:
    """The memory plan of an offline stage's worst rank (one pool: every rank holds the same parts)."""
    shape = _shape_of(cfg)
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


def _shape_of(cfg: ExperimentConfig) -> OfflineShape:
    """The memory shape its stage kind declares (hpcrl.experiment.kinds)."""
    shape = stage_of(cfg).offline
    if shape is None:
        raise ValueError(f"stage {cfg.stage!r} is not an offline stage")
    return shape
