"""The rule for every string of a resolved config: one line of printable text, of bounded length.

Why every string and not only the ones that reach a shell today: config strings become directory names
(run_root, name), file contents, sbatch script text (job name, log folder, #SBATCH values, env exports,
profile setup lines), table cells and error messages. A newline there is a bare line in a batch script
or a directory nobody can type; ESC drives the terminal of whoever runs `hpcrl expand`; a 100,000
character name is an OSError deep inside mkdir. Refusing them once, at expand/submit time, keeps every
consumer free of its own escaping. "Printable" is Python's `str.isprintable`: no control (C0, DEL, C1),
format (bidi overrides, zero-width), surrogate or separator characters other than the ASCII space.

Path values are bounded tighter, per path and per component (NAME_MAX), so a path that passes here is
one the file system can create; `name` has its own rule (a single directory name, hpcrl.experiment.rules).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from hpcrl.errors import Problem, short

MAX_TEXT_CHARS = 4096
"""Longest config string (an env value, a setup line, a task name)."""
MAX_PATH_CHARS = 1024
"""Longest path value; run and sweep directories add ~60 characters below it (PATH_MAX is 4096)."""
MAX_PATH_PART_BYTES = 255
"""Longest path component, in UTF-8 bytes (NAME_MAX of Linux file systems)."""

PATH_KEYS = frozenset(
    {
        "run_root",
        "model.hf_path",
        "algorithm.teacher_path",
        "data.path",
        "reward.model_path",
        "reward.function",
        "rollout.env",
        "checkpoint.dir",
        "checkpoint.resume_from",
        "cluster.profile",
    }
)
"""Dotted keys whose values are file system paths (path_problem applies instead of text_problem)."""


def text_problem(value: str) -> str | None:
    """Why `value` cannot be a config string (the message quotes it, abbreviated), or None."""
    if len(value) > MAX_TEXT_CHARS:
        return f"{short(value)} is {len(value):,} characters long; the limit is {MAX_TEXT_CHARS:,}"
    if not value.isprintable():
        position, char = next((i, c) for i, c in enumerate(value) if not c.isprintable())
        return (
            f"{short(value)} contains the non-printable character {char!r} at position {position}: "
            "config values are one line of printable text"
        )
    return None


def path_problem(value: str) -> str | None:
    """Why `value` cannot be a path value (text rule, then the path and component bounds), or None."""
    problem = text_problem(value)
    if problem:
        return problem
    if len(value) > MAX_PATH_CHARS:
        return f"{short(value)} is a path of {len(value):,} characters; the limit is {MAX_PATH_CHARS:,}"
    for part in value.split("/"):
        if len(part.encode("utf-8", "surrogatepass")) > MAX_PATH_PART_BYTES:
            return f"{short(value)} has a path component longer than {MAX_PATH_PART_BYTES} bytes"
    return None


def string_problems(plain: dict[str, Any]) -> list[Problem]:
    """Every string of a resolved config (as plain data) that breaks its rule, as (dotted key, message).

    Mapping keys are not checked here: the only mapping field is `cluster.env`, whose names have their
    own, stricter rule (hpcrl.cluster.rules.env_problems)."""
    out = []
    for key, value in _strings(plain, ""):
        problem = path_problem(value) if key in PATH_KEYS else text_problem(value)
        if problem:
            out.append(Problem(problem, key=key))
    return out


def _strings(data: Any, dotted: str) -> Iterator[tuple[str, str]]:
    """(dotted key, string) for every string leaf; list items and mapping values count as their key's."""
    if isinstance(data, str):
        yield dotted, data
    elif isinstance(data, dict):
        for key, value in data.items():
            yield from _strings(value, f"{dotted}.{key}" if dotted else str(key))
    elif isinstance(data, (list, tuple)):
        for value in data:
            yield from _strings(value, dotted)
