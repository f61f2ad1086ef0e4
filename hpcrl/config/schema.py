"""Key-by-key checking of plain YAML data against the experiment dataclasses: THE validation of templates
and command-line overrides (hpcrl.experiment.resolve, hpcrl.cli.common), and of benchmark suite templates
(hpcrl.bench.runner).

jsonargparse (which parses the command line's own options) stops at the first bad key; a template author
wants every problem at once, each with the file and dotted key. So the dataclasses' own type hints are
walked here: unknown keys (with the closest valid key, from difflib), wrong types, and fields without a
default that nobody set. Values are also normalised (YAML lists -> tuples, ints -> floats where a float is
declared) so that `build` can make the dataclass directly.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import types
import typing
from typing import Annotated, Any, Literal, Union

from hpcrl.config.ranges import Range
from hpcrl.errors import Problem, short

_NO_VALUE = object()


class TypeMismatch(ValueError):
    """A value does not fit a type hint; the message says what was expected."""

    label = "wrong type"
    """How a problem report introduces the message."""


class OutOfRange(TypeMismatch):
    """A number of the right type outside its field's Range (hpcrl.config.ranges)."""

    label = "out of range"


@functools.cache
def field_types(cls: type) -> dict[str, Any]:
    """Resolved type hints of a dataclass's fields (postponed annotations evaluated)."""
    hints = typing.get_type_hints(cls, include_extras=True)  # keep Annotated ranges
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def is_config_class(hint: Any) -> bool:
    return isinstance(hint, type) and dataclasses.is_dataclass(hint)


@functools.cache
def leaf_types(cls: type) -> dict[str, Any]:
    """Every dotted leaf key of a (nested) config dataclass -> its type hint."""
    out: dict[str, Any] = {}
    for name, hint in field_types(cls).items():
        if is_config_class(hint):
            out.update({f"{name}.{sub}": h for sub, h in leaf_types(hint).items()})
        else:
            out[name] = hint
    return out


def describe(hint: Any) -> str:
    """A short human name of a type hint: int, float, one of ['a', 'b'], str or null, ..."""
    origin = typing.get_origin(hint)
    if origin is Annotated:
        base, *extras = typing.get_args(hint)
        return " ".join([describe(base), *(str(r) for r in extras if isinstance(r, Range))])
    if origin is Literal:
        return f"one of {list(typing.get_args(hint))}"
    if origin in (Union, types.UnionType):
        args = typing.get_args(hint)
        return " or ".join("null" if a is type(None) else describe(a) for a in args)
    if origin is tuple:
        return f"tuple[{', '.join(describe(a) for a in typing.get_args(hint))}]"
    if origin is not None:
        return str(hint).replace("typing.", "")
    return getattr(hint, "__name__", str(hint))


