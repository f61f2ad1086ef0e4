"""Token-budget micro-batches (optim.max_tokens_per_micro_batch, hpcrl.train.token_budget): the packer's
rules (property tests), and a real megatron-core trainer whose gradient is the same, within 1e-6 of
the largest entry (fp32), for every loss aggregation and every cut as one micro-batch of the whole batch."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcrl import cli
from hpcrl.distributed.spawn import run_ranks
from hpcrl.train.batch import TrainBatch
from hpcrl.train.token_budget import balance_over_ranks, computed_tokens, pack_by_tokens

LOSS_AGGS = ("token_mean", "seq_mean_token_sum", "seq_mean_token_mean", "seq_mean_token_sum_norm")


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 64), min_size=1, max_size=40), st.integers(1, 256))
def test_every_row_once_and_no_micro_batch_over_budget(widths, budget):
    bins = pack_by_tokens(widths, budget)
    assert sorted(i for rows in bins for i in rows) == list(range(len(widths)))
    for rows in bins:
        assert rows == sorted(rows)
        width = max(widths[i] for i in rows)
        assert len(rows) * width <= budget or len(rows) == 1  # a row over budget stands alone
    assert [rows[0] for rows in bins] == sorted(rows[0] for rows in bins)
    assert computed_tokens(widths, bins) <= len(widths) * max(widths)  # never more than padding all


def test_short_rows_share_a_micro_batch_and_long_ones_do_not():
    widths = [10, 2, 2, 10, 3, 2]
    bins = pack_by_tokens(widths, 12)
    assert bins == [[0], [1, 2, 4, 5], [3]]  # 4 x 3 = 12 tokens; the 10s alone
    assert computed_tokens(widths, bins) == 10 + 12 + 10  # vs 6 x 10 = 60 padded


def _ragged_batch(vocab: int) -> TrainBatch:
    """B=6 rows of S=12: prompts left padded (2-4 tokens), responses right padded (1-8 tokens)."""
    from tests.train._batches import ragged_batch

    return ragged_batch(vocab, [2, 4, 3, 4, 2, 3], [8, 1, 5, 2, 7, 3], width=12, seed=3)


def gradients_by_cut(rank: int, world: int) -> dict:
    """For each loss_agg, the policy's and the critic's gradients with the whole batch in one
    micro-batch and with token budgets of 12, 20 and 40."""
    from hpcrl.algorithm.config import AlgorithmConfig
    from hpcrl.rl.objectives import policy_loss_fn, value_loss_fn
    from hpcrl.train.config import OptimizerConfig
    from hpcrl.train.model import build_train_groups, gather_full_state_dict
    from hpcrl.train.trainer import build_policy_trainer, build_value_trainer
    from tests.train._rank_fns import tiny_config

    groups = build_train_groups(1, 1, 1)
    cfg = tiny_config("qwen2")
    batch = _ragged_batch(cfg.vocab_size)
    out = {}
    for agg in LOSS_AGGS:
        algo = AlgorithmConfig(loss_agg=agg, entropy_coef=0.01)
        for kind, build, loss in (
            ("policy", build_policy_trainer, policy_loss_fn(algo, 8)),
            ("value", build_value_trainer, value_loss_fn(algo, 8)),
        ):
            for budget in (None, 12, 20, 40):
                optim = OptimizerConfig(
                    lr=0.0, grad_clip=0, micro_batch_size=6, max_tokens_per_micro_batch=budget
                )
                trainer = build(cfg, optim, groups)  # the same init (cfg.init_seed) for every budget
                cuts = []  # what the trainer's update cut, recorded by a spy on the batch method
                original = TrainBatch.token_micro_batches

                def spy(self, max_tokens, _original=original, _cuts=cuts):
                    parts = _original(self, max_tokens)
                    _cuts.append([(len(p), p.input_ids_BT.shape[1]) for p in parts])
                    return parts

                TrainBatch.token_micro_batches = spy
                try:
                    metrics = trainer.update(dataclasses.replace(batch), loss)
                finally:
                    TrainBatch.token_micro_batches = original
                grads = gather_full_state_dict(trainer.model, cfg, groups, grads=True)
                out[(agg, kind, budget)] = {"loss": metrics["loss"], "grads": grads, "cuts": cuts}
    return out


@pytest.fixture(scope="module")
def by_cut():
    return run_ranks(gradients_by_cut, 1, timeout_s=600)[0]


@pytest.mark.dist
@pytest.mark.parametrize("agg", LOSS_AGGS)
@pytest.mark.parametrize("kind", ["policy", "value"])
def test_the_gradient_does_not_depend_on_the_cut(by_cut, agg, kind):
    ref = by_cut[(agg, kind, None)]
    assert ref["cuts"] == []  # the reference ran by micro_batch_size: one micro-batch of all 6 rows
    for budget in (12, 20, 40):
        got = by_cut[(agg, kind, budget)]
        [cut] = got["cuts"]
        assert sum(rows for rows, _ in cut) == 6 and all(rows * width <= budget for rows, width in cut)
        assert got["loss"] == pytest.approx(ref["loss"], rel=1e-6, abs=1e-7)
        for name, g in ref["grads"].items():
            scale = g.abs().max().clamp(min=1e-12)
            assert float((got["grads"][name] - g).abs().max() / scale) <= 1e-6, (agg, kind, budget, name)
    # the cut really cut: the smallest budget made several micro-batches, trimmed below the full width
    cut12 = by_cut[(agg, kind, 12)]["cuts"][0]
    assert len(cut12) >= 3 and min(width for _, width in cut12) < 12
    assert any(float(g.abs().max()) > 0 for g in ref["grads"].values())


REPO = Path(__file__).resolve().parents[2]


def _run(capsys, tmp_path: Path, *overrides: str) -> list[dict]:
    capsys.readouterr()
    argv = ["run", str(REPO / "templates" / "grpo_tiny.yaml"), "--run_root", str(tmp_path / "runs")]
    argv += ["--algorithm.steps", "2", "--algorithm.eval_every", "0", "--checkpoint.every_steps", "0"]
    argv += ["--logging.tensorboard", "false", "--logging.progress", "false", "--logging.plot", "false"]
    assert cli.main([*argv, *overrides]) == 0
    run_dir = Path(capsys.readouterr().out.splitlines()[0].removeprefix("run dir: "))
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.dist
def test_the_main_job_with_a_token_budget_takes_the_same_first_step(tmp_path, capsys):
    padded = _run(capsys, tmp_path)
    budget = _run(capsys, tmp_path, "--optim.max_tokens_per_micro_batch", "64")
    assert padded[0]["reward/mean"] == budget[0]["reward/mean"]  # the same samples before any update
    for key in ("actor/loss", "actor/grad_norm"):
        assert budget[0][key] == pytest.approx(padded[0][key], rel=1e-5), key


@pytest.mark.parametrize(
    "overrides, says",
    [
        (["--optim.max_tokens_per_micro_batch", "5"], "cannot hold the longest sequence"),
        (["--optim.max_tokens_per_micro_batch", "0"], "out of range: must be in [1, 2^30], got 0"),
    ],
)
def test_a_budget_below_the_longest_sequence_is_exit_2_at_expand(capsys, overrides, says):
    capsys.readouterr()
    assert cli.main(["expand", str(REPO / "templates" / "grpo_tiny.yaml"), *overrides]) == 2
    err = capsys.readouterr().err
    assert "optim.max_tokens_per_micro_batch" in err and says in err, err


@pytest.mark.parametrize("template", ["dpo_tiny.yaml", "rm_tiny.yaml"])
def test_pair_stages_refuse_a_token_budget_at_expand(capsys, template):
    capsys.readouterr()
    args = ["expand", str(REPO / "templates" / template), "--optim.max_tokens_per_micro_batch", "4096"]
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert "optim.max_tokens_per_micro_batch" in err and "cuts micro-batches by rows" in err, err


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 64), max_size=40), st.integers(1, 8))
def test_balanced_ranks_hold_every_row_once_and_differ_by_at_most_one_row(widths, ranks):
    parts = balance_over_ranks(widths, ranks)
    assert len(parts) == ranks and sorted(i for rows in parts for i in rows) == list(range(len(widths)))
    assert all(rows == sorted(rows) for rows in parts)
    sums = [sum(widths[i] for i in rows) for rows in parts]
    # LPT: the fullest rank was the emptiest when it took its last row, so it leads by at most one row
    assert not widths or max(sums) - min(sums) <= max(widths)


@pytest.mark.parametrize("template", ["dpo_tiny.yaml", "rm_tiny.yaml"])
def test_pair_stages_refuse_token_balancing_at_expand(capsys, template):
    capsys.readouterr()
    args = ["expand", str(REPO / "templates" / template), "--optim.balance_dp_tokens", "true"]
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert "optim.balance_dp_tokens" in err and "dispatches rows to DP ranks by count" in err, err
