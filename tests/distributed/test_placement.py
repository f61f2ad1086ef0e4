"""The placement's own keys (hpcrl.distributed.placement): the staleness bound is bounded."""

from __future__ import annotations

import pytest

from hpcrl.config.schema import range_problems
from hpcrl.distributed.config import ParallelConfig
from hpcrl.distributed.placement import MAX_OFF_POLICY_STEPS, PLACEMENTS, PlacementConfig


@pytest.mark.parametrize("m", [-1, 0, 1, MAX_OFF_POLICY_STEPS, MAX_OFF_POLICY_STEPS + 1, 10**9])
def test_the_staleness_bound_is_bounded(m):
    placement = PlacementConfig(kind="async", max_off_policy_steps=m)
    keys = {p.key for p in range_problems(placement, "placement.")}
    assert ("placement.max_off_policy_steps" not in keys) == (0 <= m <= MAX_OFF_POLICY_STEPS)


@pytest.mark.parametrize(("kind", "ranks"), [("colocated", 4), ("split", 8), ("async", 4 + 2 * 3)])
def test_each_placement_owns_its_rank_count(kind, ranks):
    parallel = ParallelConfig(tensor=2, data=2, rollout_tensor=2)
    placement = PlacementConfig(kind=kind, rollout_pool_data=3)
    assert PLACEMENTS[kind].ranks(parallel, placement) == ranks
