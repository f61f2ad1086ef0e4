"""Error types that the CLI maps to exit codes.

`ConfigError` (exit 2) carries *every* problem found, each with its file and dotted key, so a user
fixes a template in one pass instead of one error per run.
"""

from __future__ import annotations

import reprlib
from dataclasses import dataclass

MESSAGE_CHARS = 600
"""A problem's message is cut here: a message quotes user values, which may be megabytes long."""
WHERE_CHARS = 300
"""A problem's file and key are cut here (a file name or dotted key may come from hostile input too)."""
PROBLEMS_SHOWN = 50
"""At most this many problems go into a ConfigError's text (all stay in `problems`)."""

_SHORT = reprlib.Repr()
_SHORT.maxstring = _SHORT.maxother = 160
_SHORT.maxlist = _SHORT.maxtuple = _SHORT.maxdict = _SHORT.maxset = 8
_SHORT.maxlevel = 3


def short(value: object) -> str:
    """A bounded repr of a user value for messages: long strings and big or deep (YAML alias-expanded)
    structures are abbreviated, so quoting a value never costs more than a few hundred characters."""
    return _SHORT.repr(value)


def printable(text: str) -> str:
    """`text` with every non-printable character escaped as Python writes it ('\\n', '\\x1b'): what a
    terminal is shown of data (a manifest's swept values, a file name) never drives it or forges lines."""
    if text.isprintable():
        return text
    return "".join(char if char.isprintable() else repr(char)[1:-1] for char in text)


def cut(text: str, limit: int) -> str:
    """`text` on one line and at most `limit` characters (plus a note of how much was left out).

    Non-printable characters are escaped (`printable`: a newline or ESC in a file name must not forge
    output lines or drive the terminal)."""
    if len(text) <= limit and text.isprintable():
        return text
    pieces, width, used = [], 0, 0
    for char in text:
        piece = printable(char)
        if width + len(piece) > limit:
            break
        pieces.append(piece)
        width, used = width + len(piece), used + 1
    left = len(text) - used
    return "".join(pieces) + (f"... ({left} more characters)" if left else "")


@dataclass(frozen=True)
class Problem:
    """One thing wrong with user input. Its parts are cut to bounded lengths when it is made: the one
    place that keeps every error message short, whatever value or file name it quotes."""

    message: str
    file: str | None = None
    key: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "message", cut(str(self.message), MESSAGE_CHARS))
        if self.file is not None:
            object.__setattr__(self, "file", cut(str(self.file), WHERE_CHARS))
        if self.key is not None:
            object.__setattr__(self, "key", cut(str(self.key), WHERE_CHARS))

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
        shown = [str(p) for p in self.problems[:PROBLEMS_SHOWN]]
        if len(self.problems) > PROBLEMS_SHOWN:
            shown.append(f"... and {len(self.problems) - PROBLEMS_SHOWN} more problem(s)")
        super().__init__("\n".join(shown))


class ClusterError(Exception):
    """The scheduler could not be reached or refused a request. Exit 1, nothing half-written."""

    exit_code = 1
