"""Rule-based rewards: a registry of `(prompt, response, answer) -> float` functions.

Keys are `RewardConfig.name` values. `task` is resolved per experiment (the built-in task's own rule);
`model` is the reward-model worker (see reward_model.py) and is not a rule.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from hpcrl.data.tasks import get_task

RuleFn = Callable[[str, str, str], float]

_NUMBER = r"-?[\d,]*\.?\d+"
_AFTER_HASHES = re.compile(rf"####\s*({_NUMBER})")


def _normalise_number(text: str) -> str | None:
    text = text.replace(",", "").strip()
    try:
        value = float(text)
    except ValueError:
        return None
    return str(int(value)) if value.is_integer() else repr(value)


def extract_hash_answer(text: str) -> str | None:
    """The last number written after `####` (GSM8K's answer convention), normalised; None if absent."""
    found = _AFTER_HASHES.findall(text)
    return _normalise_number(found[-1]) if found else None


def exact_match(prompt: str, response: str, answer: str) -> float:
    """1.0 when the response equals the answer after stripping surrounding whitespace."""
    return float(response.strip() == answer.strip())


def gsm8k(prompt: str, response: str, answer: str) -> float:
    """1.0 when the number after the response's last `####` equals the answer's (the answer may be a bare
    number or itself end in `#### n`, as GSM8K solutions do)."""
    predicted = extract_hash_answer(response)
    target = extract_hash_answer(answer) if "####" in answer else _normalise_number(answer)
    return float(predicted is not None and predicted == target)


_FORMAT = re.compile(rf"^.*####\s*{_NUMBER}\s*$", re.DOTALL)


def format_check(prompt: str, response: str, answer: str) -> float:
    """1.0 when the response ends with `#### <number>` (the answer format), whatever the number."""
    return float(bool(_FORMAT.match(response)))


RULES: dict[str, RuleFn] = {"exact_match": exact_match, "gsm8k": gsm8k, "format": format_check}


def task_rule(task_name: str) -> RuleFn:
    """The built-in task's own score as a rule."""
    score = get_task(task_name).score

    def rule(prompt: str, response: str, answer: str) -> float:
        return score(response, answer)

    rule.__name__ = f"task:{task_name}"
    return rule
