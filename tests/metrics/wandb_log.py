"""A test oracle: the history rows of a W&B offline run, read from its `.wandb` file (wandb 0.2x+ ships no
Python reader). The file is W&B's transaction log: a 7-byte header (':W&B', magic 0xBEE1, version), then
LevelDB-log framing (32 KiB blocks; records of crc32 u32, length u16, type u8: full, first, middle, last)
around protobuf `Record`s (wandb.proto.wandb_internal_pb2)."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

BLOCK = 32768
HEADER = struct.Struct("<4sHB")
RECORD = struct.Struct("<IHB")
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: Path) -> list[bytes]:
    data = Path(path).read_bytes()
    ident, magic, _ = HEADER.unpack_from(data)
    assert ident == b":W&B" and magic == 0xBEE1, (ident, magic)
    out, pending, pos = [], b"", HEADER.size
    while pos + RECORD.size <= len(data):
        left = BLOCK - pos % BLOCK
        if left < RECORD.size:  # the block's tail is padding
            pos += left
            continue
        _, length, kind = RECORD.unpack_from(data, pos)
        pos += RECORD.size
        if pos + length > len(data):  # a record still being written (the file is read while it grows)
            break
        chunk, pos = data[pos : pos + length], pos + length
        if kind == FULL:
            out.append(chunk)
        elif kind == FIRST:
            pending = chunk
        elif kind == MIDDLE:
            pending += chunk
        elif kind == LAST:
            out.append(pending + chunk)
        elif length == 0:  # zero padding to the block's end
            pos += BLOCK - pos % BLOCK if pos % BLOCK else 0
    return out


def history(run_dir: Path) -> list[dict[str, Any]]:
    """Every history row of every offline run under <run_dir>/wandb, attempt after attempt (their
    directory names start with the start time), W&B's own keys (_step, _runtime, _timestamp) aside but
    `step`, the row's step."""
    from wandb.proto import wandb_internal_pb2 as pb

    rows = []
    for path in sorted(Path(run_dir).glob("wandb/offline-run-*/*.wandb")):
        for raw in records(path):
            record = pb.Record()
            record.ParseFromString(raw)
            if record.WhichOneof("record_type") != "history":
                continue
            items = {
                item.key or "/".join(item.nested_key): json.loads(item.value_json)
                for item in record.history.item
            }
            row = {"step": record.history.step.num}
            row |= {key: value for key, value in items.items() if not key.startswith("_")}
            rows.append(row)
    return rows


def run_ids(run_dir: Path) -> set[str]:
    """The W&B run id of every offline run under <run_dir>/wandb."""
    from wandb.proto import wandb_internal_pb2 as pb

    ids = set()
    for path in Path(run_dir).glob("wandb/offline-run-*/*.wandb"):
        for raw in records(path):
            record = pb.Record()
            record.ParseFromString(raw)
            if record.WhichOneof("record_type") == "run":
                ids.add(record.run.run_id)
    return ids
