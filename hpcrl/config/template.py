"""Template files: YAML with `extends:` (a base + small overrides) and an optional `sweep:` section.

`extends` is a path relative to the extending file; chains are merged base-first (mappings merge
key by key, lists and scalars replace) and a cycle is an error naming every file of the loop. Every
dotted key remembers the file that set it, so validation can say where a mistake was written.
A child's `sweep:` replaces its parent's (sweeps do not merge: half of two sweeps is rarely meant).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpcrl.config.schema import deep_merge, flatten
from hpcrl.config.text_rules import path_problem
from hpcrl.config.yaml_io import load_yaml
from hpcrl.errors import ConfigError, Problem, short

TEMPLATE_ONLY_KEYS = ("extends", "sweep")
"""Top-level keys of a template that are not ExperimentConfig fields."""


@dataclass
class Template:
    """A template with its `extends` chain merged."""

    path: Path
    """The file that was asked for (the leaf of the chain)."""
    values: dict[str, Any]
    """Merged config values (no `extends` / `sweep`)."""
    sweep: dict[str, Any] | None = None
    """The effective `sweep:` section, if any."""
    sweep_file: str | None = None
    """File that the effective sweep section came from."""
    origins: dict[str, str] = field(default_factory=dict)
    """Dotted key -> file that set it last."""

    def origin_of(self, dotted: str) -> str:
        """The file that set `dotted` (or its closest parent key); the leaf template otherwise."""
        key = dotted
        while key:
            if key in self.origins:
                return self.origins[key]
            key = key.rpartition(".")[0]
        return str(self.path)


def load_template(path: str | Path) -> Template:
    """Load a template and everything it extends. Raises ConfigError (exit 2) naming the file."""
    return _load(Path(path), ())


def _load(path: Path, chain: tuple[Path, ...], named_by: Path | None = None) -> Template:
    """`path` and its parents; `chain` holds the resolved files that extend it, `named_by` the one that
    named it (as written there)."""
    # A mistake in an `extends` path is in the file that wrote it: name that file and key.
    where = (str(named_by), "extends") if named_by else (None, "TEMPLATE")
    problem = path_problem(str(path))  # the template's own path is echoed in tables, manifests, messages
    if problem:
        raise ConfigError(Problem(problem, *where))
    if named_by and not path.is_file():
        raise ConfigError(Problem(f"{short(str(path))} not found", *where))
    resolved = path.resolve()
    if resolved in chain:
        loop = " -> ".join(str(p) for p in (*chain[chain.index(resolved) :], resolved))
        raise ConfigError(Problem(f"extends cycle: {loop}", file=str(path), key="extends"))
    data = load_yaml(path)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(Problem(f"a template must be a mapping, got {type(data).__name__}", file=str(path)))
    own = {k: v for k, v in data.items() if k not in TEMPLATE_ONLY_KEYS}
    parent: Template | None = None
    extends = data.get("extends")
    if extends is not None:
        if not isinstance(extends, str) or not extends:
            raise ConfigError(
                Problem(
                    f"must be a relative path to a template, got {short(extends)}",
                    file=str(path),
                    key="extends",
                )
            )
        parent = _load(Path(os.path.normpath(path.parent / extends)), (*chain, resolved), path)
    origins = dict(parent.origins) if parent else {}
    origins.update({key: str(path) for key in flatten(own)})
    for key in own:  # a section key itself (e.g. `cluster`) points at the last file that touched it
        origins[str(key)] = str(path)
    values = deep_merge(parent.values, own) if parent else own
    if "sweep" in data:
        sweep, sweep_file = data["sweep"], str(path)
    else:
        sweep, sweep_file = (parent.sweep, parent.sweep_file) if parent else (None, None)
    return Template(path=path, values=values, sweep=sweep, sweep_file=sweep_file, origins=origins)