def check_value(value: Any, hint: Any) -> Any:
    """Return `value` normalised to `hint`, or raise TypeMismatch (OutOfRange for a number outside its
    Range). bool is never accepted as a number."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if hint is Any:
        return value
    if origin is Annotated:
        value = check_value(value, args[0])
        for extra in args[1:]:
            if isinstance(extra, Range) and (problem := extra.problem(value)):
                raise OutOfRange(problem)
        return value
    if origin is Literal:
        if value in args and not (isinstance(value, bool) and not any(isinstance(a, bool) for a in args)):
            return value
        raise TypeMismatch(f"expected {describe(hint)}, got {short(value)}")
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        out_of_range = None
        for arg in args:
            if arg is type(None):
                continue
            try:
                return check_value(value, arg)
            except OutOfRange as err:  # the right type: its range is the message
                out_of_range = err
            except TypeMismatch:
                continue
        if out_of_range is not None:
            raise out_of_range
        raise TypeMismatch(f"expected {describe(hint)}, got {short(value)} ({type(value).__name__})")
    if origin is dict:
        key_t, val_t = args or (Any, Any)
        if not isinstance(value, dict):
            raise TypeMismatch(f"expected a mapping ({describe(hint)}), got {short(value)}")
        return {check_value(k, key_t): check_value(v, val_t) for k, v in value.items()}
    if origin is list:
        (item_t,) = args or (Any,)
        if not isinstance(value, (list, tuple)):
            raise TypeMismatch(f"expected a list ({describe(hint)}), got {short(value)}")
        return [check_value(v, item_t) for v in value]
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise TypeMismatch(f"expected a list of {len(args)} ({describe(hint)}), got {short(value)}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(check_value(v, args[0]) for v in value)
        if len(value) != len(args):
            raise TypeMismatch(
                f"expected {len(args)} items ({describe(hint)}), got {len(value)}: {short(value)}"
            )
        return tuple(check_value(v, a) for v, a in zip(value, args, strict=True))
    return _check_scalar(value, hint)


def _check_scalar(value: Any, hint: Any) -> Any:
    if hint is bool:
        if isinstance(value, bool):
            return value
    elif hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML 1.1 reads `1e-6` (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
    elif hint is str:
        if isinstance(value, str):
            return value
    elif isinstance(value, hint):
        return value
    raise TypeMismatch(f"expected {describe(hint)}, got {short(value)} ({type(value).__name__})")


def suggest(key: str, valid: list[str]) -> str:
    """' (did you mean X?)' for the closest valid key, or ''."""
    close = difflib.get_close_matches(key, valid, n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def check_tree(
    data: Any, cls: type, origin_of: typing.Callable[[str], str | None], prefix: str = ""
) -> tuple[dict[str, Any], list[Problem]]:
    """Check a nested mapping against dataclass `cls`; return (normalised mapping, problems).

    `origin_of(dotted_key)` names the file a key came from, for the messages.
    """
    problems: list[Problem] = []
    where = prefix.rstrip(".") or None
    if not isinstance(data, dict):
        problems.append(
            Problem(
                f"expected a mapping of {cls.__name__} fields, got {short(data)}",
                origin_of(where or ""),
                where,
            )
        )
        return {}, problems
    hints = field_types(cls)
    out: dict[str, Any] = {}
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        if key not in hints:
            valid = list(hints)
            problems.append(Problem(f"unknown key{suggest(str(key), valid)}", origin_of(dotted), dotted))
            continue
        hint = hints[key]
        if is_config_class(hint):
            out[key], sub = check_tree(value, hint, origin_of, f"{dotted}.")
            problems += sub
            continue
        try:
            out[key] = check_value(value, hint)
        except TypeMismatch as err:
            problems.append(Problem(f"{err.label}: {err}", origin_of(dotted), dotted))
    for f in dataclasses.fields(cls):
        missing = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        if missing and f.name not in data:
            dotted = f"{prefix}{f.name}"
            problems.append(Problem("missing required field", origin_of(dotted), dotted))
    return out, problems


def range_of(hint: Any) -> tuple[type, Range] | None:
    """(the number type, its Range) of a field's hint `Annotated[T, Range(...)]`, optionally `| None`
    (or a tuple of them: its first item's); None for a hint without a range."""
    for arg in (hint, *typing.get_args(hint)):
        if typing.get_origin(arg) is Annotated:
            base, *extras = typing.get_args(arg)
            ranges = [extra for extra in extras if isinstance(extra, Range)]
            if ranges:
                return base, ranges[0]
    return None


def range_problems(obj: Any, prefix: str = "") -> list[Problem]:
    """Every value of a (nested) config dataclass instance outside its field's Range, by dotted key: for
    a config built in code (a template's values are checked by check_tree, before a dataclass exists)."""
    problems = []
    for name, hint in field_types(type(obj)).items():
        value, key = getattr(obj, name), f"{prefix}{name}"
        if is_config_class(hint):
            problems += range_problems(value, f"{key}.")
            continue
        try:
            check_value(value, hint)
        except OutOfRange as err:
            problems.append(Problem(f"{err.label}: {err}", key=key))
        except TypeMismatch:
            pass  # a type the code put there: not a range for this check to report
    return problems


def build(cls: type, data: dict[str, Any]) -> Any:
    """Instantiate a config dataclass from a checked (normalised) mapping; absent keys keep defaults."""
    hints = field_types(cls)
    kwargs = {}
    for key, value in data.items():
        hint = hints[key]
        kwargs[key] = build(hint, value) if is_config_class(hint) else value
    return cls(**kwargs)


def to_dict(obj: Any) -> Any:
    """A config dataclass as plain data (tuples become lists), the form written to YAML/JSON."""
    if obj is None or isinstance(obj, (str, int, float)):  # bool is an int
        return obj
    if dataclasses.is_dataclass(obj):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    return obj


def get_dotted(data: dict[str, Any], dotted: str, default: Any = _NO_VALUE) -> Any:
    node: Any = data
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            if default is _NO_VALUE:
                raise KeyError(dotted)
            return default
        node = node[part]
    return node


def set_dotted(data: dict[str, Any], dotted: str, value: Any) -> None:
    """Set data[a][b][c] = value for 'a.b.c', creating (or replacing non-mapping) parents."""
    parts = dotted.split(".")
    node = data
    for part in parts[:-1]:
        child = node.get(part)
        if not isinstance(child, dict):
            child = node[part] = {}
        node = child
    node[parts[-1]] = value


def with_values(base: dict[str, Any], assignment: dict[str, Any]) -> dict[str, Any]:
    """A copy of `base` with dotted keys set; only the mappings on the changed paths are copied."""
    out = dict(base)
    for dotted, value in assignment.items():
        parts = dotted.split(".")
        node = out
        for part in parts[:-1]:
            child = node.get(part)
            node[part] = dict(child) if isinstance(child, dict) else {}
            node = node[part]
        node[parts[-1]] = value
    return out


def deep_merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    """A new mapping: `top` over `base`, recursively for mappings (lists and scalars replace)."""
    out = dict(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{'a': {'b': 1}} -> {'a.b': 1} (mappings are walked; lists are leaves)."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flatten(value, f"{dotted}."))
        else:
            out[dotted] = value
    return out
