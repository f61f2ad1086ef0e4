"""What one environment step returned, checked: the user's code may return anything."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from hpcrl.data.chat import Message, conversation_problem
from hpcrl.errors import short


class EnvOutputError(ValueError):
    """An environment returned something that is not (observation, finite number, bool, dict)."""


Observation = str | tuple[Message, ...]
"""Text (tokenized as it is), or chat messages (rendered by the model's chat template as the
conversation's continuation, hpcrl.data.chat.continuation_ids)."""


@dataclass(frozen=True)
class StepResult:
    observation: Observation
    """Shown to the model before its next turn (tokenized and appended; no loss on it)."""
    reward: float = 0.0
    """Reward of the turn that led here; it lands on that turn's last token."""
    done: bool = False
    """The episode ends (no further turn)."""
    info: dict[str, float] = field(default_factory=dict)
    """The finite numbers of the environment's info dict (logged as env/<key> means)."""


def checked_reset(value: Any) -> StepResult:
    """reset's observation; EnvOutputError when it is not text (the episode's opening turns are its
    prompt, the data row's: messages there belong in the data, hpcrl.data.chat)."""
    if not isinstance(value, str):
        raise EnvOutputError(
            f"reset returned {_what(value)}, not an observation string (a chat opening is the data's prompt)"
        )
    return StepResult(value)


def checked_step(value: Any) -> StepResult:
    """step's (observation, reward, done, info) - info may be left out; EnvOutputError naming what is
    wrong. JSON carried it here, so a tuple arrives as a list."""
    if not isinstance(value, list | tuple) or len(value) not in (3, 4):
        raise EnvOutputError(f"step returned {_what(value)}, not (observation, reward, done, info)")
    observation, reward, done, *rest = value
    observation = _observation(observation)
    if type(reward) not in (int, float) or not _finite(reward):
        raise EnvOutputError(f"step returned reward {_what(reward)}, not a finite number")
    if type(done) is not bool:
        raise EnvOutputError(f"step returned done {_what(done)}, not True or False")
    info = rest[0] if rest else {}
    if not isinstance(info, dict):
        raise EnvOutputError(f"step returned info {_what(info)}, not a dict")
    numbers = {
        str(k)[:64]: float(v)
        for k, v in list(info.items())[:MAX_INFO_NUMBERS]
        if type(v) in (int, float) and _finite(v) and str(k) not in RESERVED_INFO
    }
    return StepResult(observation, float(reward), done, numbers)


def _observation(value: Any) -> Observation:
    """step's observation: a string, or a list of {role, content} messages (none the assistant's: the
    model writes those)."""
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise EnvOutputError(f"step returned observation {_what(value)}, not a string or a list of messages")
    if len(value) > MAX_OBSERVATION_MESSAGES:
        raise EnvOutputError(f"step returned {len(value)} messages (at most {MAX_OBSERVATION_MESSAGES})")
    if not value:
        return ""
    problem = conversation_problem(value)
    if problem is None and any(m["role"] == "assistant" for m in value):
        problem = "an assistant message (the model writes the assistant's turns)"
    if problem is not None:
        raise EnvOutputError(f"step returned observation messages with {short(problem)}")
    return tuple(Message(m["role"], m["content"]) for m in value)


MAX_OBSERVATION_MESSAGES = 64
"""Messages one step may return."""
MAX_INFO_NUMBERS = 64
"""The first this many entries of an info dict are read (each a metric: env/<key>)."""
RESERVED_INFO = frozenset({"failed", "turns", "observation_cut"})
"""Keys of hpcrl's own episode metrics (env/failed, ...): an info key of that name is ignored."""


def _finite(value: int | float) -> bool:
    """A number a float can hold (an int of 400 digits cannot: OverflowError), not NaN or inf."""
    try:
        return math.isfinite(float(value))
    except OverflowError:
        return False


def _what(value: Any) -> str:
    return f"{type(value).__name__} {short(value)}"
