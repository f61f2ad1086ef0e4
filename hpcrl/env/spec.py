"""`rollout.env` checked at `expand` without running it: the class is found and defines reset and step.

The file (or module found on sys.path without importing it) must parse and define a top-level class of
that name whose body - or a base class defined in the same file - defines `reset` and `step`. A class
whose bases come from elsewhere (an imported framework's Env) may inherit them: that cannot be known
without running code, so it is accepted and a missing method is the ranks' error.
"""

from __future__ import annotations

import ast

from hpcrl.errors import Problem
from hpcrl.usercode.spec import read_source_tree

KEY = "rollout.env"
METHODS = ("reset", "step")


def environment_problems(text: str) -> list[Problem]:
    """Why `text` cannot name an environment class; nothing is executed."""
    found = read_source_tree(text, KEY, "environment")
    if isinstance(found, list):
        return found
    spec, tree = found
    classes = {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}
    if spec.name not in classes:
        message = f"defines no top-level class {spec.name!r} (an environment is a class with reset and step)"
        return [Problem(message, file=str(spec.source_file()), key=KEY)]
    missing = _missing_methods(classes[spec.name], classes, set())
    if missing:
        message = (
            f"class {spec.name} does not define {' and '.join(missing)} (an environment needs {METHODS})"
        )
        return [Problem(message, file=str(spec.source_file()), key=KEY)]
    return []


def _missing_methods(node: ast.ClassDef, classes: dict[str, ast.ClassDef], seen: set[str]) -> list[str]:
    """The methods of METHODS neither `node` nor its bases in this file define; [] when a base is
    defined elsewhere (it may define them)."""
    seen.add(node.name)
    defined = {n.name for n in node.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
    missing = [m for m in METHODS if m not in defined]
    for base in node.bases:
        if not missing:
            break
        if isinstance(base, ast.Name) and base.id == "object":
            continue
        if not isinstance(base, ast.Name) or base.id not in classes:
            return []  # defined elsewhere: it may define them
        if base.id not in seen:
            inherited = _missing_methods(classes[base.id], classes, seen)
            missing = [m for m in missing if m in inherited]
    return missing
