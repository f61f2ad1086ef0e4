"""The memory plan of any stage: `plan_of(cfg)` is what `hpcrl plan` and `submit`'s memory preflight
call. The RL stage plans its pools, rollout engine and reshard (hpcrl.plan.memory.predict); an offline
stage its one trained model (hpcrl.plan.offline)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hpcrl.experiment.stage_kinds import stage_of
from hpcrl.plan.memory import MemoryPlan, predict
from hpcrl.plan.offline import predict_offline

if TYPE_CHECKING:
    from hpcrl.experiment.config import ExperimentConfig


def plan_of(cfg: ExperimentConfig, *, host_bytes: float | None = None) -> MemoryPlan:
    """The memory plan of `cfg`'s worst rank, whatever its stage."""
    if stage_of(cfg).offline is not None:
        return predict_offline(cfg, host_bytes=host_bytes)
    return predict(cfg, host_bytes=host_bytes)
