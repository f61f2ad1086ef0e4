"""References from one pipeline stage's values to another stage's outputs: `${stages.NAME...OUTPUT}`.

    ${stages.sft.hf}                        the HF export of stage `sft` (one element)
    ${stages.sft.3.hf}                      ... of element 3 of sweep stage `sft`
    ${stages.sft.best(reward/heldout).hf}   ... of the element a rule picks when the consumer starts
    ${stages.rm.checkpoint}                 the checkpoint root (the newest verified checkpoint in it)
    ${stages.rm.run_dir}                    the run directory

A reference may stand alone or inside a longer string (`${stages.sft.run_dir}/notes`). Everything else
that starts with `${` is refused, so a misspelt reference is an error at `expand`, never a literal path
that a compute node fails to open. Parsing is pure; what a reference resolves to is
hpcrl.pipeline.plan's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

OUTPUTS = ("run_dir", "checkpoint", "hf")
"""What a stage hands on: its run directory, its checkpoint root, its HF export (`<run_dir>/hf`)."""
RULES = {"best": "highest", "max": "highest", "min": "lowest"}
"""Selection rules over a sweep stage's elements: the element whose metric's last logged value is the
highest (best, max) or the lowest (min)."""
STAGE_NAME = re.compile(r"[a-z][a-z0-9_]{0,31}", re.ASCII)
"""A stage's name: it becomes part of job names and directory names."""
METRIC = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_./-]{0,127}", re.ASCII)
"""A metric key as metrics.jsonl writes them (`reward/heldout`, `loss`)."""

_REFERENCE = re.compile(r"\$\{([^{}]*)\}")
_SELECT = re.compile(r"(?P<rule>[a-z]+)\((?P<metric>[^()]*)\)")


@dataclass(frozen=True)
class Reference:
    """One `${stages...}` in a stage's value."""

    text: str
    """The reference as written, `${...}` included."""
    stage: str
    output: str
    """One of OUTPUTS."""
    element: int | None = None
    """The sweep element named by index."""
    rule: str | None = None
    """A key of RULES: the element is chosen when the consumer starts."""
    metric: str | None = None
    """The metric `rule` ranks the elements by."""

    @property
    def selects(self) -> bool:
        """It names one element of a sweep (by index or by rule)."""
        return self.element is not None or self.rule is not None


class ReferenceError(ValueError):
    """A `${...}` that is not a reference this module reads; the message says why."""


def references(value: str) -> list[Reference]:
    """Every reference in `value`, in order; ReferenceError for the first `${` that is not one."""
    found = [parse(match.group(0)) for match in _REFERENCE.finditer(value)]
    if "${" in _REFERENCE.sub("", value):
        raise ReferenceError("has a '${' that does not open a reference ${stages.NAME.OUTPUT}")
    return found


def parse(text: str) -> Reference:
    """`${stages.NAME[.INDEX|.RULE(METRIC)].OUTPUT}` -> Reference; ReferenceError naming what is wrong."""
    inner = text[2:-1]
    head, _, rest = inner.partition(".")
    if head != "stages":
        raise ReferenceError(f"{text}: a reference reads ${{stages.NAME.OUTPUT}}")
    name, _, rest = rest.partition(".")
    if not STAGE_NAME.fullmatch(name):
        raise ReferenceError(f"{text}: {name!r} is not a stage name ([a-z][a-z0-9_]*, at most 32)")
    selector, _, output = rest.rpartition(".")
    if output not in OUTPUTS:
        raise ReferenceError(f"{text}: the output must be one of {', '.join(OUTPUTS)}, got {output!r}")
    if not selector:
        return Reference(text, name, output)
    if selector.isascii() and selector.isdigit():
        if len(selector) > 6 or (len(selector) > 1 and selector[0] == "0"):
            raise ReferenceError(f"{text}: {selector!r} is not an element index")
        return Reference(text, name, output, element=int(selector))
    match = _SELECT.fullmatch(selector)
    if match is None or match["rule"] not in RULES:
        rules = ", ".join(f"{rule}(METRIC)" for rule in RULES)
        raise ReferenceError(f"{text}: pick a sweep's element by index or by a rule ({rules})")
    if not METRIC.fullmatch(match["metric"]):
        raise ReferenceError(f"{text}: {match['metric']!r} is not a metric key")
    return Reference(text, name, output, rule=match["rule"], metric=match["metric"])


def substitute(value: str, resolved: dict[str, str]) -> str:
    """`value` with each reference replaced by `resolved[reference.text]`."""
    return _REFERENCE.sub(lambda match: resolved[match.group(0)], value)
