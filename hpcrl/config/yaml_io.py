"""Strict YAML in, canonical YAML/JSON out, and atomic file writes.

PyYAML silently keeps the last of two equal keys; a template with `lr:` twice is a mistake that
would change an experiment without a word, so the loader here rejects duplicates (with both lines).
"""

from __future__ import annotations

import functools
import json
import math
import os
import re
import tempfile
from pathlib import Path
from typing import Any

import yaml

from hpcrl.errors import ConfigError, Problem

_Base = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _StrictLoader(_Base):  # type: ignore[misc, valid-type]
    """SafeLoader that raises on duplicate mapping keys."""


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    loader.flatten_mapping(node)
    seen: dict[Any, int] = {}
    out: dict[Any, Any] = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        line = key_node.start_mark.line + 1
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None,
                None,
                f"duplicate key {key!r} (first on line {seen[key]}, again on line {line})",
                key_node.start_mark,
            )
        seen[key] = line
        out[key] = loader.construct_object(value_node, deep=deep)
    return out


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def load_yaml(path: str | Path) -> Any:
    """Parse a YAML file strictly; any failure is a ConfigError naming the file (exit 2)."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError(Problem("file not found", file=str(path))) from None
    except OSError as err:
        raise ConfigError(Problem(f"cannot read: {err.strerror}", file=str(path))) from None
    try:
        return yaml.load(text, Loader=_StrictLoader)
    except yaml.YAMLError as err:
        msg = " ".join(str(err).split())
        raise ConfigError(Problem(f"invalid YAML: {msg}", file=str(path))) from None


def loads_yaml(text: str, source: str = "<string>") -> Any:
    try:
        return yaml.load(text, Loader=_StrictLoader)
    except yaml.YAMLError as err:
        raise ConfigError(Problem(f"invalid YAML: {' '.join(str(err).split())}", file=source)) from None


_Dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


def dump_yaml(data: Any) -> str:
    """Block-style YAML of plain config data, keys in the dataclass order (not sorted).

    A small emitter instead of yaml.dump (whose Python representer costs ~4 ms per config, the bulk of
    writing a 10,000-config sweep): mappings in block style, lists and anything else in flow style as
    JSON (JSON is valid YAML), strings plain when YAML reads them back as the same string, else JSON-
    quoted. `loads_yaml(dump_yaml(x)) == x` for str/int/float/bool/None/list/dict data (tested).
    """
    return "".join(_emit(data, "")) if isinstance(data, dict) and data else _scalar(data) + "\n"


def _emit(mapping: dict, indent: str):
    for key, value in mapping.items():
        name = _scalar(key)
        if isinstance(value, dict) and value:
            yield f"{indent}{name}:\n"
            yield from _emit(value, indent + "  ")
        else:
            yield f"{indent}{name}: {_scalar(value)}\n"


_PLAIN = re.compile(r"[A-Za-z_/][\w./+-]*(?::[\w./+-]+)*")  # a colon only inside, never ": "


@functools.lru_cache(maxsize=4096)
def _plain_ok(text: str) -> bool:
    if not _PLAIN.fullmatch(text):
        return False
    return _RESOLVER.resolve(yaml.ScalarNode, text, (True, False)) == "tag:yaml.org,2002:str"


def _scalar(value: Any) -> str:
    if value is None:
        return "null"
    if value is True or value is False:
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return _float(value)
    if isinstance(value, str):
        if _plain_ok(value):
            return value
        if value.isprintable() and not _YAML_BREAKS.intersection(value):
            return json.dumps(value, ensure_ascii=False)
        # control characters, line breaks: let PyYAML escape them (rare: hostile or odd values only)
        return yaml.dump(value, Dumper=_Dumper, default_style='"', width=1 << 30).rstrip("\n")
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_scalar(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_scalar(k)}: {_scalar(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"cannot write {type(value).__name__} to YAML")


def _float(value: float) -> str:
    if math.isnan(value):
        return ".nan"
    if math.isinf(value):
        return ".inf" if value > 0 else "-.inf"
    text = repr(value)
    if "e" in text and "." not in text.split("e")[0]:  # YAML 1.1 reads 1e-06 as a string: write 1.0e-06
        mantissa, exponent = text.split("e")
        text = f"{mantissa}.0e{exponent}"
    return text


_RESOLVER = yaml.resolver.Resolver()
_YAML_BREAKS = set("\x85\u2028\u2029\ufeff")


def canonical_json(data: Any) -> str:
    """One canonical text per value: sorted keys, no spaces. The basis of config ids."""
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def atomic_write(path: str | Path, text: str, *, fsync: bool = True) -> None:
    """Write `text` to `path` so readers see the old file or the new one, never a half-written one.

    tmp file in the same directory -> fsync -> rename -> fsync the directory.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
            if fsync:
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    if fsync:
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
