"""hpcrl.rollout.megatron_engine.prefill_buckets: contiguous ranges over every row, at most `buckets`,
never splitting one length, and as cheap (rows x longest) as any partition (brute force on small cases)."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from hpcrl.rollout.megatron_engine import prefill_buckets


def _cost(lengths, ranges):
    return sum((stop - first) * lengths[stop - 1] for first, stop in ranges)


def _cheapest(lengths, buckets):
    """Every way to cut the sorted rows into at most `buckets` contiguous groups."""
    n, best = len(lengths), None
    for k in range(1, buckets + 1):
        for cuts in itertools.combinations(range(1, n), k - 1):
            bounds = [0, *cuts, n]
            cost = _cost(lengths, list(itertools.pairwise(bounds)))
            best = cost if best is None else min(best, cost)
    return best


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 48), min_size=1, max_size=9), st.integers(1, 4))
def test_ranges_cover_every_row_and_cost_the_least(lengths, buckets):
    lengths = sorted(lengths)
    ranges = prefill_buckets(lengths, buckets)
    assert ranges[0][0] == 0 and ranges[-1][1] == len(lengths) and len(ranges) <= buckets
    assert all(a[1] == b[0] and a[0] < a[1] for a, b in itertools.pairwise([*ranges, (len(lengths), None)]))
    assert all(lengths[stop - 1] < lengths[stop] for _, stop in ranges[:-1])  # one length, one group
    assert _cost(lengths, ranges) == _cheapest(lengths, buckets)


def test_a_long_tail_of_prompts_prefills_with_little_padding():
    lengths = sorted(1 + (i % 48) for i in range(480))  # every length 1..48, ten rows each
    ranges = prefill_buckets(lengths)
    assert len(ranges) == 4
    padded = len(lengths) * 48
    assert 1 - sum(lengths) / _cost(lengths, ranges) < 0.19 < 0.48 < 1 - sum(lengths) / padded
