"""The cluster's own rules: numbers sbatch would take as given are bounded (a hostile 10^30 or inf)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hpcrl.cluster.config import ClusterConfig
from hpcrl.cluster.rules import MAX_COUNTS, MAX_MEM_GB, check_cluster
from hpcrl.errors import Problem


@pytest.mark.parametrize("name", sorted(MAX_COUNTS))
def test_every_count_has_an_upper_bound(name):
    bound = MAX_COUNTS[name]
    over = ClusterConfig(**{name: bound + 1, "time_min": 60 if name != "time_min" else bound + 1})
    assert Problem(f"must be <= {bound}, got {bound + 1}", key=f"cluster.{name}") in check_cluster(over)
    assert not [p for p in check_cluster(ClusterConfig(**{name: 1})) if p.key == f"cluster.{name}"]


@given(st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.just(float(MAX_MEM_GB))))
def test_mem_gb_is_a_finite_positive_size(mem_gb):
    refused = any(p.key == "cluster.mem_gb" for p in check_cluster(ClusterConfig(mem_gb=mem_gb)))
    assert refused == (not (math.isfinite(mem_gb) and 0 < mem_gb <= MAX_MEM_GB))
