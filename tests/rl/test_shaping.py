"""DAPO's overlong penalty and dynamic-sampling filter against hand-computed values."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcrl.rl.shaping import first_groups, informative_groups, overlong_penalty


def test_overlong_penalty_by_hand():
    """L_max 16, buffer 4: no penalty up to 12 tokens, then -(len - 12) / 4 * factor."""
    lengths = torch.tensor([3, 12, 13, 14, 16])
    torch.testing.assert_close(
        overlong_penalty(lengths, max_new_tokens=16, buffer_len=4, factor=0.5),
        torch.tensor([0.0, 0.0, -0.125, -0.25, -0.5]),
    )
    assert overlong_penalty(lengths, 16, 0, 1.0).abs().sum() == 0  # buffer 0: off


def test_informative_groups_drop_groups_whose_scores_are_all_equal():
    scores = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.5, 0.5])
    groups = torch.tensor([7, 7, 3, 3, 5, 5, 9, 9])
    assert informative_groups(scores, groups).tolist() == [
        False,
        False,
        True,
        True,
        False,
        False,
        False,
        False,
    ]


def test_first_groups_keeps_groups_in_order_of_appearance():
    assert first_groups(torch.tensor([4, 4, 2, 2, 9, 9]), 2).tolist() == [
        True,
        True,
        True,
        True,
        False,
        False,
    ]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.sampled_from([0.0, 0.5, 1.0])), min_size=1, max_size=30))
def test_kept_groups_are_exactly_those_with_a_nonzero_advantage(rows):
    """A kept row's group has two different scores (so GRPO gives it a nonzero advantage somewhere); a
    dropped row's group has one score only."""
    groups = torch.tensor([g for g, _ in rows])
    scores = torch.tensor([s for _, s in rows])
    keep = informative_groups(scores, groups)
    for g in set(groups.tolist()):
        distinct = len(set(scores[groups == g].tolist()))
        assert bool(keep[groups == g].all()) == (distinct > 1)
        assert bool(keep[groups == g].any()) == (distinct > 1)
