"""Losses against hand-computed values, and micro-batch accumulation equivalence."""

import math

import pytest
import torch

from hpcrl.posttrain.preference_losses import dpo_loss
from hpcrl.rl.losses import (
    ClipRange,
    agg_loss,
    clipped_value_loss,
    entropy_bonus,
    entropy_from_logits,
    kl_penalty,
    ppo_clip_loss,
    truncated_is_weights,
)

LOSS_BT = torch.tensor([[1.0, 2, 3], [4, 0, 0]])
MASK_BT = torch.tensor([[1.0, 1, 1], [1, 0, 0]])


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("token_mean", 10 / 4),
        ("seq_mean_token_sum", (6 + 4) / 2),
        ("seq_mean_token_mean", (2 + 4) / 2),
        ("seq_mean_token_sum_norm", (6 + 4) / (2 * 3)),  # Dr. GRPO: / (N_seqs * L), L = width 3
    ],
)
def test_aggregations_by_hand(mode, expected):
    assert agg_loss(LOSS_BT, MASK_BT, mode).item() == pytest.approx(expected)


def test_dr_grpo_normalises_by_the_constant_generation_budget():
    """L is the budget (rollout.max_new_tokens), not the batch's width: (6 + 4) / (2 seqs * 8)."""
    assert agg_loss(LOSS_BT, MASK_BT, "seq_mean_token_sum_norm", norm_length=8).item() == pytest.approx(
        10 / 16
    )


@pytest.mark.parametrize(
    "mode", ["token_mean", "seq_mean_token_sum", "seq_mean_token_mean", "seq_mean_token_sum_norm"]
)
def test_micro_batches_with_global_denominator_sum_to_the_full_batch(mode):
    full = agg_loss(LOSS_BT, MASK_BT, mode, norm_length=3)
    denom = {"token_mean": MASK_BT.sum().item(), "seq_mean_token_sum_norm": 2 * 3}.get(mode, 2)
    parts = sum(agg_loss(LOSS_BT[i : i + 1], MASK_BT[i : i + 1], mode, denom, 3) for i in range(2))
    torch.testing.assert_close(parts, full)


def test_unknown_aggregation_is_named():
    with pytest.raises(ValueError, match="'token_sum'"):
        agg_loss(LOSS_BT, MASK_BT, "token_sum")


def test_ppo_clip_by_hand():
    old = torch.zeros(1, 4)
    logp = torch.log(torch.tensor([[1.5, 0.5, 0.5, 7.0]]))
    adv = torch.tensor([[1.0, 1.0, -1.0, 1.0]])
    mask = torch.tensor([[1.0, 1, 1, 0]])
    loss, stats = ppo_clip_loss(logp, old, adv, mask, ClipRange())
    # token 0: max(-1.5, -1.2) = -1.2 (clipped); token 1: max(-.5, -.8) = -.5; token 2: max(.5, .8) = .8 (clipped)
    assert loss.item() == pytest.approx((-1.2 - 0.5 + 0.8) / 3)
    assert stats.clip_fraction == pytest.approx(2 / 3)


def test_ppo_clip_gradient_vanishes_when_clipped():
    logp = torch.log(torch.tensor([[1.5, 0.9]])).requires_grad_()
    loss, _ = ppo_clip_loss(logp, torch.zeros(1, 2), torch.ones(1, 2), torch.ones(1, 2), ClipRange())
    loss.backward()
    assert logp.grad[0, 0] == 0 and logp.grad[0, 1] == pytest.approx(-0.9 / 2)


def test_clip_higher_by_hand():
    """DAPO's asymmetric clip: ratio 1.5 with A = 1 is capped at 1 + 0.28; ratio 0.5 with A = -1 at 1 - 0.2."""
    logp = torch.log(torch.tensor([[1.5, 0.5]]))
    loss, stats = ppo_clip_loss(
        logp, torch.zeros(1, 2), torch.tensor([[1.0, -1.0]]), torch.ones(1, 2), ClipRange(0.2, 0.28, None)
    )
    assert loss.item() == pytest.approx((-1.28 + 0.8) / 2)
    assert stats.clip_fraction == 1.0


def test_dual_clip_caps_the_loss_of_a_negative_advantage():
    """A = -1, ratio 5: PPO-clip gives max(5, 1.2) = 5; the dual clip caps it at -A * c = 3 and its
    gradient vanishes; a positive advantage with ratio 5 is clipped as before (-1.2), never dual-capped."""
    logp = torch.log(torch.tensor([[5.0, 5.0, 2.0]])).requires_grad_()
    adv = torch.tensor([[-1.0, 1.0, -1.0]])
    loss, stats = ppo_clip_loss(logp, torch.zeros(1, 3), adv, torch.ones(1, 3), ClipRange(0.2, 0.2, 3.0))
    assert loss.item() == pytest.approx((3.0 - 1.2 + 2.0) / 3)
    assert stats.dual_clip_fraction == pytest.approx(1 / 3)
    loss.backward()
    assert logp.grad[0, 0] == 0 and logp.grad[0, 1] == 0 and logp.grad[0, 2] == pytest.approx(2.0 / 3)
    off, _ = ppo_clip_loss(logp.detach(), torch.zeros(1, 3), adv, torch.ones(1, 3), ClipRange(0.2, 0.2, None))
    assert off.item() == pytest.approx((5.0 - 1.2 + 2.0) / 3)


