"""Built-in environments, named like user ones: `rollout.env: hpcrl.env.builtin:Calculator`.

`Calculator` is the tool task for the tiny model: the built-in `add_digits` prompts (`482+390=`) ask for
a sum the 76K-parameter model cannot work out in its head; a turn `<|tool|>482+390` calls the calculator,
whose observation is `=872` (`=?` for anything it cannot compute); the first turn that is not a call is
the answer and ends the episode, rewarded with the task's positional credit (1.0 only for the exact
sum). Without the tool the same model and token budget must add the digits itself.
"""

from __future__ import annotations

from hpcrl.data.tasks import positional_score
from hpcrl.env.tools import calculate, tag_call


class Calculator:
    """One episode of the calculator tool task (see the module docstring)."""

    def __init__(self, call_reward: float = 0.0, tool: bool = True):
        """`call_reward`: added for each call whose expression the calculator computes (a shaping bonus,
        0 by default); `tool`: False answers every call `=?` (the same task without the tool, the
        baseline of benchmarks/agentic.py)."""
        self.call_reward, self.tool = call_reward, tool
        self.answer = ""
        self.calls = 0

    def reset(self, example: dict) -> str:
        self.answer, self.calls = example["answer"], 0
        return ""

    def step(self, action: str) -> tuple[str, float, bool, dict]:
        expression = tag_call(action)
        if expression is not None:
            self.calls += 1
            value = calculate(expression) if self.tool else None
            reward = self.call_reward if value is not None else 0.0
            return (
                f"={'?' if value is None else value}",
                reward,
                False,
                {"tool_calls": self.calls, "success": 0.0},
            )
        info = {"tool_calls": self.calls, "success": float(action == self.answer)}
        return "", positional_score(action, self.answer), True, info
