"""The `sweep:` section: grid, zip and list axes over dotted keys -> N value assignments.

    sweep:
      grid:                       # every combination (first key varies slowest)
        algorithm.lr: [1.0e-3, 1.0e-4, 1.0e-5]
        rollout.samples_per_prompt: [2, 4, 8, 16]
      zip:                        # advanced together; all lists must have the same length
        seed: [1, 2]
        data.task: [copy_digits, even_digits]
      list:                       # explicit points, each a mapping of dotted keys
        - {algorithm.name: grpo}
        - {algorithm.name: rloo, algorithm.kl_coef: 0.01}

The sections multiply: N = prod(len(grid axis)) * len(zip) * len(list); a missing section counts 1.
Element order is itertools.product(grid..., zip rows, list entries), so indices are stable.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from hpcrl.config.schema import TypeMismatch, check_value, suggest
from hpcrl.errors import Problem, short

SECTIONS = ("grid", "zip", "list")

SWEEP_LEVEL_KEYS = {
    "cluster.executor": "the executor is chosen once per sweep",
    "cluster.array_parallelism": "array parallelism belongs to the whole array job",
    "cluster.max_requeues": "the requeue limit belongs to the whole array job",
    "cluster.profile": "a profile brings trusted shell setup: one per sweep, from the template or the "
    "command line",
    "cluster.setup": "shell setup lines come from cluster profiles, never from sweep values",
    "cluster.env_allow": "environment names are allowed by a profile or on the command line, never by sweep "
    "values",
    "cluster.modules": "module names are shell input; set them in the template or profile, not per element",
}
"""Keys that may not vary across a sweep, and why."""
MAX_ELEMENTS = 100_000
"""Largest sweep: beyond this, expanding it alone takes minutes (a few grid axes multiply fast)."""


@dataclass(frozen=True)
class SweepPlan:
    """A checked sweep: the axes and their (type-normalised) values."""

    grid: dict[str, list[Any]]
    zip: dict[str, list[Any]]
    points: list[dict[str, Any]]

    @property
    def keys(self) -> list[str]:
        """Swept dotted keys in a stable order (grid, zip, then first appearance in list)."""
        seen = dict.fromkeys([*self.grid, *self.zip])
        for point in self.points:
            seen.update(dict.fromkeys(point))
        return list(seen)

    def __len__(self) -> int:
        size = 1
        for values in self.grid.values():
            size *= len(values)
        if self.zip:
            size *= len(next(iter(self.zip.values())))
        return size * max(len(self.points), 1)

    def assignment(self, index: int) -> dict[str, Any]:
        """Element `index`'s {dotted key: value} without walking the ones before it (the mixed-radix
        digits of `index`, list entries fastest), so one element of a 100,000-element sweep is O(axes)."""
        if not 0 <= index < len(self):
            raise IndexError(f"sweep element {index} is outside 0..{len(self) - 1}")
        points = self.points or [{}]
        rest, point = divmod(index, len(points))
        rest, row = divmod(rest, len(next(iter(self.zip.values()))) if self.zip else 1)
        digits: dict[str, Any] = {}
        for key in reversed(self.grid):
            rest, digit = divmod(rest, len(self.grid[key]))
            digits[key] = self.grid[key][digit]
        out = {key: digits[key] for key in self.grid}
        out.update({key: values[row] for key, values in self.zip.items()})
        return {**out, **points[point]}

    def values(self, key: str) -> list[Any]:
        """Every value `key` takes somewhere in the sweep (its axis, or the list entries that set it)."""
        if key in self.grid:
            return self.grid[key]
        if key in self.zip:
            return self.zip[key]
        return [point[key] for point in self.points if key in point]

    def assignments(self) -> Iterator[dict[str, Any]]:
        """Each element's {dotted key: value}, in index order."""
        grid_keys = list(self.grid)
        # unequal zip lengths are reported by check_sweep; the expansion then stops at the shortest
        rows = zip(*self.zip.values(), strict=False)
        zip_rows = [dict(zip(self.zip, row, strict=True)) for row in rows] if self.zip else [{}]
        points = self.points or [{}]
        for combo in itertools.product(*self.grid.values()):
            grid_values = dict(zip(grid_keys, combo, strict=True))
            for row in zip_rows:
                for point in points:
                    yield {**grid_values, **row, **point}


EMPTY_PLAN = SweepPlan(grid={}, zip={}, points=[])


