"""Where user code lives: `path/to/file.py:name` or `package.module:name` (like `entrypoint`).

`FunctionSpec.parse` reads the text, `source_file` finds the file an import would run (without
running any package code), and `load_function` imports it: only in the process that calls it (the
child of hpcrl.usercode.runner), never at `expand`.
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import importlib.machinery
import importlib.util
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpcrl.config.safe_read import read_capped
from hpcrl.errors import Problem, short

_IDENTIFIER = r"[A-Za-z_]\w*"
_MODULE_SPEC = re.compile(rf"{_IDENTIFIER}(?:\.{_IDENTIFIER})*:{_IDENTIFIER}", re.ASCII)
_FILE_SPEC = re.compile(rf"(?P<path>[^\x00]+\.py):(?P<name>{_IDENTIFIER})", re.ASCII)


@dataclass(frozen=True)
class FunctionSpec:
    """Where a function lives: a file (`path` set) or an importable module (`module` set)."""

    name: str
    path: str | None = None
    module: str | None = None

    @classmethod
    def parse(cls, text: str) -> FunctionSpec:
        """ValueError saying the expected forms when `text` is neither."""
        if match := _FILE_SPEC.fullmatch(text):
            return cls(match["name"], path=match["path"])
        if _MODULE_SPEC.fullmatch(text):
            module, name = text.split(":")
            return cls(name, module=module)
        raise ValueError(
            f"expected 'path/to/file.py:function' or 'package.module:function', got {short(text)}"
        )

    def source_file(self) -> str | None:
        """The file that defines it: the path, or the module's file found as an import would find it,
        without running any package code (None when it is not found)."""
        if self.path is not None:
            return self.path
        locations = None
        found = None
        for i, part in enumerate(self.module.split(".")):
            found = importlib.machinery.PathFinder.find_spec(part, locations)
            loaded = sys.modules.get(part) if i == 0 and found is None else None
            if loaded is not None and getattr(loaded, "__path__", None):  # a package imported already
                found = loaded.__spec__  # (hpcrl: an editable install's finder is not on sys.path)
            if found is None:
                return None
            locations = found.submodule_search_locations
        return found.origin if found is not None and found.has_location else None

    def __str__(self) -> str:
        return f"{self.path or self.module}:{self.name}"


MAX_SOURCE_BYTES = 1 << 20
"""A user code file larger than 1 MiB is not a reward function or an environment."""


def absolute_spec(text: str, base_dir: Path) -> str:
    """`text` with a relative file path made absolute against `base_dir` (the template's directory);
    anything else unchanged (a bad spec is reported by `read_source_tree`)."""
    try:
        spec = FunctionSpec.parse(text)
    except ValueError:
        return text
    if spec.path is None or Path(spec.path).is_absolute():
        return text
    return f"{(base_dir / spec.path).absolute()}:{spec.name}"


def read_source_tree(text: str, key: str, what: str) -> tuple[FunctionSpec, ast.Module] | list[Problem]:
    """The spec and the parsed source of the file it names, or the problems (under `key`; `what` names
    the thing in messages) - without running anything: the file exists, is a regular UTF-8 file of at
    most MAX_SOURCE_BYTES and parses; a module is found on sys.path without importing it."""
    try:
        spec = FunctionSpec.parse(text)
    except ValueError as err:
        return [Problem(str(err), key=key)]
    source = spec.source_file()
    if source is None:
        return [
            Problem(f"module {spec.module!r} is not found on the Python path (nothing imported)", key=key)
        ]
    try:
        raw = read_capped(source, MAX_SOURCE_BYTES)
        return spec, ast.parse(raw.decode("utf-8"), filename=str(source))
    except (OSError, ValueError, SyntaxError, RecursionError, MemoryError) as err:
        why = getattr(err, "strerror", None) or getattr(err, "msg", None) or err
        return [Problem(f"cannot read the {what}'s source: {why}", file=str(source), key=key)]


def source_sha256(text: str) -> str | None:
    """sha256 of the file a spec names (None when it cannot be read or found)."""
    try:
        source = FunctionSpec.parse(text).source_file()
        return hashlib.sha256(read_capped(source, MAX_SOURCE_BYTES)).hexdigest() if source else None
    except (OSError, ValueError):
        return None


def load_function(text: str) -> Callable[..., Any]:
    """Import the function: a file as a module of its own, name-spaced by its path."""
    spec = FunctionSpec.parse(text)
    if spec.module is not None:
        return getattr(importlib.import_module(spec.module), spec.name)
    digest = hashlib.sha256(spec.path.encode()).hexdigest()[:12]
    loader_spec = importlib.util.spec_from_file_location(f"hpcrl_usercode_{digest}", spec.path)
    module = importlib.util.module_from_spec(loader_spec)
    loader_spec.loader.exec_module(module)
    return getattr(module, spec.name)
