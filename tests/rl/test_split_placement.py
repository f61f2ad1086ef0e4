"""Split placement: actor + rollout on one rank pool, critic + reference on another (HybridFlow §4.1).

The same PPO job (critic, KL to a reference) runs colocated on 1 rank and split on 2 ranks (actor on rank
0, critic and reference on rank 1); batches cross pools by collectives over the default group. With the
same seeds both runs see the same samples, so their per-step metrics agree to fp tolerance.
"""

from pathlib import Path

import pytest

from hpcrl.distributed.spawn import run_ranks
from hpcrl.errors import ConfigError
from hpcrl.rl.assemble import placement_problems
from tests.rl._job_ranks import tiny_config

pytestmark = pytest.mark.dist

SPLIT = {"placement.kind": "split", "cluster.tasks_per_node": 2}
"""Split placement asks for two pools of the training layout's ranks."""

COMPARED = (
    "reward/mean",
    "reward/std",
    "kl/ref",
    "advantage/mean_abs",
    "actor/loss",
    "actor/grad_norm",
    "actor/entropy",
    "critic/value_loss",
    "critic/grad_norm",
    "mismatch/logprob_max",
)


def run_steps(rank: int, world: int, cfg, run_dir: str, steps: int) -> list[dict]:
    """Build the job on this rank and run `steps` driver steps; every rank returns its metrics."""
    import torch

    from hpcrl.rl.assemble import build_job

    torch.manual_seed(cfg.seed)
    job = build_job(cfg, Path(run_dir), rank, world)
    roles = {
        "actor": job.driver.learner.models.actor.trainer is not None,
        "critic": job.driver.learner.models.critic.trainer is not None,
        "reference": job.driver.learner.models.reference.trainer is not None,
        "rollout": job.driver.collector.rollout.engine is not None,
    }
    out = [job.driver.step(step) | {"roles": roles} for step in range(steps)]
    job.logger.close()
    return out


def _ppo(**overrides):
    return tiny_config(
        **{
            "algorithm.name": "ppo",
            "algorithm.kl_coef": 0.05,
            "algorithm.steps": 2,
            "algorithm.eval_every": 1,
            "algorithm.prompts_per_step": 4,
            **overrides,
        }
    )


@pytest.mark.heavy
@pytest.mark.slow
def test_ppo_with_critic_on_its_own_pool_matches_colocated(tmp_path):
    split = run_ranks(run_steps, 2, _ppo(**SPLIT), str(tmp_path / "s"), 2, timeout_s=300)
    [colocated] = run_ranks(run_steps, 1, _ppo(), str(tmp_path / "c"), 2, timeout_s=300)
    actor_rank, model_rank = split
    assert actor_rank[0]["roles"] == {"actor": True, "critic": False, "reference": False, "rollout": True}
    assert model_rank[0]["roles"] == {"actor": False, "critic": True, "reference": True, "rollout": False}
    assert colocated[0]["roles"] == dict.fromkeys(("actor", "critic", "reference", "rollout"), True)
    for step in range(2):
        # both pools take the same decisions on the same global tensors
        assert {k: actor_rank[step][k] for k in COMPARED} == {k: model_rank[step][k] for k in COMPARED}
        for key in COMPARED:
            assert actor_rank[step][key] == pytest.approx(colocated[step][key], rel=1e-5, abs=1e-6), (
                step,
                key,
            )
        assert actor_rank[step]["reward/heldout"] == colocated[step]["reward/heldout"]
        assert actor_rank[step]["critic/grad_norm"] > 0 and actor_rank[step]["kl/ref"] >= 0
    # the second step ran on updated weights on both pools (the first update moved actor and critic)
    assert actor_rank[1]["kl/ref"] > 0


def test_split_placement_rules_name_the_key():
    ppo = _ppo(**SPLIT)
    assert placement_problems(ppo, world=2) == []
    [wrong_world] = placement_problems(ppo, world=3)
    assert wrong_world.key == "placement.kind" and "= 2 ranks, the job has 3" in wrong_world.message
    with pytest.raises(ConfigError, match="placement.kind: split placement puts the critic"):
        tiny_config(**SPLIT)  # GRPO without KL has no role for the second pool: refused at expand
    assert placement_problems(_ppo(), world=1) == []


def test_both_pools_training_groups_get_the_configured_timeout(monkeypatch):
    """Issue 14: the RL job's TP/PP/DP groups were built without parallel.timeout_s (torch's default)."""
    from hpcrl.rl import assemble
    from hpcrl.rl.assemble import Pools, _pool_groups

    calls = []
    monkeypatch.setattr(assemble, "build_train_groups", lambda *a, **kw: calls.append(kw) or object())
    cfg = _ppo(**SPLIT, **{"parallel.timeout_s": 37.0})
    _pool_groups(cfg, Pools.for_config(cfg, world=2))
    assert [kw["timeout_s"] for kw in calls] == [37.0, 37.0]
    assert [kw["rank_offset"] for kw in calls] == [0, 1]


@pytest.mark.heavy
@pytest.mark.slow
def test_hpcrl_run_split_ppo_checkpoints_and_resumes(tmp_path):
    """`hpcrl run` with placement split: 2 local ranks (one per pool) save at step 2; the same command
    again resumes there and redoes only the last step."""
    import json
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[2]
    args = [
        sys.executable, "-m", "hpcrl", "run", str(repo / "templates" / "ppo_tiny.yaml"),
        "--run_root", str(tmp_path), "--placement.kind", "split", "--algorithm.kl_coef", "0.05",
        "--cluster.tasks_per_node", "2", "--algorithm.steps", "3", "--algorithm.eval_every", "0",
        "--checkpoint.every_steps", "2", "--checkpoint.save_on_exit", "false", "--checkpoint.export_hf", "false",
        "--logging.tensorboard", "false", "--logging.plot", "false",
    ]  # fmt: skip
    outputs = []
    for _ in range(2):
        done = subprocess.run(args, capture_output=True, text=True, timeout=300)
        outputs.append(done.stdout + done.stderr)
        assert done.returncode == 0, outputs[-1][-3000:]
    assert "at step 2" not in outputs[0] and "at step 2" in outputs[1]
    [metrics] = tmp_path.glob("*/*/metrics.jsonl")
    assert [json.loads(line)["step"] for line in metrics.read_text().splitlines()] == [0, 1, 2]
