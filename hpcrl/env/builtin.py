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
        display_digits: int = 0,
    ):
        """Step rewards of each call the problem needs, in order (a prompt of n operands needs n - 1),
        shaping as those of verl's tool tasks (0 by default): `call_reward` for making it, plus
        `match_reward` times its positional credit against the call it should be (`a+b`, then
        `<a+b>+c`, ...). `tool`: False answers every call `=` (the same task and rewards without the
        tool). `ask`: what call k computes - "argument" (what it says) or "prompt" (the sum of the
        prompt's first k + 1 operands). `latency_s`: seconds each step sleeps (a sandbox's or a web
        tool's latency). `display_digits`: the calculator shows values zero-padded to this many digits
        (a fixed-width display: `=0872`), and the answer is scored against the padded sum too (a
        correct answer is the value, padded or not)."""
        if ask not in ("argument", "prompt"):
            raise ValueError(f"ask must be 'argument' or 'prompt', not {ask!r}")
        self.call_reward, self.match_reward, self.tool, self.ask = call_reward, match_reward, tool, ask
        self.latency_s, self.display_digits = latency_s, display_digits
        self.answer = ""
        self.operands: list[str] = []
        self.calls = 0

    def reset(self, example: dict) -> str:
        self.answer, self.calls = example["answer"], 0
        self.operands = example["prompt"].removesuffix("=").split("+")
        return ""

    def step(self, action: str) -> tuple[str, float, bool, dict]:
        time.sleep(self.latency_s)
        argument = tag_call(action)
        if argument is None:  # the answer
            shown = self._shown(int(self.answer)) if self.answer.isdigit() else self.answer
            right = action in (self.answer, shown)
            info = {"tool_calls": self.calls, "success": float(right)}
            return "", 1.0 if right else positional_score(action, shown), True, info
        self.calls += 1
        needed = self.calls < len(self.operands)
        expected = self._call(self.calls) if needed else ""
        expression = expected if self.ask == "prompt" else argument
        value = calculate(expression) if self.tool and expression else None
        reward = (
            self.call_reward + self.match_reward * positional_score(argument, expected) if needed else 0.0
        )
        observation = f"={'' if value is None else self._shown(value)}"
        return observation, reward, False, {"tool_calls": self.calls, "success": 0.0}

    def _shown(self, value: int) -> str:
        return f"{value:0{self.display_digits}d}" if value >= 0 else str(value)

    def _call(self, k: int) -> str:
        """The k-th call the problem needs: the running sum so far plus the next operand."""
        so_far = self.operands[0] if k == 1 else str(sum(int(x) for x in self.operands[:k]))
        return f"{so_far}+{self.operands[k]}"
