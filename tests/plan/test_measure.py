"""The planner against a real measurement: megatron-core GPTModel + hpcrl Trainer update steps on CPU."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcrl.experiment.resolve import resolve
from hpcrl.plan.capacity import GIB
from hpcrl.plan.measure import measure_update_peak
from hpcrl.plan.memory import predict

TINY = Path(__file__).resolve().parents[2] / "templates" / "grpo_tiny.yaml"


@pytest.mark.dist
def test_tiny_update_peak_within_25_percent():
    cfg = resolve(TINY).elements[0].config
    plan = predict(cfg, host_bytes=24 * GIB)
    [rank] = measure_update_peak(cfg, steps=1)
    params = next(c.bytes for c in plan.components if c.name == "actor params") / 4
    assert rank["params_on_rank"] == params  # the planner's parameter count is megatron's
    error = rank["tensor_peak_bytes"] / plan.update_peak - 1
    assert abs(error) < 0.25, (
        f"measured {rank['tensor_peak_bytes']:.0f} B vs predicted {plan.update_peak:.0f} B"
    )


@pytest.mark.gpu
def test_gpu_update_peak_within_25_percent():
    """Needs CUDA (skipped on CPU): the same check with torch.cuda.max_memory_allocated, bf16 weights."""
    cfg = resolve(TINY, {"model.dtype": "bfloat16", "cluster.gpus_per_node": 1}).elements[0].config
    plan = predict(cfg, host_bytes=24 * GIB)
    [rank] = measure_update_peak(cfg, steps=1)
    assert rank["device"] == "cuda"
    error = rank["tensor_peak_bytes"] / plan.update_peak - 1
    assert abs(error) < 0.25, (
        f"measured {rank['tensor_peak_bytes']:.0f} B vs predicted {plan.update_peak:.0f} B"
    )
