"""The config reference: every key of ExperimentConfig with its type, default and meaning.

All three come from the dataclasses themselves (type hints, defaults, and the docstring written under
each field, read by docstring_parser as jsonargparse reads it), so a key is documented in one place:
its field. `hpcrl <command> --help-config [PREFIX|STAGE]` prints this reference (all of it, the keys under
PREFIX, or the keys one stage reads); `--help` only points at it
(listing ~120 keys there made `hpcrl submit --help` 400 lines long).
"""

from __future__ import annotations

import dataclasses
import functools
import textwrap
from typing import Any

from hpcrl.config.schema import describe, field_types, is_config_class, suggest, to_dict
from hpcrl.config.yaml_io import dump_yaml
from hpcrl.errors import ConfigError, Problem
from hpcrl.experiment.config import ExperimentConfig
from hpcrl.experiment.stage_kinds import STAGE_KINDS, unread_sections

WIDTH = 100
"""Text width of the reference (a wide terminal; the docs are wrapped to it)."""


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """Field name -> the docstring under the field in the class body, whitespace folded ('' if none)."""
    import docstring_parser

    doc = docstring_parser.parse_from_object(cls)
    return {
        p.arg_name: " ".join((p.description or "").split()) for p in doc.params if p.args[:1] == ["attribute"]
    }


def class_summary(cls: type) -> str:
    """The first paragraph of a config class's own docstring, whitespace folded."""
    text = (cls.__doc__ or "").strip().split("\n\n")[0]
    return " ".join(text.split())


def default_text(f: dataclasses.Field) -> str:
    """A field's default as YAML, the way it would be written in a template."""
    if f.default is not dataclasses.MISSING:
        value: Any = f.default
    elif f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
    else:
        return "(required)"
    return dump_yaml(to_dict(value)).strip()


def _entries(cls: type, prefix: str = "") -> list[tuple[str, str]]:
    """(dotted key, its reference text) for every leaf under `cls`, sections introduced by a header."""
    out: list[tuple[str, str]] = []
    hints, docs = field_types(cls), field_docs(cls)
    leaves = [f for f in dataclasses.fields(cls) if not is_config_class(hints[f.name])]
    for f in leaves:
        out.append((f"{prefix}{f.name}", _leaf_text(f"{prefix}{f.name}", f, hints[f.name], docs[f.name])))
    for f in dataclasses.fields(cls):
        section = hints[f.name]
        if is_config_class(section):
            header = _wrap(f"{prefix}{f.name}: {class_summary(section)}{_owner(prefix + f.name)}", "", "  ")
            out.append((f"{prefix}{f.name}", f"\n{header}"))
            out += _entries(section, f"{prefix}{f.name}.")
    return out


def _owner(section: str) -> str:
    """' [stage rl only]' for a section one stage owns, else ''."""
    owners = [kind.name for kind in STAGE_KINDS.values() if section in kind.sections]
    return f" [stage {owners[0]} only]" if owners else ""


def _leaf_text(key: str, f: dataclasses.Field, hint: Any, doc: str) -> str:
    head = f"  --{key}  {describe(hint)} = {default_text(f)}"
    return head + ("\n" + _wrap(doc, "      ", "      ") if doc else "")


def _wrap(text: str, first: str, rest: str) -> str:
    return textwrap.fill(text, WIDTH, initial_indent=first, subsequent_indent=rest, break_on_hyphens=False)


def reference(prefix: str = "") -> str:
    """The reference of every key, of the keys one stage reads (`prefix` a stage kind: 'rl', 'dpo'), or
    of those equal to or under `prefix` (e.g. 'cluster', 'optim.lr'); a prefix that names no key is a
    ConfigError with the closest one."""
    prefix = prefix.strip().lstrip("-")
    entries = _entries(ExperimentConfig)
    if prefix in STAGE_KINDS:
        unread = unread_sections(prefix)
        chosen = [text for key, text in entries if key.partition(".")[0] not in unread]
    else:
        chosen = [
            text for key, text in entries if not prefix or key == prefix or key.startswith(f"{prefix}.")
        ]
    if not chosen:
        hint = suggest(prefix, [key for key, _ in entries] + list(STAGE_KINDS))
        raise ConfigError(Problem(f"no config key {prefix!r}{hint}", "command line", "--help-config"))
    intro = (
        "Config keys: set any in a template (YAML, nested by the dots) or on the command line as\n"
        "--<dotted.key> VALUE (VALUE is read as YAML: 1e-5, true, [0.9, 0.95], {A: b}).\n"
        "Each key: its type = its default, then what it means. A section marked [stage X only] is read by\n"
        "that stage alone (`stage:`); --help-config STAGE lists only what one stage reads.\n\n"
    )
    return intro + "\n".join(chosen).rstrip("\n").lstrip("\n") + "\n"


REFERENCE_PAGE = "docs/config-reference.md"
"""Where the reference is published, relative to the repository (`python -m hpcrl.experiment.reference`
writes it; a test checks it is what this module makes today, so the page cannot drift from the fields)."""


def reference_page() -> str:
    """REFERENCE_PAGE's text: the whole reference in a code block under a title."""
    return (
        "# Config reference\n\n"
        "Generated from the config dataclasses (each key's type, default and the docstring under its field) by\n"
        "`python -m hpcrl.experiment.reference`; `hpcrl submit --help-config [PREFIX|STAGE]` prints the same.\n\n"
        f"```text\n{reference()}```\n"
    )


if __name__ == "__main__":
    from pathlib import Path

    Path(REFERENCE_PAGE).write_text(reference_page())
