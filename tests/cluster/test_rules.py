"""The cluster's own rules: numbers sbatch would take as given are bounded (a hostile 10^30 or inf)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hpcrl.cluster.config import MAX_MEM_GB, ClusterConfig
from hpcrl.cluster.rules import check_cluster
from hpcrl.config.ranges import Range
from hpcrl.config.schema import field_types, range_of

RANGES = {name: range_of(hint) for name, hint in field_types(ClusterConfig).items() if range_of(hint)}
COUNTS = sorted(name for name, (kind, _) in RANGES.items() if kind is int)


def _range(name: str) -> Range:
    return RANGES[name][1]


def test_the_counts_are_the_ones_sbatch_reads():
    assert set(COUNTS) >= {"nodes", "tasks_per_node", "cpus_per_task", "gpus_per_node", "time_min"}
    assert {"array_parallelism", "max_requeues", "signal_delay_s"} <= set(COUNTS)


@pytest.mark.parametrize("name", COUNTS)
def test_every_count_has_an_upper_bound(name):
    bound = _range(name).le
    assert bound is not None
    over = ClusterConfig(**{name: bound + 1})
    problems = [p for p in check_cluster(over) if p.key == f"cluster.{name}"]
    assert [p.message for p in problems] == [f"out of range: must be {_range(name)}, got {bound + 1}"]
    assert not [p for p in check_cluster(ClusterConfig(**{name: 1})) if p.key == f"cluster.{name}"]


@given(st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.just(float(MAX_MEM_GB))))
def test_mem_gb_is_a_finite_positive_size(mem_gb):
    refused = any(p.key == "cluster.mem_gb" for p in check_cluster(ClusterConfig(mem_gb=mem_gb)))
    assert refused == (not (math.isfinite(mem_gb) and 0 < mem_gb <= MAX_MEM_GB))
