"""The RL job end to end: megatron actor + reshard engine + HF rollout + rewards + metrics, on gloo ranks."""

import pytest
import torch

from hpcrl.distributed.spawn import RankFailed, run_ranks
from hpcrl.errors import ConfigError
from hpcrl.experiment.config import ExperimentConfig
from hpcrl.metrics.sinks import read_jsonl
from hpcrl.rl.job import config_problems
from tests.rl._job_ranks import (
    heldout_curve,
    run_algorithms,
    run_job,
    run_named,
    run_twice_with_resume,
    run_uninterrupted,
    run_with_flaky_reward,
    tiny_config,
)

pytestmark = pytest.mark.dist


@pytest.mark.heavy
@pytest.mark.slow
def test_grpo_tiny_short_run_shows_a_clear_rise(tmp_path):
    cfg = tiny_config(**{"algorithm.steps": 100, "algorithm.eval_every": 50, "logging.tensorboard": True})
    [last] = run_ranks(run_job, 1, cfg, str(tmp_path), timeout_s=300)
    curve = heldout_curve(tmp_path)
    assert [s for s, _ in curve] == [0, 50, 100]
    assert curve[0][1] <= 0.2, curve
    assert curve[-1][1] >= curve[0][1] + 0.25, curve
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    assert len(rows) == 101 and all({"step", "reward/mean", "time/elapsed_s"} <= set(r) for r in rows[:-1])
    assert set(rows[-1]) == {"step", "reward/heldout", "time/elapsed_s"}  # the final policy's evaluation
    assert rows[-2]["mismatch/logprob_max"] < 1e-5  # HF eager rollout == megatron trainer at t=1 (fp32)
    assert 0 < rows[-2]["share/generate"] < 1 and rows[-2]["tps/generate"] > 0
    assert (tmp_path / "reward.png").exists() and list((tmp_path / "tb").iterdir())
    assert last["reward/heldout"] == curve[-1][1]


@pytest.mark.heavy
def test_train_t2_rollout_t1_through_the_reshard_engine(tmp_path):
    _two_rank_run(tmp_path, {"parallel.tensor": 2, "parallel.rollout_tensor": 1})


@pytest.mark.heavy
@pytest.mark.slow
@pytest.mark.parametrize("layout", [{"parallel.data": 2}, {"parallel.pipeline": 2}], ids=["d2", "p2"])
def test_ppo_with_critic_on_other_two_rank_layouts(tmp_path, layout):
    _two_rank_run(tmp_path, {**layout, "algorithm.name": "ppo"})


def _two_rank_run(tmp_path, overrides):
    cfg = tiny_config(
        **{
            "cluster.tasks_per_node": 2,
            "algorithm.steps": 3,
            "algorithm.eval_every": 2,
            "algorithm.prompts_per_step": 4,
            **overrides,
        }
    )
    results = run_ranks(run_job, 2, cfg, str(tmp_path), timeout_s=300)
    assert results[0]["reward/mean"] == results[1]["reward/mean"]  # both ranks saw the same global batch
    assert results[0]["actor/grad_norm"] == results[1]["actor/grad_norm"]
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    assert len(rows) == 4 and [s for s, _ in heldout_curve(tmp_path)] == [0, 2, 3]
    # after the reshard, HF rollout log-probs == megatron trainer log-probs (TP=2 sums in another order: ~1e-6)
    assert all(r["mismatch/logprob_max"] < 1e-5 for r in rows[:3])
    assert all(r["actor/grad_norm"] > 0 for r in rows[:3])


