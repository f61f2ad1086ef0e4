"""Strict YAML loading and the fast config emitter (round trip through the strict loader)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from hpcrl.config.yaml_io import dump_yaml, loads_yaml

SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False),
    st.text(max_size=20),
)
KEYS = st.text(min_size=1, max_size=10)
DATA = st.recursive(
    st.dictionaries(KEYS, SCALARS, max_size=4),
    lambda children: st.dictionaries(
        KEYS,
        st.one_of(
            children,
            SCALARS,
            st.lists(SCALARS, max_size=3),
            st.dictionaries(KEYS, st.text(max_size=8), max_size=3),
        ),
        max_size=4,
    ),
    max_leaves=20,
)


@settings(max_examples=150, deadline=None)
@given(DATA)
def test_dump_yaml_round_trips_through_the_strict_loader(data):
    assert loads_yaml(dump_yaml(data)) == data


def test_dump_yaml_writes_floats_yaml11_reads_as_floats():
    assert dump_yaml({"lr": 1e-6}) == "lr: 1.0e-06\n"
    assert loads_yaml(dump_yaml({"lr": 1e-6}))["lr"] == 1e-6
