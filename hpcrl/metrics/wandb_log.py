"""What a W&B run wrote on this machine, read back from its transaction log (`<dir>/wandb/*run-*/
run-<id>.wandb`, written in offline and online mode alike; wandb 0.2x+ ships no Python reader of it).

Why: wandb's service process writes the steps handed to it a little later, and dies with the rank: a
SIGKILL loses the last ones. A resumed attempt reads which steps W&B did write and sends the missing ones
again (hpcrl.metrics.trackers.WandbTracker.catch_up); the tests read whole histories with it.

The format: a 7-byte header (':W&B', magic 0xBEE1, a version byte), then LevelDB-log framing (32 KiB
blocks; records of crc32 u32, length u16, type u8: full, first, middle, last; a block's tail under 7
bytes is padding) around protobuf `Record`s (wandb.proto.wandb_internal_pb2). A record still being
written (a torn tail) ends the read; a file that is not this format reads as nothing."""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

BLOCK = 32768
HEADER = struct.Struct("<4sHB")
RECORD = struct.Struct("<IHB")
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4
MAGIC = (b":W&B", 0xBEE1)


def records(path: Path) -> list[bytes]:
    """The protobuf records of one transaction log, in order ([] when it is not one)."""
    data = Path(path).read_bytes()
    if len(data) < HEADER.size or HEADER.unpack_from(data)[:2] != MAGIC:
        return []
    out, pending, pos = [], b"", HEADER.size
    while pos + RECORD.size <= len(data):
        left = BLOCK - pos % BLOCK
        if left < RECORD.size:  # the block's tail is padding
            pos += left
            continue
        _, length, kind = RECORD.unpack_from(data, pos)
        pos += RECORD.size
        if pos + length > len(data):  # a record still being written
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


def run_logs(root: Path, run_id: str | None = None) -> list[Path]:
    """The transaction logs under `<root>/wandb` (of run `run_id` only, when given), oldest attempt first
    (their directory names start with the start time)."""
    pattern = f"wandb/*run-*/run-{run_id}.wandb" if run_id else "wandb/*run-*/*.wandb"
    return sorted(Path(root).glob(pattern))


def _parsed(path: Path) -> Iterator[Any]:
    from wandb.proto import wandb_internal_pb2 as pb

    for raw in records(path):
        record = pb.Record()
        try:
            record.ParseFromString(raw)
        except Exception:  # protobuf's DecodeError: not a record of this version
            continue
        yield record


def history(root: Path, run_id: str | None = None) -> list[dict[str, Any]]:
    """Every history row written under `<root>/wandb`, attempt after attempt: `step` and the logged keys
    (W&B's own _step, _runtime, _timestamp aside)."""
    rows = []
    for path in run_logs(root, run_id):
        for record in _parsed(path):
            if record.WhichOneof("record_type") != "history":
                continue
            items = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item}
            rows.append(
                {"step": record.history.step.num} | {k: v for k, v in items.items() if not k.startswith("_")}
            )
    return rows


def last_step(root: Path, run_id: str) -> int:
    """The last step run `run_id` wrote a history row for under `<root>/wandb` (-1: none)."""
    return max((row["step"] for row in history(root, run_id)), default=-1)


def run_ids(root: Path) -> set[str]:
    """The W&B run id of every transaction log under `<root>/wandb`."""
    return {
        record.run.run_id
        for path in run_logs(root)
        for record in _parsed(path)
        if record.WhichOneof("record_type") == "run"
    }
