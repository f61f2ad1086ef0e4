"""Balanced DP ranks (optim.balance_dp_tokens; hpcrl.rl.workers.TrainerWorker over
hpcrl.train.token_budget.balance_over_ranks), on 2 real gloo DP ranks: the log-probs come back in the
batch's order and equal the contiguous dispatch's, the update's gradient is the same, and the ranks'
token sums are closer."""

from __future__ import annotations

import pytest
import torch

from hpcrl.distributed.spawn import run_ranks
from hpcrl.train.token_budget import balance_over_ranks, imbalance

pytestmark = pytest.mark.dist
WIDTHS = [12, 11, 12, 10, 2, 3, 2, 4]
"""Long rows first: the contiguous halves hold 45 and 11 tokens."""


def _batch(vocab: int):
    from hpcrl.train.batch import TrainBatch

    gen = torch.Generator().manual_seed(7)
    B, S = len(WIDTHS), max(WIDTHS)
    ids = torch.randint(0, vocab, (B, S), generator=gen)
    attention = torch.zeros(B, S, dtype=torch.bool)
    response = torch.zeros(B, S, dtype=torch.bool)
    for b, width in enumerate(WIDTHS):
        attention[b, :width] = True
        response[b, 1:width] = True
    extras = {"advantages_BT": torch.randn(B, S, generator=gen) * response}
    return TrainBatch(ids, attention, response, extras=extras)


def dispatch_both_ways(rank: int, world: int) -> dict:
    from hpcrl.train.config import OptimizerConfig
    from hpcrl.train.model import build_train_groups, gather_full_state_dict
    from hpcrl.train.trainer import build_policy_trainer
    from hpcrl.train.workers import TrainerWorker
    from tests.train._rank_fns import policy_loss, tiny_config

    groups = build_train_groups(1, 1, 2)
    cfg = tiny_config("qwen2")
    batch = _batch(cfg.vocab_size)
    out = {}
    for balance in (False, True):
        trainer = build_policy_trainer(cfg, OptimizerConfig(lr=0.0, grad_clip=0, micro_batch_size=8), groups)
        worker = TrainerWorker(trainer, 8, balance_tokens=balance)
        logprobs = worker.forward(batch).logprobs_BT
        stats = worker.update(batch, policy_loss)
        grads = gather_full_state_dict(trainer.model, cfg, groups, grads=True)
        out[balance] = {
            "logprobs": logprobs,
            "stats": stats,
            "grads": grads,
            "local": len(worker._local(batch, worker._partition(batch))),
        }
    return out


@pytest.fixture(scope="module")
def ranks():
    return run_ranks(dispatch_both_ways, 2, timeout_s=300)


def test_log_probs_come_back_in_the_batch_order(ranks):
    for rank in ranks:
        contiguous, balanced = rank[False]["logprobs"], rank[True]["logprobs"]
        assert contiguous.shape == balanced.shape == (len(WIDTHS), max(WIDTHS))
        assert float((contiguous - balanced).abs().max()) <= 1e-6


def test_the_gradient_is_the_contiguous_dispatchs(ranks):
    for rank in ranks:
        ref, got = rank[False]["grads"], rank[True]["grads"]
        for name, g in ref.items():
            assert float((got[name] - g).abs().max() / g.abs().max().clamp(min=1e-12)) <= 1e-6, name
        assert rank[True]["stats"]["loss"] == pytest.approx(rank[False]["stats"]["loss"], rel=1e-6)


def test_the_ranks_hold_closer_token_sums_and_say_so(ranks):
    parts = balance_over_ranks(WIDTHS, 2)
    assert imbalance(WIDTHS, parts) < 1.05 < imbalance(WIDTHS, [[0, 1, 2, 3], [4, 5, 6, 7]])
    for rank in ranks:
        assert rank[True]["stats"]["dp/token_imbalance"] == pytest.approx(imbalance(WIDTHS, parts))
        assert "dp/token_imbalance" not in rank[False]["stats"]
    assert sorted([ranks[0][True]["local"], ranks[1][True]["local"]]) == sorted(len(p) for p in parts)
