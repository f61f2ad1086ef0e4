"""The manifest (`manifest.json`): what a committed checkpoint holds and how to verify it.

    format, hpcrl_version, step, world_size, layout (caller's description, e.g. {"t": 2, "p": 1, "d": 2}),
    model_fingerprint  sha256 over (name, global shape, dtype) of every tensor: same model <=> same value,
                       whatever the parallel layout
    shard_fingerprint  sha256 over every shard's box and file: same parallel layout <=> same value
    tensors            name -> {global_shape, dtype, partition, shards: [{offset, shape, file, dataset}]}
    files              file -> {size, segments: [[start, stop, digest]...], digest, byte_offsets: {dataset: int}}
    rng                group rank -> capture_rng() of that rank
    state              RunState (step, data cursor, algorithm state, run id, tracker run id, restart count)

JSON only; parsed and schema-checked before any tensor is read.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpcrl.ckpt.shards import Box

FORMAT = "hpcrl-ckpt/1"
MANIFEST = "manifest.json"


class CheckpointError(RuntimeError):
    """A save or load that could not complete; nothing was committed or modified."""


class CorruptCheckpoint(CheckpointError):
    """A checkpoint directory that does not verify (names the file and the tensors affected)."""


@dataclass(frozen=True)
class ShardEntry:
    offset: tuple[int, ...]
    shape: tuple[int, ...]
    file: str
    dataset: str

    @property
    def box(self) -> Box:
        return Box(self.offset, self.shape)


@dataclass(frozen=True)
class TensorEntry:
    global_shape: tuple[int, ...]
    dtype: str
    partition: dict[str, int]
    shards: list[ShardEntry]


@dataclass(frozen=True)
class FileEntry:
    size: int
    segments: list[tuple[int, int, str]]
    """(start byte, stop byte, digest) covering the file; boundaries on dataset boundaries (integrity.py)."""
    digest: str
    byte_offsets: dict[str, int]


@dataclass
class Manifest:
    step: int
    world_size: int
    layout: dict[str, Any]
    tensors: dict[str, TensorEntry]
    files: dict[str, FileEntry]
    rng: dict[str, Any]
    state: dict[str, Any]
    hpcrl_version: str
    model_fingerprint: str = ""
    shard_fingerprint: str = ""
    format: str = FORMAT
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.model_fingerprint = model_fingerprint(self.tensors)
        self.shard_fingerprint = shard_fingerprint(self.tensors)

    def tensors_in_file(self, file: str) -> list[str]:
        return sorted(
            f"{name}{s.box.describe()}"
            for name, t in self.tensors.items()
            for s in t.shards
            if s.file == file
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "format": self.format,
            "hpcrl_version": self.hpcrl_version,
            "step": self.step,
            "world_size": self.world_size,
            "layout": self.layout,
            "model_fingerprint": self.model_fingerprint,
            "shard_fingerprint": self.shard_fingerprint,
            "tensors": {
                name: {
                    "global_shape": list(t.global_shape),
                    "dtype": t.dtype,
                    "partition": t.partition,
                    "shards": [
                        {
                            "offset": list(s.offset),
                            "shape": list(s.shape),
                            "file": s.file,
                            "dataset": s.dataset,
                        }
                        for s in t.shards
                    ],
                }
                for name, t in self.tensors.items()
            },
            "files": {
                name: {
                    "size": f.size,
                    "segments": [list(g) for g in f.segments],
                    "digest": f.digest,
                    "byte_offsets": f.byte_offsets,
                }
                for name, f in self.files.items()
            },
            "rng": self.rng,
            "state": self.state,
            "extra": self.extra,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Manifest:
        if data.get("format") != FORMAT:
            raise ValueError(f"format is {data.get('format')!r}, expected {FORMAT!r}")
        manifest = cls(
            step=int(data["step"]),
            world_size=int(data["world_size"]),
            layout=dict(data["layout"]),
            tensors={
                name: TensorEntry(
                    tuple(t["global_shape"]),
                    t["dtype"],
                    {k: int(v) for k, v in t["partition"].items()},
                    [
                        ShardEntry(tuple(s["offset"]), tuple(s["shape"]), s["file"], s["dataset"])
                        for s in t["shards"]
                    ],
                )
                for name, t in data["tensors"].items()
            },
            files={
                name: FileEntry(
                    int(f["size"]),
                    [(int(lo), int(hi), str(d)) for lo, hi, d in f["segments"]],
                    f["digest"],
                    {k: int(v) for k, v in f["byte_offsets"].items()},
                )
                for name, f in data["files"].items()
            },
            rng=dict(data["rng"]),
            state=dict(data["state"]),
            hpcrl_version=data["hpcrl_version"],
            extra=dict(data.get("extra", {})),
        )
        for key in ("model_fingerprint", "shard_fingerprint"):
            if data.get(key) != getattr(manifest, key):
                raise ValueError(f"{key} does not match the tensors the manifest lists")
        return manifest


def model_fingerprint(tensors: dict[str, TensorEntry]) -> str:
    rows = sorted((name, list(t.global_shape), t.dtype) for name, t in tensors.items())
    return hashlib.sha256(json.dumps(rows).encode()).hexdigest()


def shard_fingerprint(tensors: dict[str, TensorEntry]) -> str:
    rows = sorted(
        (name, list(s.offset), list(s.shape), s.file) for name, t in tensors.items() for s in t.shards
    )
    return hashlib.sha256(json.dumps(rows).encode()).hexdigest()


def read_manifest(directory: Path) -> Manifest:
    """Parse and schema-check `directory/manifest.json`; CorruptCheckpoint names the file on failure."""
    path = directory / MANIFEST
    try:
        return Manifest.from_json(json.loads(path.read_bytes()))
    except FileNotFoundError:
        raise CorruptCheckpoint(f"{path}: manifest missing") from None
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        raise CorruptCheckpoint(f"{path}: manifest does not parse: {err!r}") from err
