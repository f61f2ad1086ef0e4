"""Where user code lives: `path/to/file.py:name` or `package.module:name` (like `entrypoint`).

`FunctionSpec.parse` reads the text, `source_file` finds the file an import would run (without
running any package code), and `load_function` imports it: only in the process that calls it (the
child of hpcrl.usercode.runner), never at `expand`.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.machinery
import importlib.util
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hpcrl.errors import short

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
        for part in self.module.split("."):
            found = importlib.machinery.PathFinder.find_spec(part, locations)
            if found is None:
                return None
            locations = found.submodule_search_locations
        return found.origin if found is not None and found.has_location else None

    def __str__(self) -> str:
        return f"{self.path or self.module}:{self.name}"


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
