"""Error types that the CLI maps to exit codes.

`ConfigError` (exit 2) carries *every* problem found, each with its file and dotted key, so a user
fixes a template in one pass instead of one error per run.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    """One thing wrong with user input."""

    message: str
    file: str | None = None
    key: str | None = None

    def __str__(self) -> str:
        where = ":".join(part for part in (self.file, self.key) if part)
        return f"{where}: {self.message}" if where else self.message


class ConfigError(Exception):
    """Bad user input (template, override, layout). The CLI prints all problems and exits 2."""

    exit_code = 2

    def __init__(self, problems: list[Problem] | Problem | str):
        if isinstance(problems, str):
            problems = [Problem(problems)]
        elif isinstance(problems, Problem):
            problems = [problems]
        self.problems = list(problems)
        super().__init__("\n".join(str(p) for p in self.problems))


class ClusterError(Exception):
    """The scheduler could not be reached or refused a request. Exit 1, nothing half-written."""

    exit_code = 1
