"""Tool calls in a model's turn, and a bounded calculator for the built-in tool task.

Two syntaxes:
- the tiny tag syntax, what the built-in character tokenizer can write: a turn that starts with the
  tool token `<|tool|>` is a call, its argument the rest of the turn (`<|tool|>47+3` -> "47+3");
- Hermes / Qwen2.5 / Qwen3 function calling: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`
  blocks, as those models' chat templates render them (a block that is not such JSON is reported, not
  dropped silently: the environment decides what a malformed call earns).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

TOOL_TAG = "<|tool|>"
"""The built-in tokenizer's tool role token (hpcrl.data.tokenizer.ROLE_TOKENS)."""
_HERMES_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


def tag_call(turn: str, tag: str = TOOL_TAG) -> str | None:
    """The argument of a tag-syntax call (the text after `tag`, stripped), None when `turn` is no call."""
    return turn[len(tag) :].strip() if turn.startswith(tag) else None


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ParsedCalls:
    calls: list[ToolCall]
    malformed: list[str]
    """The text of each `<tool_call>` block that is not {"name": str, "arguments": dict} JSON."""


def hermes_calls(turn: str) -> ParsedCalls:
    """Every `<tool_call>` block of `turn` in order: parsed calls, and the blocks that did not parse."""
    calls, malformed = [], []
    for block in _HERMES_BLOCK.findall(turn):
        try:
            data = json.loads(block)
        except ValueError:
            malformed.append(block)
            continue
        arguments = data.get("arguments", {}) if isinstance(data, dict) else None
        if isinstance(arguments, str):  # some templates carry arguments as a JSON string
            try:
                arguments = json.loads(arguments)
            except ValueError:
                arguments = None
        if (
            not isinstance(data, dict)
            or not isinstance(data.get("name"), str)
            or not isinstance(arguments, dict)
        ):
            malformed.append(block)
            continue
        calls.append(ToolCall(data["name"], arguments))
    return ParsedCalls(calls, malformed)


MAX_OPERAND_DIGITS = 12
"""The calculator refuses longer numbers: a model's call cannot make it compute 10^6-digit products."""
_NUMBER = rf"\d{{1,{MAX_OPERAND_DIGITS}}}"
_EXPRESSION = re.compile(rf"{_NUMBER}(?:[+\-*]{_NUMBER})*")


def calculate(expression: str) -> int | None:
    """The value of `a op b op c ...` over non-negative integers of at most MAX_OPERAND_DIGITS digits with
    + - * (the usual precedence: products first), None for anything else. No eval: a model's text is
    untrusted input."""
    if len(expression) > 4 * MAX_OPERAND_DIGITS or not _EXPRESSION.fullmatch(expression):
        return None
    total, sign, product = 0, 1, None
    for token in re.findall(r"\d+|[+\-*]", expression):
        if token in "+-":
            total += sign * product
            sign, product = (1 if token == "+" else -1), None
        elif token == "*":
            continue
        else:
            product = int(token) if product is None else product * int(token)
    return total + sign * product