def check_sweep(
    sweep: Any, file: str | None, leaf_types: dict[str, Any], locked: Callable[[str], str | None]
) -> tuple[SweepPlan, list[Problem]]:
    """Check a `sweep:` section; return the plan and ALL problems found.

    `locked(key)` returns a reason when `key` may not be swept here (e.g. it was set on the command line).
    """
    if sweep is None:
        return EMPTY_PLAN, []
    if not isinstance(sweep, dict):
        return EMPTY_PLAN, [
            Problem(f"expected a mapping with {list(SECTIONS)}, got {short(sweep)}", file, "sweep")
        ]
    checker = _SweepChecker(file, leaf_types, locked)
    for section in sweep:
        if section not in SECTIONS:
            hint = suggest(str(section), list(SECTIONS))
            checker.problem(f"unknown sweep section{hint}", f"sweep.{section}")
    grid = checker.axes(sweep.get("grid"), "sweep.grid")
    zipped = checker.axes(sweep.get("zip"), "sweep.zip")
    lengths = {
        key: len(values) for key, values in (sweep.get("zip") or {}).items() if isinstance(values, list)
    }
    if len(set(lengths.values())) > 1:
        detail = ", ".join(f"{k}={n}" for k, n in lengths.items())
        checker.problem(f"zip axes have unequal lengths ({detail})", "sweep.zip")
    plan = SweepPlan(grid=grid, zip=zipped, points=checker.points(sweep.get("list")))
    if len(plan) > MAX_ELEMENTS:
        checker.problem(f"{len(plan):,} elements; a sweep has at most {MAX_ELEMENTS:,}", "sweep")
        return EMPTY_PLAN, checker.problems
    return plan, checker.problems


class _SweepChecker:
    """The checks of one `sweep:` section's axes; every problem is collected, none raised."""

    def __init__(self, file: str | None, leaf_types: dict[str, Any], locked: Callable[[str], str | None]):
        self.file, self.leaf_types, self.locked = file, leaf_types, locked
        self.problems: list[Problem] = []
        self.owner: dict[str, str] = {}
        """Each swept key -> the section sweeping it (a key is swept by one section)."""

    def problem(self, message: str, where: str) -> None:
        self.problems.append(Problem(message, self.file, where))

    def axes(self, axes: Any, section: str) -> dict[str, list[Any]]:
        """A grid or zip section's axes, {key: checked values}, the bad ones left out."""
        axes = axes or {}
        if not isinstance(axes, dict):
            self.problem(f"expected a mapping of dotted key -> list, got {short(axes)}", section)
            return {}
        out: dict[str, list[Any]] = {}
        for key, values in axes.items():
            where = f"{section}.{key}"
            if not self._claim(key, section, where):
                continue
            if not isinstance(values, list) or not values:
                self.problem(f"expected a non-empty list of values, got {short(values)}", where)
                continue
            out[key] = self._values(key, values, where)
        return out

    def points(self, entries: Any) -> list[dict[str, Any]]:
        """The `list` section's points, each {key: checked value}."""
        if entries is None:
            return []
        if not isinstance(entries, list) or not entries:
            self.problem(f"expected a non-empty list of mappings, got {short(entries)}", "sweep.list")
            return []
        points = []
        for i, entry in enumerate(entries):
            where = f"sweep.list[{i}]"
            if not isinstance(entry, dict):
                self.problem(f"expected a mapping of dotted key -> value, got {short(entry)}", where)
                continue
            point = {}
            for key, value in entry.items():
                if self._claim(key, "sweep.list", f"{where}.{key}"):
                    checked = self._values(key, [value], f"{where}.{key}")
                    point.update({key: checked[0]} if checked else {})
            points.append(point)
        return points

    def _claim(self, key: Any, section: str, where: str) -> bool:
        """True when `key` is a config key this section may sweep (one the list section already sweeps
        may appear in another point of it)."""
        if not isinstance(key, str) or key not in self.leaf_types:
            hint = suggest(str(key), list(self.leaf_types))
            self.problem(f"bad sweep axis: {short(key)} is not a config key{hint}", where)
            return False
        reason = SWEEP_LEVEL_KEYS.get(key) or self.locked(key)
        if reason:
            self.problem(f"bad sweep axis: {short(key)} cannot be swept ({reason})", where)
            return False
        if self.owner.get(key, section) != section or (key in self.owner and section != "sweep.list"):
            self.problem(f"bad sweep axis: {short(key)} is already swept in {self.owner[key]}", where)
            return False
        self.owner[key] = section
        return True

    def _values(self, key: str, values: list[Any], where: str) -> list[Any]:
        out = []
        for i, value in enumerate(values):
            try:
                out.append(check_value(value, self.leaf_types[key]))
            except TypeMismatch as err:
                self.problem(f"{err.label}: {err}", f"{where}[{i}]")
        return out
