"""The memory preflight of `hpcrl submit` and `hpcrl resume`: the elements that the memory planner
(hpcrl.plan) predicts not to fit their devices, as problems (exit 2), before anything is written or
submitted.

An element whose model dims can't be read here (an `hf_path` that exists only on the cluster) is
skipped with a note: the planner cannot judge it, and refusing it would block every such recipe.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from hpcrl.errors import Problem
from hpcrl.experiment.elements import ResolvedConfig
from hpcrl.plan.memory import ModelDimsUnavailable
from hpcrl.plan.stages import plan_of
from hpcrl.progress import Track, untracked


@dataclass(frozen=True)
class MemoryCheck:
    problems: list[Problem] = field(default_factory=list)
    """One per predicted misfit, naming the element and its config id."""
    notes: list[str] = field(default_factory=list)
    """Elements the planner could not judge, and why."""


def memory_preflight(elements: Sequence[ResolvedConfig], track: Track = untracked) -> MemoryCheck:
    """Plan every element; see the module docstring."""
    check = MemoryCheck()
    for element in track(elements, len(elements), "memory plan"):
        try:
            plan = plan_of(element.config)
        except ModelDimsUnavailable as err:
            check.notes.append(f"memory preflight skipped for element {element.index}: {err}")
            continue
        where = f"element {element.index} ({element.config_id})"
        check.problems.extend(Problem(f"{where}: {text}", key="memory plan") for text in plan.problems())
    return check
