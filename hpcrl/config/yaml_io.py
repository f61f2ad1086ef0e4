"""Strict YAML in, canonical YAML/JSON out, and atomic file writes.

PyYAML silently keeps the last of two equal keys; a template with `lr:` twice is a mistake that
would change an experiment without a word, so the loader here rejects duplicates (with both lines).

Bounded input: a YAML text is at most MAX_YAML_BYTES, and its node graph, with every alias expanded, at
most MAX_EXPANDED_NODES nodes (a recursive alias is refused). Aliases share one Python object, so a
"billion laughs" file of a few hundred bytes loads at once, but everything that walks it (type checks,
error messages, a sweep over it) would walk 10^9 nodes; it is refused here, before it is built.
"""

from __future__ import annotations

import functools
import json
import math
import os
import re
import tempfile
from collections.abc import Hashable, Iterable
from pathlib import Path
from typing import Any

import yaml

from hpcrl.config.safe_read import UnsafeFile, read_capped
from hpcrl.errors import ConfigError, Problem

_Base = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

MAX_YAML_BYTES = 8 << 20
"""Largest template, profile or command-line value read (a template is a few KB)."""
MAX_EXPANDED_NODES = 1_000_000
"""Largest node count of a YAML document with its aliases expanded (a 10,000-point list sweep: ~30,000)."""


class _StrictLoader(_Base):  # type: ignore[misc, valid-type]
    """SafeLoader that raises on duplicate mapping keys."""


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    loader.flatten_mapping(node)
    seen: dict[Any, int] = {}
    out: dict[Any, Any] = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        line = key_node.start_mark.line + 1
        if not isinstance(key, Hashable):
            raise yaml.constructor.ConstructorError(
                None, None, f"a mapping key must be a scalar, got a {type(key).__name__}", key_node.start_mark
            )
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


MAX_INT_BITS = 1024
"""Largest YAML int read: Python prints no int of more than 4300 digits (the config id's JSON, an error
message) without raising, and a hex literal reaches that in a few KB; 1024 bits is ~309 digits."""


def _construct_int(loader: _StrictLoader, node: yaml.ScalarNode) -> int:
    """YAML's int, refused beyond MAX_INT_BITS."""
    value = yaml.constructor.SafeConstructor.construct_yaml_int(loader, node)
    if value.bit_length() > MAX_INT_BITS:
        raise yaml.constructor.ConstructorError(
            None, None, f"an integer beyond {MAX_INT_BITS} bits is not a config value", node.start_mark
        )
    return value


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
_StrictLoader.add_constructor("tag:yaml.org,2002:int", _construct_int)


def load_yaml(path: str | Path) -> Any:
    """Parse a YAML file strictly; any failure is a ConfigError naming the file (exit 2)."""
    path = Path(path)
    try:  # a regular file only: a FIFO would hang the open, a device read without end
        raw = read_capped(path, MAX_YAML_BYTES)
    except FileNotFoundError:
        raise ConfigError(Problem("file not found", file=str(path))) from None
    except UnsafeFile as err:
        raise ConfigError(Problem(f"cannot read: it {err.strerror}", file=str(path))) from None
    except (OSError, ValueError) as err:  # ValueError: a NUL byte in the path
        raise ConfigError(
            Problem(f"cannot read: {getattr(err, 'strerror', None) or err}", file=str(path))
        ) from None
    try:
        text = raw.decode()
    except UnicodeDecodeError as err:
        raise ConfigError(
            Problem(f"not UTF-8 text: {err.reason} at byte {err.start}", file=str(path))
        ) from None
    return loads_yaml(text, str(path))


def loads_yaml(text: str, source: str = "<string>") -> Any:
    """Parse YAML text strictly and within the size bounds of the module docstring (ConfigError naming
    `source` otherwise)."""
    if len(text) > MAX_YAML_BYTES:
        raise ConfigError(Problem(f"larger than {MAX_YAML_BYTES >> 20} MiB: not a config file", file=source))
    loader = _StrictLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_expanded_size(node, source)
        return loader.construct_document(node)
    except (yaml.YAMLError, ValueError, TypeError, OverflowError) as err:  # the latter: a tag's constructor
        raise ConfigError(Problem(f"invalid YAML: {' '.join(str(err).split())}", file=source)) from None
    finally:
        loader.dispose()


def _check_expanded_size(root: yaml.Node, source: str) -> None:
    """Refuse a document whose alias-expanded node count exceeds MAX_EXPANDED_NODES, or that contains
    itself (a recursive alias). Each distinct node is sized once (iterative, memoised by identity)."""
    sizes: dict[int, int] = {}
    on_path: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if children_done:
            on_path.discard(key)
            sizes[key] = 1 + sum(sizes[id(child)] for child in _children(node))
            if sizes[key] > MAX_EXPANDED_NODES:
                raise ConfigError(
                    Problem(
                        f"YAML aliases expand to more than {MAX_EXPANDED_NODES:,} nodes: not a config file",
                        file=source,
                    )
                )
            continue
        if key in sizes:
            continue
        if key in on_path:
            raise ConfigError(Problem("a YAML alias refers to a node that contains it", file=source))
        on_path.add(key)
        stack.append((node, True))
        stack.extend((child, False) for child in _children(node) if id(child) not in sizes)


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


_Dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


def dump_yaml(data: Any) -> str:
    """Block-style YAML of plain config data, keys in the dataclass order (not sorted).

    A small emitter instead of yaml.dump (whose Python representer costs ~4 ms per config, the bulk of
    writing a 10,000-config sweep): mappings in block style, lists and anything else in flow style as
    JSON (JSON is valid YAML), strings plain when YAML reads them back as the same string, else JSON-
    quoted. `loads_yaml(dump_yaml(x)) == x` for str/int/float/bool/None/list/dict data (tested).
    """
    if isinstance(data, dict) and data:
        return "".join(dump_yaml_item(key, value) for key, value in data.items())
    return _scalar(data) + "\n"


def dump_yaml_item(key: Any, value: Any) -> str:
    """The text one top-level item contributes to `dump_yaml` of its mapping. Separate so a writer of
    many configs that share sections (a sweep) can keep each shared section's text instead of
    rendering it again (hpcrl.experiment.elements)."""
    return "".join(_emit({key: value}, ""))


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


def canonical_json_joined(items: dict[str, str]) -> str:
    """`canonical_json` of a mapping with string keys, given each value's canonical text: the same
    characters, so a sweep's elements can reuse the text of every section they share (tested equal)."""
    return "{" + ",".join(f"{_json_key(key)}:{items[key]}" for key in sorted(items)) + "}"


@functools.lru_cache(maxsize=1024)
def _json_key(key: str) -> str:
    return canonical_json(key)


def atomic_write(path: str | Path, text: str | Iterable[str], *, fsync: bool = True) -> None:
    """Write `text` (or its pieces, written as they come: a large manifest is never one string) to
    `path` so readers see the old file or the new one, never a half-written one.

    tmp file in the same directory -> fsync -> rename -> fsync the directory.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as fh:
            if isinstance(text, str):
                fh.write(text)
            else:
                fh.writelines(text)
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
