"""Strict YAML loading (bounded: size, alias expansion, ints; every failure a ConfigError) and the fast
config emitter (round trip through the strict loader)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcrl.config.yaml_io import MAX_YAML_BYTES, dump_yaml, load_yaml, loads_yaml
from hpcrl.errors import ConfigError

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


def _laughs(levels: int = 9) -> str:
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


@pytest.mark.timeout(60)  # walking 10^9 nodes could never finish in time: the guard is the "at once"
def test_alias_expansion_is_capped_before_anything_walks_it():
    """A billion laughs (10^9 nodes from a few hundred bytes) is refused at load, at once; a recursive
    alias too; a few shared anchors and merge keys still load."""
    with pytest.raises(ConfigError, match="YAML aliases expand to more than 1,000,000 nodes") as err:
        loads_yaml(_laughs(), "laughs.yaml")
    assert len(str(err.value)) < 200
    with pytest.raises(ConfigError, match="a YAML alias refers to a node that contains it"):
        loads_yaml("a: &a [1, *a]")
    assert loads_yaml(_laughs(5))["a4"][9][9][9][9][9] == "lol"  # 10^5 expanded nodes: fine
    assert loads_yaml("x: &x {k: 1}\ny: {<<: *x, z: 2}\n") == {"x": {"k": 1}, "y": {"k": 1, "z": 2}}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("? [1, 2]\n: 3\n", "a mapping key must be a scalar, got a list"),
        ("{{a: 1}: 2}\n", "a mapping key must be a scalar, got a dict"),
        ("a: !!int x\n", "invalid literal for int()"),
        ("a: !!timestamp 2020-99-99\n", "month must be in 1..12"),
        ("a: " + "1" * 5000 + "\n", "Exceeds the limit (4300 digits)"),
        ("a: 0x" + "f" * 300 + "\n", "an integer beyond 1024 bits is not a config value"),
        ("a: " + "x" * (MAX_YAML_BYTES + 1), "larger than 8 MiB"),
    ],
    ids=["list-key", "dict-key", "bad-int-tag", "bad-timestamp", "5000-digits", "huge-hex", "too-large"],
)
def test_values_yaml_cannot_build_are_config_errors_not_tracebacks(text, expected):
    with pytest.raises(ConfigError) as err:
        loads_yaml(text, "t.yaml")
    assert expected in str(err.value) and str(err.value).startswith("t.yaml: ")


def test_a_file_that_is_not_utf8_is_a_config_error(tmp_path):
    path = tmp_path / "t.yaml"
    path.write_bytes(b"name: \xff\xfe\n")
    with pytest.raises(ConfigError, match="not UTF-8 text"):
        load_yaml(path)
