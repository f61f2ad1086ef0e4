"""The parallel layout a job asks for (HybridFlow notation in brackets)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from hpcrl.config.ranges import Count, Positive


@dataclass(kw_only=True)
class ParallelConfig:
    """Training layout p-t-d and generation layout p_g-t_g-d_g-d (HybridFlow §5).

    world = pipeline * tensor * data must equal the ranks of the job (nodes * tasks_per_node).
    The micro-DP size d_g = (tensor * pipeline) / (rollout_tensor * rollout_pipeline) is derived.
    """

    tensor: Count = 1
    """Training tensor-parallel size [t]."""
    pipeline: Count = 1
    """Training pipeline-parallel size [p]."""
    data: Count = 1
    """Training data-parallel size [d]."""
    rollout_tensor: Count = 1
    """Generation tensor-parallel size [t_g]; must divide `tensor`."""
    rollout_pipeline: Count = 1
    """Generation pipeline-parallel size [p_g]; must divide `pipeline`."""
    backend: Literal["auto", "nccl", "gloo"] = "auto"
    """torch.distributed backend; auto = nccl when CUDA is present, else gloo."""
    timeout_s: Positive = 300.0
    """Collective timeout: a dead peer becomes an error naming the group, not a hang."""
    reshard_bucket_mb: Positive = 64.0
    """All-gather staging bucket of the train->rollout reshard (MiB); peak extra memory = received part + one bucket."""
    verify_weight_sync: bool = False
    """After every train->rollout weight sync, compare per-parameter checksums of what the reshard read with
    what the optimizer wrote (megatron: its DDP param buffer); a difference stops the job naming the
    parameter. Costs one more read of the rank's training shard per step; `hpcrl rehearse` turns it on."""

    @property
    def world_size(self) -> int:
        return self.tensor * self.pipeline * self.data
