"""The algorithm registry's rules for the async placement's keys."""

from __future__ import annotations

import pytest

from hpcrl.algorithm.config import AlgorithmConfig
from hpcrl.algorithm.registry import MAX_OFF_POLICY_STEPS, _async_rules


@pytest.mark.parametrize("m", [-1, 0, 1, MAX_OFF_POLICY_STEPS, MAX_OFF_POLICY_STEPS + 1, 10**9])
def test_the_staleness_bound_is_bounded(m):
    rules = _async_rules(AlgorithmConfig(placement="async", max_off_policy_steps=m))
    ok = dict((key, passed) for key, passed, _ in rules if key == "algorithm.max_off_policy_steps")
    assert ok["algorithm.max_off_policy_steps"] == (0 <= m <= MAX_OFF_POLICY_STEPS)
