"""Data files are untrusted input: every reader of `data.path` (jsonl, parquet, an HF `datasets`
directory) goes through here, at `expand` and on the ranks alike.

What a data file may not do to the reader, and what it gets instead (a ConfigError naming the file and
`data.path`, with the line where there is one; `expand` exits 2 and writes nothing):
- hang it: a FIFO or a device is refused without blocking (hpcrl.config.safe_read opens with O_NONBLOCK
  and checks the opened file is regular); so is a directory given as a file, a file given as a dataset
  directory, and a dataset directory holding anything but directories and regular files (a FIFO, a
  socket, or a symlink, which could lead anywhere);
- exhaust memory: a file over MAX_FILE_BYTES, a line over MAX_LINE_BYTES;
- crash it: invalid UTF-8, a JSON value nested past MAX_NESTING (the C parser's own limit is a
  RecursionError), a parquet file that is not one, a directory `datasets` cannot load.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

from hpcrl.config.safe_read import read_capped
from hpcrl.errors import ConfigError, Problem, printable, short

MAX_FILE_BYTES = 1 << 32
"""4 GiB: the whole file is read into memory (every row of it is kept), so it must fit beside a job."""
MAX_LINE_BYTES = 1 << 24
"""16 MiB per jsonl row: a conversation of a 100k-token context is about 1 MiB."""
MAX_NESTING = 64
"""Deepest JSON nesting of a row: a chat row is 3 deep (row, messages, message); past this it is not a row."""
DATASET_MARKERS = ("state.json", "dataset_dict.json")
"""A directory written by `datasets`' save_to_disk holds one of these (a Dataset, a DatasetDict)."""


def _refused(path: Path, message: str) -> ConfigError:
    return ConfigError(Problem(message, file=str(path), key="data.path"))


def read_bytes(path: Path) -> bytes:
    """The bytes of the regular file `path`, refused (ConfigError) when it is anything else or too big."""
    try:
        return read_capped(path, MAX_FILE_BYTES)
    except (OSError, ValueError) as err:
        raise _refused(path, f"cannot be read as a data file: {err.strerror or err}") from None


def read_jsonl(path: Path) -> list[Any]:
    """Every non-blank line of a jsonl file, parsed (each row as the JSON says: a caller checks it is
    a mapping and names the row)."""
    rows = []
    for line_no, line in enumerate(read_bytes(path).split(b"\n"), 1):
        if not line.strip():
            continue
        if len(line) > MAX_LINE_BYTES:
            raise _refused(
                path, f"line {line_no} is {len(line):,} bytes; a row has at most {MAX_LINE_BYTES:,}"
            )
        rows.append(_json_row(line, line_no, path))
    return rows


def _json_row(line: bytes, line_no: int, path: Path) -> Any:
    try:
        row = json.loads(line.decode("utf-8"), parse_constant=_no_constant)
    except UnicodeDecodeError as err:
        raise _refused(path, f"line {line_no} is not UTF-8 text: {err.reason} at byte {err.start}") from None
    except RecursionError:
        raise _refused(path, f"line {line_no} nests deeper than {MAX_NESTING} levels") from None
    except ValueError as err:  # json.JSONDecodeError, and NaN / Infinity (not JSON)
        raise _refused(path, f"line {line_no} is not JSON: {printable(str(err))[:200]}") from None
    if _depth(row) > MAX_NESTING:
        raise _refused(path, f"line {line_no} nests deeper than {MAX_NESTING} levels")
    return row


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _depth(value: Any) -> int:
    """The nesting depth of a parsed JSON value (iterative: the value may be deep)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, depth)
            if depth <= MAX_NESTING:
                stack += [(v, depth + 1) for v in (item.values() if isinstance(item, dict) else item)]
    return deepest


def read_parquet(path: Path) -> list[Any]:
    """The rows of a parquet file (pyarrow reads it from the bytes read here, never from the path)."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise ConfigError(
            Problem("parquet needs pyarrow: pip install pyarrow", file=str(path), key="data.source")
        ) from None
    data = read_bytes(path)
    try:
        return pq.read_table(pa.BufferReader(data)).to_pylist()
    except (pa.ArrowException, OSError, ValueError) as err:
        raise _refused(path, f"is not a parquet file pyarrow can read: {printable(str(err))[:200]}") from None


def read_hf_disk(path: Path) -> list[Any]:
    """The rows of a directory written by `datasets`' save_to_disk (a DatasetDict's 'train' split)."""
    _check_dataset_dir(path)
    try:
        import datasets
    except ImportError:
        message = "hf_disk needs the `datasets` package: pip install datasets"
        raise ConfigError(Problem(message, file=str(path), key="data.source")) from None
    try:
        ds = datasets.load_from_disk(str(path))
    except Exception as err:  # noqa: BLE001 - whatever `datasets` raises on a damaged directory
        raise _refused(
            path, f"`datasets` cannot load it: {type(err).__name__}: {printable(str(err))[:200]}"
        ) from None
    if isinstance(ds, datasets.DatasetDict):
        if "train" not in ds:
            raise _refused(path, f"DatasetDict without a 'train' split: {short(list(ds))}")
        ds = ds["train"]
    return ds.to_list()


def _check_dataset_dir(path: Path) -> None:
    """A real directory with a save_to_disk marker, holding only directories and regular files (two
    levels: a DatasetDict's splits), so that loading it opens no FIFO and follows no link."""
    try:
        mode = os.stat(path).st_mode
    except OSError as err:
        raise _refused(path, f"cannot be read: {err.strerror}") from None
    if not stat.S_ISDIR(mode):
        raise _refused(path, "is not a directory (data.source hf_disk reads a save_to_disk directory)")
    if not any((path / marker).is_file() for marker in DATASET_MARKERS):
        raise _refused(
            path, f"is not a `datasets` save_to_disk directory (it has no {' or '.join(DATASET_MARKERS)})"
        )
    for directory in (path, *(p for p in _entries(path) if p.is_dir(follow_symlinks=False))):
        for entry in _entries(Path(directory)):
            if not (entry.is_dir(follow_symlinks=False) or entry.is_file(follow_symlinks=False)):
                kind = "a symlink" if entry.is_symlink() else "not a regular file"
                raise _refused(path, f"{short(entry.path)} is {kind} (a dataset directory holds files)")


def _entries(directory: Path) -> list[os.DirEntry]:
    try:
        with os.scandir(directory) as it:
            return list(it)
    except OSError as err:
        raise _refused(directory, f"cannot be listed: {err.strerror}") from None
