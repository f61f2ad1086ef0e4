"""The range of every number a config holds, declared in its type: `Annotated[int, Range(ge=1)]`.

A range is part of the field's type, so it is checked wherever the type is (hpcrl.config.schema: a
template, a `--key VALUE` override, a sweep value, a profile, a run's config.yaml), at `expand` and
`submit`, each out-of-range value named with its file and key; `range_problems` checks a config built
in code (the ranks' own check runs it too). `hpcrl --help-config` and docs/config-reference.md print
each field's range with its type. A float is always finite: NaN and inf are refused whatever the bounds.

The aliases below are the ranges most fields share; a field with its own bounds spells them out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated

from hpcrl.errors import short

MAX_STEPS = 10**8
"""The most steps (and the longest interval in steps) a run may name: 10^8 steps of a second each is
three years; a larger value is a typo (`--rm.steps 1e30` used to pass)."""
MAX_COUNT = 1 << 20
"""The most items of one kind a step or a layout may hold (rows, prompts, ranks on one axis)."""
MAX_SEED = 2**63 - 1
"""Seeds are non-negative 63-bit integers (torch, numpy and Python's random all take them)."""


@dataclass(frozen=True)
class Range:
    """Bounds of a number: ge/gt below, le/lt above (None: unbounded on that side)."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None

    def problem(self, value: float) -> str | None:
        """None when `value` is finite and within the bounds, else what is wrong."""
        if isinstance(value, float) and not math.isfinite(value):
            return f"must be a finite number {self}, got {short(value)}"
        ok = (
            (self.ge is None or value >= self.ge)
            and (self.gt is None or value > self.gt)
            and (self.le is None or value <= self.le)
            and (self.lt is None or value < self.lt)
        )
        return None if ok else f"must be {self}, got {short(value)}"

    def __str__(self) -> str:
        """'in [1, 2^20]', 'in (0, 1]', '>= 0', '> 0'."""
        low = _bound(self.ge, "[", self.gt, "(")
        high = _bound(self.le, "]", self.lt, ")")
        if low and high:
            return f"in {low[0]}{low[1]}, {high[1]}{high[0]}"
        if low:
            return f"{'>=' if low[0] == '[' else '>'} {low[1]}"
        return f"{'<=' if high[0] == ']' else '<'} {high[1]}" if high else "any number"


def _bound(
    closed: float | None, closed_mark: str, open_: float | None, open_mark: str
) -> tuple[str, str] | None:
    """(bracket, number) of one side of a range, or None when it is unbounded."""
    if closed is not None:
        return closed_mark, _number(closed)
    return (open_mark, _number(open_)) if open_ is not None else None


def _number(bound: float) -> str:
    """A bound as a reader writes it: 2^20 for a large power of two, 10^8, else the plain number."""
    if isinstance(bound, int) and bound >= 1024:
        for base in (2, 10):
            exponent = round(math.log(bound, base))
            if base**exponent == bound:
                return f"{base}^{exponent}"
        if bound == MAX_SEED:
            return "2^63-1"
    return f"{bound:g}" if isinstance(bound, float) else str(bound)


Steps = Annotated[int, Range(ge=1, le=MAX_STEPS)]
"""A number of steps (at least one)."""
EveryNSteps = Annotated[int, Range(ge=0, le=MAX_STEPS)]
"""An interval in steps; 0: never."""
Count = Annotated[int, Range(ge=1, le=MAX_COUNT)]
"""A count of items (at least one)."""
Seed = Annotated[int, Range(ge=0, le=MAX_SEED)]
"""A random seed."""
Positive = Annotated[float, Range(gt=0)]
"""A finite number > 0."""
NonNegative = Annotated[float, Range(ge=0)]
"""A finite number >= 0."""
Fraction = Annotated[float, Range(ge=0, le=1)]
"""A finite number in [0, 1]."""
