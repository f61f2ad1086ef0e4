"""Estimators against values computed by hand (see the arithmetic in each comment)."""

import math

import pytest
import torch

from hpcrl.rl.advantages import (
    ESTIMATORS,
    AdvantageInputs,
    compute_advantages,
    discounted_returns,
    gae,
    grpo,
    masked_whiten,
    outcome_to_token_rewards,
    reinforce_pp,
    reinforce_pp_baseline,
    remax,
    rloo,
)

MASK_BT = torch.tensor([[1.0, 1, 1], [1, 1, 0]])


def test_gae_by_hand_with_padding():
    rewards = torch.tensor([[0.0, 0, 1], [0, 2, 0]])
    values = torch.tensor([[0.5, 0.6, 0.7], [1.0, 1.0, 9.0]])  # 9.0 sits on padding and must not leak
    adv, ret = gae(rewards, values, MASK_BT, gamma=1.0, lam=0.5)
    # row 0: d2 = 1-0.7 = .3; d1 = .7-.6 = .1 -> .1+.5*.3 = .25; d0 = .6-.5 = .1 -> .1+.5*.25 = .225
    # row 1: d1 = 2-1 = 1; d0 = 1-1 = 0 -> .5*1 = .5; padding 0
    torch.testing.assert_close(adv, torch.tensor([[0.225, 0.25, 0.3], [0.5, 1.0, 0.0]]))
    torch.testing.assert_close(ret, torch.tensor([[0.725, 0.85, 1.0], [1.5, 2.0, 0.0]]))


def test_gae_with_discount():
    adv, _ = gae(torch.tensor([[0.0, 1.0]]), torch.tensor([[0.0, 0.0]]), torch.ones(1, 2), gamma=0.9, lam=1.0)
    torch.testing.assert_close(adv, torch.tensor([[0.9, 1.0]]))


SCORES = torch.tensor([1.0, 0, 0, 1, 0.5, 0.5, 2])
GROUPS = torch.tensor([0, 0, 0, 0, 1, 1, 2])
MASK7 = torch.tensor([[1.0, 1]] * 6 + [[1.0, 0]])


def test_grpo_with_std_by_hand():
    adv = grpo(SCORES, GROUPS, MASK7)
    z = 0.5 / math.sqrt(1 / 3)  # group 0: mean .5, unbiased std sqrt(4*.25/3)
    expected = torch.tensor([z, -z, -z, z, 0, 0, 0])  # group 1: zero spread; group 2: singleton -> 0
    torch.testing.assert_close(adv, expected[:, None] * MASK7, atol=1e-5, rtol=1e-5)


def test_grpo_without_std_by_hand():
    adv = grpo(SCORES, GROUPS, MASK7, norm_by_std=False)
    torch.testing.assert_close(adv[:, 0], torch.tensor([0.5, -0.5, -0.5, 0.5, 0, 0, 0]))
    assert adv[6, 1] == 0  # padding


def test_grpo_groups_need_not_be_contiguous():
    adv = grpo(torch.tensor([1.0, 5.0, 0.0, 3.0]), torch.tensor([7, 3, 7, 3]), torch.ones(4, 1), False)
    torch.testing.assert_close(adv[:, 0], torch.tensor([0.5, 1.0, -0.5, -1.0]))


def test_rloo_by_hand():
    adv = rloo(SCORES[:6], GROUPS[:6], torch.ones(6, 2))
    # r0 = 1 minus mean of the others (0, 0, 1) = 2/3
    torch.testing.assert_close(adv[:, 0], torch.tensor([2 / 3, -2 / 3, -2 / 3, 2 / 3, 0, 0]))


def test_rloo_rejects_singleton_groups():
    with pytest.raises(ValueError, match=r"groups \[2\]"):
        rloo(SCORES, GROUPS, MASK7)


def test_remax_by_hand():
    adv = remax(torch.tensor([1.0, 0.0]), torch.tensor([0.25, 0.25]), MASK_BT)
    torch.testing.assert_close(adv, torch.tensor([[0.75, 0.75, 0.75], [-0.25, -0.25, 0.0]]))