def test_truncated_importance_weights_by_hand():
    """w = min(pi_old / pi_rollout, C): 0.5/0.25 = 2 -> capped at 1.5; 0.5/0.5 = 1; 0.2/0.4 = 0.5; 1 on padding."""
    old = torch.log(torch.tensor([[0.5, 0.5, 0.2, 0.9]]))
    rollout = torch.log(torch.tensor([[0.25, 0.5, 0.4, 1e-30]]))
    mask = torch.tensor([[1.0, 1, 1, 0]])
    weights, stats = truncated_is_weights(old, rollout, mask, cap=1.5)
    torch.testing.assert_close(weights, torch.tensor([[1.5, 1.0, 0.5, 1.0]]))
    assert stats.clip_fraction == pytest.approx(1 / 3) and stats.weight_mean == pytest.approx(1.0)


def test_tis_weights_scale_each_token_of_the_policy_loss():
    logp = torch.log(torch.tensor([[1.0, 1.0]])).requires_grad_()
    weights = torch.tensor([[1.5, 0.5]])
    loss, _ = ppo_clip_loss(
        logp, torch.zeros(1, 2), torch.ones(1, 2), torch.ones(1, 2), ClipRange(), weights_BT=weights
    )
    assert loss.item() == pytest.approx((-1.5 - 0.5) / 2)
    loss.backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[-0.75, -0.25]]))  # weights carry no gradient


def test_clipped_value_loss_by_hand():
    loss, frac = clipped_value_loss(
        torch.tensor([[1.0, 1.0]]),
        torch.tensor([[0.5, 1.0]]),
        torch.tensor([[2.0, 0.0]]),
        torch.tensor([[1.0, 1.0]]),
        clip=0.2,
    )
    # token 0: clipped v = .7 -> .5*max(1, 1.69) = .845; token 1: .5*1 = .5
    assert loss.item() == pytest.approx((0.845 + 0.5) / 2)
    assert frac == pytest.approx(0.5)


def test_kl_estimators_by_hand():
    logp, ref = torch.tensor([math.log(0.5)]), torch.tensor([math.log(0.25)])
    assert kl_penalty(logp, ref, "k1").item() == pytest.approx(math.log(2))
    assert kl_penalty(logp, ref, "k3").item() == pytest.approx(0.5 - 1 + math.log(2))
    assert kl_penalty(logp, ref, "k2").item() == pytest.approx(0.5 * math.log(2) ** 2)
    assert kl_penalty(logp, ref, "mse").item() == kl_penalty(logp, ref, "k2").item()
    assert kl_penalty(ref, logp, "abs").item() == pytest.approx(math.log(2))  # |log r|, either sign
    assert kl_penalty(ref, logp, "k1").item() == pytest.approx(-math.log(2))
    with pytest.raises(ValueError, match="'k9'"):
        kl_penalty(logp, ref, "k9")


def test_k3_is_nonnegative_and_zero_at_equality():
    logp = torch.randn(100)
    assert (kl_penalty(logp, torch.randn(100), "k3") >= 0).all()
    assert kl_penalty(logp, logp, "k3").abs().max() == 0


def test_entropy_by_hand():
    logits = torch.log(torch.tensor([[[0.5, 0.25, 0.25]]]))
    h = entropy_from_logits(logits)
    assert h.item() == pytest.approx(1.5 * math.log(2))
    bonus = entropy_bonus(h, torch.ones(1, 1), coef=0.1)
    assert bonus.item() == pytest.approx(-0.15 * math.log(2))


def test_dpo_by_hand():
    loss, stats = dpo_loss(
        torch.tensor([-1.0]), torch.tensor([-2.0]), torch.tensor([-1.5]), torch.tensor([-1.5]), 0.5
    )
    # margin = .5 * ((-1 + 1.5) - (-2 + 1.5)) = .5
    assert loss.item() == pytest.approx(math.log1p(math.exp(-0.5)))
    assert stats.reward_accuracy == 1.0 and stats.reward_margin == pytest.approx(0.5)


def test_approx_kl_is_k3_of_kl_old_new_from_old_samples():
    """Samples from pi_old, r = pi/pi_old: k3 = r - 1 - log r, whose mean is KL(old || new) (issue 13:
    the old code computed 1/r - 1 + log r, biased)."""
    gen = torch.Generator().manual_seed(0)
    old_probs = torch.tensor([0.5, 0.3, 0.2])
    new_probs = torch.tensor([0.35, 0.4, 0.25])
    tokens = torch.multinomial(old_probs, 200_000, replacement=True, generator=gen)[None]
    _, stats = ppo_clip_loss(
        new_probs.log()[tokens],
        old_probs.log()[tokens],
        torch.zeros_like(tokens, dtype=torch.float),
        torch.ones_like(tokens, dtype=torch.float),
        ClipRange(),
    )
    true_kl = float((old_probs * (old_probs / new_probs).log()).sum())
    assert stats.approx_kl == pytest.approx(true_kl, rel=0.02)


def test_an_overflowing_log_ratio_at_a_padded_position_leaves_the_loss_finite():
    """A log-ratio of 100 where the mask is 0 (issue 13: nan before, from inf * 0)."""
    logp = torch.tensor([[-1.0, 99.0]], requires_grad=True)
    old = torch.tensor([[-1.2, -1.0]])
    mask = torch.tensor([[1.0, 0.0]])
    loss, stats = ppo_clip_loss(logp, old, torch.ones(1, 2), mask, ClipRange())
    loss.backward()
    assert torch.isfinite(loss) and math.isfinite(stats.approx_kl) and torch.isfinite(logp.grad).all()
    k3 = kl_penalty(torch.tensor([[0.0, -100.0]]), torch.tensor([[0.0, 100.0]]), "k3")
    assert torch.isfinite(k3).all() and k3.max() == 10.0  # verl's clamp
    from hpcrl.rl.losses import agg_loss

    assert torch.isfinite(agg_loss(torch.tensor([[1.0, float("nan")]]), mask, "seq_mean_token_sum"))
