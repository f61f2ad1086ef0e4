"""Model sizes and the response length are checked at `expand` (exit 2 naming the key), before the memory
planner or a rank divides by them. Before (2026-12-02): `--model.num_attention_heads 0` and
`--model.num_query_groups 0` were ZeroDivisionError tracebacks in `plan`, `--model.vocab_size -6` was a
plan that "fits" with negative parameter counts, `rollout.max_new_tokens 0` failed only on the ranks."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcrl.cli import main
from hpcrl.config.schema import field_types, range_of
from hpcrl.errors import ConfigError
from hpcrl.experiment.resolve import resolve
from hpcrl.plan.memory import predict
from hpcrl.train.config import ModelConfig

TEMPLATE = Path(__file__).resolve().parents[2] / "templates" / "grpo_tiny.yaml"
MODEL_COUNTS = sorted(
    name
    for name, hint in field_types(ModelConfig).items()
    if (ranged := range_of(hint)) and ranged[0] is int and name != "init_seed"
)
"""The model's sizes: its int fields with a range (hpcrl.config.ranges), its seed aside."""


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("model.num_attention_heads", "0"),
        ("model.num_query_groups", "0"),
        ("model.num_layers", "0"),
        ("model.hidden_size", "-1"),
        ("model.vocab_size", "-6"),
        ("model.ffn_hidden_size", "0"),
        ("model.hidden_size", "65"),  # 4 heads of 16.25
        ("model.rope_theta", "-1"),
        ("model.rms_norm_eps", "0"),
        ("rollout.max_new_tokens", "0"),
    ],
)
@pytest.mark.parametrize("command", ["expand", "plan"])
def test_an_impossible_size_is_exit_2_naming_the_key(capsys, command, key, value):
    code = main([command, str(TEMPLATE), f"--{key}", value])
    err = capsys.readouterr().err
    assert code == 2 and f"command line:{key}: " in err and "Traceback" not in err, err


@settings(max_examples=80, deadline=None)
@given(key=st.sampled_from(MODEL_COUNTS), value=st.integers(-(2**40), 2**40))
def test_any_size_is_refused_naming_its_key_or_planned_with_positive_counts(key, value):
    try:
        sweep = resolve(TEMPLATE, {f"model.{key}": value})
    except ConfigError as err:
        assert any((p.key or "").startswith("model.") for p in err.problems), err
        return
    plan = predict(sweep.elements[0].config)
    assert all(component.bytes >= 0 for component in plan.components), plan