def test_outcome_rewards_land_on_last_real_token():
    rewards = outcome_to_token_rewards(
        torch.tensor([1.0, 2.0, 3.0]), torch.tensor([[1.0, 1, 1], [1, 0, 0], [0, 0, 0]])
    )
    torch.testing.assert_close(rewards, torch.tensor([[0.0, 0, 1], [2, 0, 0], [0, 0, 0]]))


def test_discounted_returns_stop_at_padding():
    ret = discounted_returns(torch.tensor([[1.0, 0, 1], [0, 2, 5]]), MASK_BT, gamma=0.5)
    torch.testing.assert_close(ret, torch.tensor([[1.25, 0.5, 1.0], [1.0, 2.0, 0.0]]))


def test_reinforce_pp_by_hand():
    adv = reinforce_pp(torch.tensor([[0.0, 0, 1], [0, 2, 0]]), MASK_BT, gamma=1.0)
    # returns [[1,1,1],[2,2,-]]: mean 7/5 = 1.4, unbiased var (3*.16 + 2*.36)/4 = .3
    lo, hi = -0.4 / math.sqrt(0.3), 0.6 / math.sqrt(0.3)
    torch.testing.assert_close(adv, torch.tensor([[lo, lo, lo], [hi, hi, 0.0]]), atol=1e-5, rtol=1e-5)


def test_reinforce_pp_baseline_by_hand():
    """Group means 0.5 and 2: centred scores (0.5, -0.5, 1, -1) on (3, 2, 1, 2) tokens; batch whitening
    over the 8 real tokens: mean (1.5 - 1 + 1 - 2) / 8 = -1/16, unbiased variance below."""
    mask = torch.tensor([[1.0, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 0]])
    adv = reinforce_pp_baseline(torch.tensor([1.0, 0.0, 3.0, 1.0]), torch.tensor([0, 0, 1, 1]), mask)
    centred = [0.5] * 3 + [-0.5] * 2 + [1.0] + [-1.0] * 2
    mean = sum(centred) / 8
    std = math.sqrt(sum((c - mean) ** 2 for c in centred) / 7)
    expected = torch.tensor([[0.5, 0.5, 0.5], [-0.5, -0.5, mean], [1.0, mean, mean], [-1.0, -1.0, mean]])
    torch.testing.assert_close(adv, (expected - mean) / std * mask, atol=1e-5, rtol=1e-5)


def test_masked_whiten_ignores_padding_values():
    x = torch.tensor([[1.0, 3.0, 1000.0]])
    out = masked_whiten(x, torch.tensor([[1.0, 1.0, 0.0]]))
    torch.testing.assert_close(
        out, torch.tensor([[-1 / math.sqrt(2), 1 / math.sqrt(2), 0.0]]), atol=1e-6, rtol=1e-6
    )


def test_registry_covers_every_algorithm_and_checks_inputs():
    from hpcrl.algorithm.registry import ALGORITHMS

    assert set(ESTIMATORS) == set(ALGORITHMS)
    inp = AdvantageInputs(
        scores_B=torch.tensor([1.0, 0.0]),
        token_rewards_BT=torch.tensor([[0.0, 1.0], [0.0, 0.0]]),
        mask_BT=torch.ones(2, 2),
        group_ids_B=torch.tensor([0, 0]),
    )
    out = compute_advantages("grpo", inp)
    assert out.advantages_BT[0, 0] > 0 > out.advantages_BT[1, 0]
    with pytest.raises(ValueError, match="critic values"):
        compute_advantages("ppo", inp)
    with pytest.raises(ValueError, match="greedy baseline"):
        compute_advantages("remax", inp)
    with pytest.raises(ValueError, match="unknown advantage estimator 'a2c'"):
        compute_advantages("a2c", inp)