@pytest.mark.heavy
@pytest.mark.slow
def test_every_online_estimator_runs_a_step(tmp_path):
    common = {"algorithm.steps": 2, "algorithm.eval_every": 0, "algorithm.prompts_per_step": 4}
    configs = [
        tiny_config(**common, **{"algorithm.name": name, **extra})
        for name, extra in [
            ("ppo", {"algorithm.kl_coef": 0.05, "algorithm.kl_in_reward": True}),
            ("remax", {"algorithm.clip_ratio_c": None, "algorithm.tis_cap": None}),
            ("rloo", {"algorithm.loss_agg": "seq_mean_token_sum"}),
            ("reinforce_pp", {"algorithm.kl_coef": 0.05, "algorithm.kl_estimator": "k1"}),
            (
                "reinforce_pp_baseline",
                {
                    "algorithm.kl_coef": 0.05,
                    "algorithm.kl_estimator": "k2",
                    "algorithm.clip_ratio_high": 0.28,
                },
            ),
            (
                "grpo",
                {
                    "algorithm.kl_coef": 0.05,
                    "algorithm.norm_adv_by_std": False,
                    "algorithm.loss_agg": "seq_mean_token_sum_norm",
                    "algorithm.ppo_epochs": 2,
                },
            ),
        ]
    ]
    [results] = run_ranks(run_algorithms, 1, configs, str(tmp_path), timeout_s=300)
    assert set(results) == {"ppo", "remax", "rloo", "reinforce_pp", "reinforce_pp_baseline", "grpo"}
    assert "critic/value_loss" in results["ppo"] and "kl/ref" in results["ppo"]
    assert results["grpo"]["actor/kl_loss"] >= 0 and results["grpo"]["actor/approx_kl"] > 0  # 2nd epoch moved
    assert "tis/weight_mean" not in results["remax"]  # tis_cap: null turns TIS off
    for name, metrics in results.items():
        assert torch.isfinite(torch.tensor(metrics["actor/loss"])), name
        if name != "remax":  # HF eager rollout == megatron trainer in fp32: weights ~1, none truncated
            assert (
                metrics["tis/weight_mean"] == pytest.approx(1.0, abs=1e-4) and metrics["tis/clip_frac"] == 0
            )


@pytest.mark.heavy
@pytest.mark.slow
def test_dynamic_sampling_trains_on_informative_groups_only(tmp_path):
    """DAPO's dynamic sampling with the overlong penalty on: each step draws batches until 4 groups whose
    rewards differ are kept (or 3 batches ran), and the trained groups are exactly those."""
    cfg = tiny_config(
        **{
            "algorithm.steps": 3,
            "algorithm.eval_every": 0,
            "algorithm.prompts_per_step": 4,
            "algorithm.dynamic_sampling": True,
            "algorithm.max_gen_batches": 3,
            "algorithm.overlong_buffer_len": 1,
            "rollout.samples_per_prompt": 4,
        }
    )
    run_ranks(run_job, 1, cfg, str(tmp_path), timeout_s=300)
    rows = [r for r in read_jsonl(tmp_path / "metrics.jsonl") if "sampling/gen_batches" in r]
    assert len(rows) == 3
    for r in rows:
        assert 1 <= r["sampling/gen_batches"] <= 3
        assert r["sampling/kept_groups"] == 4 or r["sampling/gen_batches"] == 3
        assert r["advantage/mean_abs"] > 0  # every kept group has a nonzero group-relative advantage


@pytest.mark.heavy
@pytest.mark.slow
@pytest.mark.parametrize("name", ["grpo", "rloo", "remax", "reinforce_pp", "reinforce_pp_baseline", "ppo"])
def test_kl_in_reward_changes_the_update_of_every_online_estimator(tmp_path, name):
    """Issue 13: grpo, rloo and remax with kl_in_reward used to update exactly as with kl_coef 0. Step 1's
    policy is the reference (KL 0), so the runs agree there; from step 2 on the KL reaches the update."""
    common = {
        "algorithm.name": name,
        "algorithm.steps": 2,
        "algorithm.eval_every": 0,
        "algorithm.prompts_per_step": 4,
    }
    named = [
        ("no_kl", tiny_config(**common)),
        ("kl_in_reward", tiny_config(**common, **{"algorithm.kl_coef": 1.0, "algorithm.kl_in_reward": True})),
    ]
    run_ranks(run_named, 1, named, str(tmp_path), timeout_s=300)
    rows = {
        name: [r for r in read_jsonl(tmp_path / name / "metrics.jsonl") if "actor/grad_norm" in r]
        for name, _ in named
    }
    plain, shaped = rows["no_kl"], rows["kl_in_reward"]
    assert plain[0]["actor/grad_norm"] == shaped[0]["actor/grad_norm"] and shaped[0]["kl/ref"] == 0
    assert shaped[1]["kl/ref"] > 0 and shaped[1]["reward/kl_shaped_mean"] < shaped[1]["reward/mean"]
    assert plain[1]["actor/grad_norm"] != shaped[1]["actor/grad_norm"]


