"""Tool-call parsing and the calculator: model text is untrusted input."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from hpcrl.env.tools import MAX_OPERAND_DIGITS, TOOL_TAG, ToolCall, calculate, hermes_calls, tag_call

operands = st.integers(min_value=0, max_value=10**MAX_OPERAND_DIGITS - 1)


@given(st.lists(operands, min_size=1, max_size=4), st.lists(st.sampled_from("+-*"), min_size=3, max_size=3))
def test_calculate_agrees_with_python_on_every_well_formed_expression(numbers, ops):
    expression = str(numbers[0]) + "".join(op + str(n) for op, n in zip(ops, numbers[1:], strict=False))
    assert calculate(expression) == eval(expression)  # noqa: S307 - the oracle, on digits and + - * only


@given(st.text(max_size=60))
def test_calculate_never_raises_and_refuses_what_is_not_arithmetic(text):
    value = calculate(text)
    assert value is None or isinstance(value, int)
    if any(c not in "0123456789+-*" for c in text):
        assert value is None


def test_calculate_refuses_huge_operands_and_code():
    assert calculate("9" * (MAX_OPERAND_DIGITS + 1) + "*9") is None
    assert calculate("__import__('os').system('true')") is None
    assert calculate("1+") is None and calculate("") is None and calculate("2**3") is None


def test_tag_calls_are_turns_that_open_with_the_tool_token():
    assert tag_call(f"{TOOL_TAG}482+390") == "482+390"
    assert tag_call("482+390") is None and tag_call(f"x{TOOL_TAG}1+1") is None


def test_hermes_blocks_parse_and_malformed_ones_are_reported():
    good = json.dumps({"name": "calc", "arguments": {"expression": "1+2"}})
    as_string = json.dumps({"name": "calc", "arguments": json.dumps({"x": 1})})
    text = f"think <tool_call>{good}</tool_call> and <tool_call>{{oops</tool_call><tool_call>{as_string}</tool_call>"
    parsed = hermes_calls(text)
    assert parsed.calls == [ToolCall("calc", {"expression": "1+2"}), ToolCall("calc", {"x": 1})]
    assert parsed.malformed == ["{oops"]
    assert hermes_calls('<tool_call>["a"]</tool_call><tool_call>{"name": 3}</tool_call>').malformed == [
        '["a"]',
        '{"name": 3}',
    ]


@given(st.text(max_size=200))
def test_hermes_parsing_never_raises(text):
    parsed = hermes_calls(text)
    assert all(isinstance(c.name, str) and isinstance(c.arguments, dict) for c in parsed.calls)
