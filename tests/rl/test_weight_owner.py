"""One owner of the weights: the update step owns the parameters' storage, the reshard reads it in place.

Before, the reshard engine repointed every parameter's `.data` into its own store; megatron's DDP had
made each parameter a view of its param buffer, which the distributed optimizer steps, so after the
bind the optimizer wrote into a buffer the model no longer read: the megatron backend's weights moved
0.0 per update (measured with the torch backend moving 3.0e-2), and the actor never learnt. Here a
colocated RL job runs with the megatron backend (megatron's real DDP + distributed optimizer on gloo,
through hpcrl.train.megatron_compat: the GPU boundary is the only thing mapped) and with the torch
backend, and after every update the rollout engine must hold the trainer's weights bit for bit, while
`parallel.verify_weight_sync` checks every sync against megatron's param buffer.
"""

from __future__ import annotations

import math

import pytest

from hpcrl.distributed.spawn import run_ranks
from tests.rl._job_ranks import tiny_config
from tests.rl._weight_owner_ranks import run_and_compare

pytestmark = pytest.mark.dist

STEPS = 5
METRIC_RTOL = 1e-4
"""torch vs megatron backend, same job and seed: megatron's distributed optimizer sums and clips in
another order (reduce-scatter of a flat buffer, fp32 norm of the shards), so the updates agree to float
rounding (~1e-7 relative per step); over 5 RL steps that stays far below 1e-4 unless a sample flips,
which a 1e-4 bound would then show."""
COMPARED = ("actor/loss", "actor/grad_norm", "reward/mean", "actor/entropy", "mismatch/logprob_max")


def _configs(**layout) -> list:
    common = {"algorithm.steps": STEPS, "parallel.verify_weight_sync": True, "checkpoint.every_steps": 0}
    return [
        (backend, tiny_config(**common, **layout, **{"optim.backend": backend}))
        for backend in ("torch", "megatron")
    ]


def _check(results: list[dict]) -> None:
    for rank_result in results:
        for backend, r in rank_result.items():
            assert r["matched"] == [True] * STEPS, f"{backend}: rollout weights differ from the trainer's"
            assert all(m > 0 for m in r["moved"]), (
                f"{backend}: an update left the weights unchanged {r['moved']}"
            )
            assert all(m["reshard/verified_params"] > 0 for m in r["metrics"]), backend
    torch_run, megatron_run = results[0]["torch"], results[0]["megatron"]
    for step, (a, b) in enumerate(zip(torch_run["metrics"], megatron_run["metrics"], strict=True), start=1):
        for key in COMPARED:
            assert math.isclose(a[key], b[key], rel_tol=METRIC_RTOL, abs_tol=1e-6), (
                step,
                key,
                a[key],
                b[key],
            )


@pytest.mark.heavy
def test_two_ranks_tensor_parallel_hf_engine(tmp_path):
    """t=2 -> t_g=1: one micro-DP all-gather per sync into the HF engine."""
    layout = {"parallel.tensor": 2, "cluster.tasks_per_node": 2}
    _check(run_ranks(run_and_compare, 2, _configs(**layout), str(tmp_path), STEPS, timeout_s=600))


@pytest.mark.heavy
def test_four_ranks_tensor_and_data_parallel_megatron_engine(tmp_path):
    """t=2, d=2 -> t_g=1 on the megatron rollout engine: the distributed optimizer shards masters and
    moments over d=2 and all-gathers the params into DDP's buffer; the reshard gathers into the
    generation store."""
    layout = {
        "parallel.tensor": 2,
        "parallel.data": 2,
        "rollout.engine": "megatron",
        "cluster.tasks_per_node": 4,
    }
    _check(run_ranks(run_and_compare, 4, _configs(**layout), str(tmp_path), STEPS, timeout_s=900))
