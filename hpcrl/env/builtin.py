"""Built-in environments, named like user ones: `rollout.env: hpcrl.env.builtin:Calculator`.

`Calculator` is the tool task for the tiny model: the built-in `add_digits` prompts (`482+390=`) ask for
a sum the 76K-parameter model cannot work out in its head; a turn `<|tool|>482+390` calls the calculator,
whose observation is `=872` (`=` alone for anything it cannot compute: the tiny alphabet has no `?`);
the first turn that is not a call is the answer and ends the episode, rewarded with the task's
positional credit (1.0 only for the exact sum; info `success` 1 only then). Without the tool
(`tool: false`) the same model and token budget must add the digits itself.

`ask: prompt` makes any call compute the prompt's own sum (the call names the problem, not the
expression): RL from a random 76K-parameter model does not learn to copy the expression into the call
within minutes (measured: docs/agentic.md), so the tiny template asks this way; `ask: argument` (the
default) computes what the call says, for models that can write it.
"""

from __future__ import annotations

import time

from hpcrl.data.tasks import positional_score
from hpcrl.env.tools import calculate, tag_call


class Calculator:
    """One episode of the calculator tool task (see the module docstring)."""

    def __init__(
        self,
        call_reward: float = 0.0,
        match_reward: float = 0.0,
        tool: bool = True,
        ask: str = "argument",
        latency_s: float = 0.0,
    ):
        """Step rewards of the first call, shaping as those of verl's tool tasks (0 by default):
        `call_reward` for making it, plus `match_reward` times its positional credit against the prompt's
        own expression. `tool`: False answers every call `=?` (the same task and rewards without the
        tool, the baseline of benchmarks/agentic.py)."""
        self.call_reward, self.match_reward, self.tool, self.ask = call_reward, match_reward, tool, ask
        self.latency_s = latency_s
        self.answer = self.expression = ""
        self.calls = 0

    def reset(self, example: dict) -> str:
        self.answer, self.calls = example["answer"], 0
        self.expression = example["prompt"].removesuffix("=")
        return ""

    def step(self, action: str) -> tuple[str, float, bool, dict]:
        time.sleep(self.latency_s)
        expression = tag_call(action)
        if expression is not None:
            self.calls += 1
            if self.ask == "prompt":
                expression = self.expression
            value = calculate(expression) if self.tool else None
            first = self.calls == 1
            match = positional_score(expression, self.expression)
            reward = self.call_reward + self.match_reward * match if first else 0.0
            return (
                f"={'' if value is None else value}",
                reward,
                False,
                {"tool_calls": self.calls, "success": 0.0},
            )
        info = {"tool_calls": self.calls, "success": float(action == self.answer)}
        return "", positional_score(action, self.answer), True, info
