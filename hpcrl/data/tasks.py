"""Built-in prompt tasks for the CPU demo: tiny digit puzzles with an exact rule for the reward.

Prompts look like `"412="` (or `"12+34="`); a response is the characters the model writes before <eos>.
Scores give partial credit per position, `matches / max(len(answer), len(response))`, so too long and too
short responses both lose, and only an exact answer scores 1.0. `even_digits` has no single answer: its
score is the share of the `num_digits` response positions that hold an even digit. `zero_digits` is the
variable-length one: a prompt of 0..`num_digits` digits asks for one 0 per digit, then <eos> (responses of
1..num_digits+1 tokens: the longest sample of a batch sets its generation time). `reverse_exact` is the
reverse task with no partial credit: 1.0 for the whole reversed answer, else 0 - a random policy's
samples of 4 digits all score 0 (16^-4 of them would not), so RL from scratch has no signal to start from
and the model must first learn the task by SFT (tests/rl/test_sft_then_rl.py). `long_tail` has real
lengths: a prompt `LL+DIGITS=` (4..48 tokens: 1..44 digits) asks for DIGITS repeated until LL (01..96)
characters, LL drawn long-tailed (geometric with mean `num_digits`, cut to 1..96), so a batch mixes a few
long responses among many short ones, as reasoning traces do (issue 25).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass

from hpcrl.data.chat import Conversation
from hpcrl.errors import ConfigError, Problem


@dataclass(frozen=True)
class Example:
    prompt: str
    """The prompt text (a chat row's: its turns before the last assistant turn, rendered with the
    generation prompt, hpcrl.data.chat)."""
    answer: str
    conversation: Conversation | None = None
    """A chat row's whole conversation (SFT trains on each of its assistant turns); None for flat rows."""


def positional_score(response: str, answer: str) -> float:
    """Share of positions where response and answer agree, over the longer of the two."""
    if not answer and not response:
        return 1.0
    matches = sum(a == b for a, b in zip(response, answer, strict=False))
    return matches / max(len(answer), len(response))


@dataclass(frozen=True)
class Task:
    name: str
    alphabet: str
    make: Callable[[random.Random, int], Example]
    """A random example with `num_digits` digits."""
    score: Callable[[str, str], float]
    """(response, answer) -> reward in [0, 1]."""

    def num_distinct(self, num_digits: int) -> int:
        if self.name == "zero_digits":  # every length 0..num_digits
            return sum(10**length for length in range(num_digits + 1))
        if self.name == "long_tail":  # at least the 10^44 digit strings of the longest prompts
            return 10**LONG_TAIL_MAX_DIGITS
        operands = {"add_digits": 2, "add3_digits": 3}.get(self.name, 1)
        return 10 ** (operands * num_digits)


def _digits(rng: random.Random, n: int) -> str:
    return "".join(rng.choice("0123456789") for _ in range(n))


def _copy(rng: random.Random, n: int) -> Example:
    d = _digits(rng, n)
    return Example(f"{d}=", d)


def _reverse(rng: random.Random, n: int) -> Example:
    d = _digits(rng, n)
    return Example(f"{d}=", d[::-1])


def _add(rng: random.Random, n: int) -> Example:
    a, b = _digits(rng, n), _digits(rng, n)
    return Example(f"{a}+{b}=", str(int(a) + int(b)))


def _add3(rng: random.Random, n: int) -> Example:
    a, b, c = _digits(rng, n), _digits(rng, n), _digits(rng, n)
    return Example(f"{a}+{b}+{c}=", str(int(a) + int(b) + int(c)))


def _even(rng: random.Random, n: int) -> Example:
    return Example(f"{_digits(rng, n)}=", "0" * n)  # the answer only fixes the length


def _zeros(rng: random.Random, n: int) -> Example:
    length = rng.randint(0, n)
    return Example(f"{_digits(rng, length)}=", "0" * length)


LONG_TAIL_MAX_RESPONSE = 96
"""`long_tail`: the longest response asked for (tokens; rollout.max_new_tokens must reach it)."""
LONG_TAIL_MAX_DIGITS = 44
"""`long_tail`: the most prompt digits (a prompt of LL+ DIGITS =: 4..48 tokens)."""


