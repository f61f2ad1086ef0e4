"""`--seeds` of the many-seed benchmarks (hpcrl.bench.seeds.seed_list): ranges and lists parse back to the
seeds they name; anything else is an argparse error saying what a seed list is."""

from __future__ import annotations

import argparse

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hpcrl.bench.seeds import MAX_SEEDS, seed_list


@given(st.integers(0, 10_000), st.integers(0, MAX_SEEDS - 1))
def test_a_range_is_every_seed_from_first_to_last(first, span):
    assert seed_list(f"{first}-{first + span}") == list(range(first, first + span + 1))


@given(st.lists(st.integers(0, 10**6), min_size=1, max_size=50, unique=True))
def test_a_comma_list_is_its_seeds_in_order(seeds):
    assert seed_list(",".join(map(str, seeds))) == seeds


@pytest.mark.parametrize(
    "text", ["", "3-1", "a", "0-", "1,1", "-1", "0,-2", "0-1000", "1.5", "0-9\n0", "\x00"]
)
def test_anything_else_is_refused_saying_what_seeds_are(text):
    with pytest.raises(argparse.ArgumentTypeError, match="seeds"):
        seed_list(text)
