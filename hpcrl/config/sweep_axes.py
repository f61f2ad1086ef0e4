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
    problems: list[Problem] = []
    if sweep is None:
        return EMPTY_PLAN, problems
    if not isinstance(sweep, dict):
        return EMPTY_PLAN, [
            Problem(f"expected a mapping with {list(SECTIONS)}, got {short(sweep)}", file, "sweep")
        ]
    for section in sweep:
        if section not in SECTIONS:
            problems.append(
                Problem(
                    f"unknown sweep section{suggest(str(section), list(SECTIONS))}", file, f"sweep.{section}"
                )
            )
    owner: dict[str, str] = {}

    def check_axis_key(key: Any, where: str) -> bool:
        if not isinstance(key, str) or key not in leaf_types:
            hint = suggest(str(key), list(leaf_types))
            problems.append(Problem(f"bad sweep axis: {short(key)} is not a config key{hint}", file, where))
            return False
        reason = SWEEP_LEVEL_KEYS.get(key) or locked(key)
        if reason:
            problems.append(Problem(f"bad sweep axis: {short(key)} cannot be swept ({reason})", file, where))
            return False
        return True

    def check_values(key: str, values: list[Any], where: str) -> list[Any]:
        out = []
        for i, value in enumerate(values):
            try:
                out.append(check_value(value, leaf_types[key]))
            except TypeMismatch as err:
                problems.append(Problem(f"wrong type: {err}", file, f"{where}[{i}]"))
        return out

    def check_axes(section: str) -> dict[str, list[Any]]:
        axes = sweep.get(section) or {}
        if not isinstance(axes, dict):
            problems.append(
                Problem(
                    f"expected a mapping of dotted key -> list, got {short(axes)}", file, f"sweep.{section}"
                )
            )
            return {}
        out: dict[str, list[Any]] = {}
        for key, values in axes.items():
            where = f"sweep.{section}.{key}"
            if not check_axis_key(key, where):
                continue
            if key in owner:
                problems.append(
                    Problem(f"bad sweep axis: {short(key)} is already swept in {owner[key]}", file, where)
                )
                continue
            owner[key] = f"sweep.{section}"
            if not isinstance(values, list) or not values:
                problems.append(
                    Problem(f"expected a non-empty list of values, got {short(values)}", file, where)
                )
                continue
            out[key] = check_values(key, values, where)
        return out

    grid = check_axes("grid")
    zipped = check_axes("zip")
    lengths = {
        key: len(values) for key, values in (sweep.get("zip") or {}).items() if isinstance(values, list)
    }
    if len(set(lengths.values())) > 1:
        detail = ", ".join(f"{k}={n}" for k, n in lengths.items())
        problems.append(Problem(f"zip axes have unequal lengths ({detail})", file, "sweep.zip"))
    points = _check_points(sweep.get("list"), file, owner, check_axis_key, check_values, problems)
    plan = SweepPlan(grid=grid, zip=zipped, points=points)
    if len(plan) > MAX_ELEMENTS:
        problems.append(
            Problem(f"{len(plan):,} elements; a sweep has at most {MAX_ELEMENTS:,}", file, "sweep")
        )
        return EMPTY_PLAN, problems
    return plan, problems


def _check_points(
    entries: Any,
    file: str | None,
    owner: dict[str, str],
    check_axis_key: Callable[[Any, str], bool],
    check_values: Callable[[str, list[Any], str], list[Any]],
    problems: list[Problem],
) -> list[dict[str, Any]]:
    if entries is None:
        return []
    if not isinstance(entries, list) or not entries:
        problems.append(
            Problem(f"expected a non-empty list of mappings, got {short(entries)}", file, "sweep.list")
        )
        return []
    points = []
    for i, entry in enumerate(entries):
        where = f"sweep.list[{i}]"
        if not isinstance(entry, dict):
            problems.append(
                Problem(f"expected a mapping of dotted key -> value, got {short(entry)}", file, where)
            )
            continue
        point = {}
        for key, value in entry.items():
            if not check_axis_key(key, f"{where}.{key}"):
                continue
            if owner.get(key, "sweep.list") != "sweep.list":
                problems.append(
                    Problem(
                        f"bad sweep axis: {short(key)} is already swept in {owner[key]}",
                        file,
                        f"{where}.{key}",
                    )
                )
                continue
            owner[key] = "sweep.list"
            checked = check_values(key, [value], f"{where}.{key}")
            if checked:
                point[key] = checked[0]
        points.append(point)
    return points