@pytest.mark.parametrize("name", ["grpo", "rloo", "remax", "reinforce_pp", "reinforce_pp_baseline", "ppo"])
def test_kl_in_the_reward_changes_every_online_estimator(name):
    """Issue 13: with kl_in_reward the outcome-only estimators used to read the raw scores, so KL had no
    effect on grpo, rloo and remax. Now each sees score - beta * sum_t KL_t (verl's convention)."""
    from hpcrl.rl.advantages import kl_shaped_rewards

    gen = torch.Generator().manual_seed(0)
    mask = torch.tensor([[1.0, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]])
    scores = torch.tensor([1.0, 0.0, 1.0, 0.0])
    kl = torch.rand(4, 4, generator=gen) * mask
    shaped_scores, shaped_tokens = kl_shaped_rewards(
        outcome_to_token_rewards(scores, mask), mask, kl, kl_coef=0.5
    )
    torch.testing.assert_close(shaped_scores, scores - 0.5 * (kl * mask).sum(1))
    torch.testing.assert_close(shaped_tokens.sum(1), shaped_scores)

    def advantages(s, tokens):
        inp = AdvantageInputs(
            scores_B=s,
            token_rewards_BT=tokens,
            mask_BT=mask,
            group_ids_B=torch.tensor([0, 0, 1, 1]),
            values_BT=torch.zeros(4, 4),
            baseline_scores_B=torch.tensor([0.5, 0.5, 0.5, 0.5]),
        )
        return compute_advantages(name, inp).advantages_BT

    plain = advantages(scores, outcome_to_token_rewards(scores, mask))
    assert not torch.allclose(advantages(shaped_scores, shaped_tokens), plain)


@pytest.mark.parametrize(("gamma", "lam"), [(1.0, 1.0), (0.9, 0.95), (0.5, 0.0)])
def test_an_episodes_observation_tokens_are_skipped_by_gae_and_returns(gamma, lam):
    """Turn 1, an observation (mask 0), turn 2, padding: GAE and discounted returns equal those of the
    model's tokens alone, put back in place (the observation joins the turns, it does not cut them)."""
    gen = torch.Generator().manual_seed(3)
    mask = torch.tensor([[1.0, 1, 0, 0, 1, 1, 0], [1, 0, 0, 1, 0, 1, 1]])
    rewards = torch.randn(2, 7, generator=gen) * mask
    values = torch.randn(2, 7, generator=gen)
    adv, ret = gae(rewards, values, mask, gamma=gamma, lam=lam)
    returns = discounted_returns(rewards, mask, gamma)
    for b in range(2):
        keep = mask[b].bool()
        n = int(keep.sum())
        a_c, r_c = gae(rewards[b, keep][None], values[b, keep][None], torch.ones(1, n), gamma, lam)
        torch.testing.assert_close(adv[b, keep], a_c[0])
        torch.testing.assert_close(ret[b, keep], r_c[0])
        torch.testing.assert_close(
            returns[b, keep], discounted_returns(rewards[b, keep][None], torch.ones(1, n), gamma)[0]
        )
        assert (
            torch.all(adv[b, ~keep] == 0)
            and torch.all(ret[b, ~keep] == 0)
            and torch.all(returns[b, ~keep] == 0)
        )


def test_episode_rewards_stay_where_they_were_earned_and_the_rest_lands_on_the_last_model_token():
    mask = torch.tensor([[1.0, 1, 0, 0, 1, 1, 0, 0], [1, 1, 1, 0, 0, 0, 0, 0]])
    env = torch.zeros(2, 8)
    env[0, 1], env[0, 5] = 0.3, 1.0  # the last tokens of turns 1 and 2
    env[1, 2] = 0.5
    scores = env.sum(1) + torch.tensor([-0.2, 0.0])  # e.g. DAPO's length penalty on top
    rewards = outcome_to_token_rewards(scores, mask, env)
    torch.testing.assert_close(rewards.sum(1), scores)
    torch.testing.assert_close(rewards[0], torch.tensor([0, 0.3, 0, 0, 0, 0.8, 0, 0]))
    torch.testing.assert_close(rewards[1], torch.tensor([0, 0, 0.5, 0, 0, 0, 0, 0]))
    # a single response: the outcome on its last real token, as before
    torch.testing.assert_close(
        outcome_to_token_rewards(torch.tensor([2.0]), torch.tensor([[1.0, 1, 0]])),
        torch.tensor([[0, 2.0, 0]]),
    )