def long_tail_length(rng: random.Random, mean: float) -> int:
    """A response length: geometric on 1, 2, ... with mean `mean` (P(k) = p(1-p)^(k-1), p = 1/mean), cut to
    1..LONG_TAIL_MAX_RESPONSE (Knuth, TAOCP vol. 2, 3.4.1: k = ceil(ln U / ln(1-p)))."""
    if mean <= 1:
        return 1
    u = 1.0 - rng.random()  # in (0, 1]
    k = max(1, math.ceil(math.log(u) / math.log1p(-1.0 / mean)))
    return min(k, LONG_TAIL_MAX_RESPONSE)


def _long_tail(rng: random.Random, mean: int) -> Example:
    length = long_tail_length(rng, mean)
    digits = _digits(rng, rng.randint(1, LONG_TAIL_MAX_DIGITS))
    return Example(f"{length:02d}+{digits}=", (digits * length)[:length])


def exact_score(response: str, answer: str) -> float:
    """1.0 for exactly the answer, else 0."""
    return float(response == answer)


def _even_score(response: str, answer: str) -> float:
    return sum(ch in "02468" for ch in response[: len(answer)]) / max(len(answer), len(response))


TASKS: dict[str, Task] = {
    "copy_digits": Task("copy_digits", "0123456789=", _copy, positional_score),
    "reverse_digits": Task("reverse_digits", "0123456789=", _reverse, positional_score),
    "add_digits": Task("add_digits", "0123456789+=", _add, positional_score),
    "add3_digits": Task("add3_digits", "0123456789+=", _add3, positional_score),
    "even_digits": Task("even_digits", "0123456789=", _even, _even_score),
    "zero_digits": Task("zero_digits", "0123456789=", _zeros, positional_score),
    "reverse_exact": Task("reverse_exact", "0123456789=", _reverse, exact_score),
    "long_tail": Task("long_tail", "0123456789+=", _long_tail, positional_score),
}

ALPHABET = "0123456789+="
"""One alphabet for all built-in tasks, so a tokenizer (and a checkpoint) works for any of them."""


LONG_TAIL_PROMPT_TOKENS = 2 + 1 + LONG_TAIL_MAX_DIGITS + 1 + 1
"""The longest `long_tail` prompt in the built-in character tokenizer's tokens: LL, +, digits, =, BOS."""


def builtin_task_problems(task: str, max_prompt_length: int) -> list[Problem]:
    """What a built-in task needs of the data section, checked at expand (before, a long_tail run with the
    default max_prompt_length failed on the ranks, at its first long prompt)."""
    if task == "long_tail" and max_prompt_length < LONG_TAIL_PROMPT_TOKENS:
        message = (
            f"long_tail prompts have up to {LONG_TAIL_PROMPT_TOKENS} tokens (BOS included): at least that"
        )
        return [Problem(f"{max_prompt_length}: {message}", key="data.max_prompt_length")]
    return []


def get_task(name: str) -> Task:
    try:
        return TASKS[name]
    except KeyError:
        raise ConfigError(
            Problem(f"unknown task {name!r}; known: {sorted(TASKS)}", key="data.task")
        ) from None


def make_splits(task: Task, num_digits: int, train_size: int, heldout_size: int, seed: int):
    """(train, heldout) examples. Held-out prompts are distinct and never appear in train; train samples
    the remaining prompts (with repeats when the task has fewer distinct prompts than `train_size`)."""
    if train_size <= 0:
        raise ConfigError(Problem("must be > 0 (an empty dataset cannot train)", key="data.train_size"))
    distinct = task.num_distinct(num_digits)
    if heldout_size >= distinct:
        raise ConfigError(
            Problem(f"{heldout_size} >= {distinct} distinct prompts of {task.name}", key="data.heldout_size")
        )
    rng = random.Random(seed)
    heldout: dict[str, Example] = {}
    while len(heldout) < heldout_size:
        ex = task.make(rng, num_digits)
        heldout.setdefault(ex.prompt, ex)
    train: list[Example] = []
    while len(train) < train_size:
        ex = task.make(rng, num_digits)
        if ex.prompt not in heldout:
            train.append(ex)
    return train, list(heldout.values())