@pytest.mark.heavy
@pytest.mark.slow
def test_reward_model_run_end_to_end(tmp_path):
    from transformers import LlamaConfig, LlamaForSequenceClassification

    from hpcrl.data.tasks import ALPHABET
    from hpcrl.data.tokenizer import build_char_tokenizer

    rm_dir = tmp_path / "rm"
    torch.manual_seed(0)
    LlamaForSequenceClassification(
        LlamaConfig(
            vocab_size=16,
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
            num_labels=1,
            pad_token_id=0,
        )
    ).save_pretrained(rm_dir)
    build_char_tokenizer(ALPHABET, 16).save_pretrained(rm_dir)
    cfg = tiny_config(
        **{
            "reward.name": "model",
            "reward.model_path": str(rm_dir),
            "algorithm.steps": 2,
            "algorithm.eval_every": 0,
            "algorithm.prompts_per_step": 4,
        }
    )
    [last] = run_ranks(run_job, 1, cfg, str(tmp_path / "run"), timeout_s=300)
    rows = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert len(rows) == 2 and rows[0]["reward/std"] > 0  # real, varying classifier scores
    assert last["step"] == 1


@pytest.mark.heavy
@pytest.mark.slow
def test_a_raising_reward_is_skipped_and_counted_or_stops_the_run(tmp_path):
    cfg = tiny_config(
        **{
            "reward.name": "exact_match",
            "reward.nan_policy": "skip",
            "data.source": "builtin",
            "algorithm.steps": 2,
            "algorithm.eval_every": 0,
            "algorithm.prompts_per_step": 4,
        }
    )
    [last] = run_ranks(run_with_flaky_reward, 1, cfg, str(tmp_path / "skip"), timeout_s=300)
    rows = read_jsonl(tmp_path / "skip" / "metrics.jsonl")
    assert all(r["reward/skipped"] > 0 for r in rows)
    cfg.reward.nan_policy = "error"
    with pytest.raises(RankFailed, match="RewardError.*even tail.*nan_policy=error"):
        run_ranks(run_with_flaky_reward, 1, cfg, str(tmp_path / "error"), timeout_s=300)


def test_config_problems_are_all_reported_before_any_work():
    cfg = ExperimentConfig()
    cfg.algorithm.name = "dpo"  # offline DPO is a stage of its own (stage: dpo), not an RL algorithm
    cfg.rollout.engine = "hf"
    cfg.rollout.samples_per_prompt = 1
    cfg.parallel.rollout_tensor = 2
    cfg.data.max_prompt_length = 60
    cfg.model.vocab_size = 30
    keys = {p.key for p in config_problems(cfg, world_size=1)}
    assert {"algorithm.name", "parallel.rollout_tensor", "model.max_position_embeddings"} <= keys
    cfg = ExperimentConfig()
    cfg.algorithm.name = "rloo"
    cfg.rollout.samples_per_prompt = 1
    assert {p.key for p in config_problems(cfg, 1)} == {"rollout.samples_per_prompt"}
    from hpcrl.rl.job import main

    with pytest.raises(ConfigError, match="algorithm.name"):
        main(ExperimentConfig(algorithm=type(cfg.algorithm)(name="dpo")), "unused")


@pytest.mark.heavy
@pytest.mark.slow
def test_checkpoint_resume_continues_the_same_run(tmp_path):
    """4 steps + checkpoint, then resume to 6 == 6 steps straight (same rewards, same final weights path)."""
    common = {
        "algorithm.eval_every": 0,
        "algorithm.prompts_per_step": 4,
        "checkpoint.every_steps": 2,
        "checkpoint.async_save": False,
    }
    first = tiny_config(**common, **{"algorithm.steps": 4})
    full = tiny_config(**common, **{"algorithm.steps": 6})
    _, resumed = run_ranks(run_twice_with_resume, 1, first, full, str(tmp_path / "a"), timeout_s=300)[0]
    straight = run_ranks(run_uninterrupted, 1, full, str(tmp_path / "b"), timeout_s=300)[0]
    rows_a = read_jsonl(tmp_path / "a" / "metrics.jsonl")
    rows_b = read_jsonl(tmp_path / "b" / "metrics.jsonl")
    assert [r["step"] for r in rows_a] == [0, 1, 2, 3, 4, 5]  # resumed at step 4, nothing repeated
    assert [r["reward/mean"] for r in rows_a] == [r["reward/mean"] for r in rows_b]
    assert resumed["actor/loss"] == pytest.approx(straight["actor/loss"], rel=1e-5, abs=1e-7)
    assert (tmp_path / "a" / "checkpoints" / "latest").exists()
