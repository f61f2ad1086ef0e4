"""The manifest (`manifest.json`): what a committed checkpoint holds and how to verify it.

    format, hpcrl_version, step, world_size, layout (caller's description, e.g. {"t": 2, "p": 1, "d": 2}),
    model_fingerprint  sha256 over (name, global shape, dtype) of every tensor: same model <=> same value,
                       whatever the parallel layout
    shard_fingerprint  sha256 over every shard's box and file: same parallel layout <=> same value
    tensors            name -> {global_shape, dtype, partition, shards: [{offset, shape, file, dataset}]}
    files              file -> {size, segments: [[start, stop, digest]...], digest, byte_offsets: {dataset: int}}
    rng                group rank -> capture_rng() of that rank (one per rank that saved: 0..world_size-1)
    state              RunState (step, data cursor, algorithm state, run id, tracker run id, restart count)
    manifest_digest    sha256 of the canonical JSON of everything above (`manifest_digest`)

JSON only, at most MAX_MANIFEST_BYTES; its own digest checked, then parsed and schema-checked before any
tensor is read. The digest guards what no file checksum covers (the data cursor, the RNG states, the
model config under `extra`, the layout) against a torn or bit-flipped manifest that is still JSON; like
the file checksums, not against a forger (who can recompute it). A manifest written before the digest
has none, and is read as before.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpcrl.ckpt.shards import DTYPE_NAMES, Box, check_box, check_partition, check_tiling, itemsize
from hpcrl.ckpt.state import RunState
from hpcrl.config.safe_read import read_capped

FORMAT = "hpcrl-ckpt/1"
MANIFEST = "manifest.json"
MAX_MANIFEST_BYTES = 256 << 20
"""A manifest lists every shard and every 4 MiB checksum segment: ~10 MB for a 70B model sharded over
1,000 ranks. 256 MiB refuses a runaway or hostile file before json reads it into memory."""
DIGEST_KEY = "manifest_digest"
_RANK_FILE = re.compile(r"rank_(\d{5,})\.h5")


def rank_file(rank: int) -> str:
    """The file group rank `rank` writes its shards to."""
    return f"rank_{rank:05d}.h5"


def rank_of_file(name: str) -> int | None:
    """The group rank whose file `name` is (`rank_file`), or None when it is no rank's file name."""
    match = _RANK_FILE.fullmatch(name)
    return int(match.group(1)) if match else None


def manifest_digest(data: dict[str, Any]) -> str:
    """sha256 of the canonical JSON (sorted keys, no spaces) of a manifest's fields but its digest."""
    rest = {key: value for key, value in data.items() if key != DIGEST_KEY}
    return hashlib.sha256(json.dumps(rest, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


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
        data = self._fields_json()
        data[DIGEST_KEY] = manifest_digest(data)
        return data

    def _fields_json(self) -> dict[str, Any]:
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
    def from_json(cls, data: Any) -> Manifest:
        """Parse and check a manifest: every field's type (`ManifestError` names the field), then that
        it agrees with itself (`check_consistent`), so nothing downstream meets a value of the wrong kind."""
        data = _obj(data, "manifest")
        if DIGEST_KEY in data and data[DIGEST_KEY] != manifest_digest(data):
            raise ManifestError(f"{DIGEST_KEY} does not match its content (a damaged manifest)")
        if data.get("format") != FORMAT:
            raise ValueError(f"format is {data.get('format')!r}, expected {FORMAT!r}")
        manifest = cls(
            step=_count(_get(data, "step", "manifest"), "step"),
            world_size=_count(_get(data, "world_size", "manifest"), "world_size"),
            layout=_obj(_get(data, "layout", "manifest"), "layout"),
            tensors={
                _str(name, "tensor name"): _tensor(t, f"tensor {name!r}")
                for name, t in _obj(_get(data, "tensors", "manifest"), "tensors").items()
            },
            files={
                _str(name, "file name"): _file(f, f"file {name!r}")
                for name, f in _obj(_get(data, "files", "manifest"), "files").items()
            },
            rng=_obj(_get(data, "rng", "manifest"), "rng"),
            state=_obj(_get(data, "state", "manifest"), "state"),
            hpcrl_version=_str(_get(data, "hpcrl_version", "manifest"), "hpcrl_version"),
            extra=_obj(data.get("extra", {}), "extra"),
        )
        for key in ("model_fingerprint", "shard_fingerprint"):
            if data.get(key) != getattr(manifest, key):
                raise ValueError(f"{key} does not match the tensors the manifest lists")
        check_consistent(manifest)
        return manifest


class ManifestError(ValueError):
    """A manifest that is valid JSON but breaks the schema or contradicts itself; names the field."""


def check_consistent(manifest: Manifest) -> None:
    """The rules a manifest obeys by construction (ManifestError otherwise): known dtypes; every tensor's
    shards lie inside it and tile it exactly once; every shard names a listed file and a dataset no other
    shard names; each file's segments cover it exactly once; recorded dataset byte ranges lie inside
    their file without overlapping (so a dataset's checksum segments are its own); state is a RunState
    whose step is the manifest's. (A file's `digest` is a summary nothing is verified against.)"""
    stored: dict[tuple[str, str], str] = {}
    for name, tensor in manifest.tensors.items():
        _check_tensor(name, tensor, manifest.files)
        for shard in tensor.shards:
            label = f"{name}{shard.box.describe()}"
            other = stored.setdefault((shard.file, shard.dataset), label)
            if other != label:
                raise ManifestError(
                    f"file {shard.file!r}: dataset {shard.dataset!r} holds both {other} and {label}"
                )
    for name, entry in manifest.files.items():
        _check_file(name, entry, _claimed_ranges(manifest, name))
    _check_ranks(manifest)
    if RunState.from_json(manifest.state).step != manifest.step:
        raise ManifestError(
            f"state step {manifest.state['step']} differs from the manifest's step {manifest.step}"
        )


def _check_ranks(manifest: Manifest) -> None:
    """The ranks the manifest says saved it are the ranks whose RNG states it lists: one per rank
    0..world_size-1 (a manifest claiming 10^9 ranks with one state was 'verified'). Its files are each a
    rank's below world_size: a rule of the trust boundary (hpcrl.ckpt.trust.check_manifest), after the
    one that file names are plain."""
    world = manifest.world_size
    if world < 1 or len(manifest.rng) != world:
        raise ManifestError(
            f"world_size {world}, but RNG states of {len(manifest.rng)} rank(s): one per rank that saved"
        )
    for rank in manifest.rng:
        if not (rank.isascii() and rank.isdigit() and int(rank) < world and str(int(rank)) == rank):
            raise ManifestError(f"rng: {rank!r:.40} is not a group rank below world_size {world}")


def _check_tensor(name: str, tensor: TensorEntry, files: dict[str, FileEntry]) -> None:
    if tensor.dtype not in DTYPE_NAMES:
        raise ManifestError(f"tensor {name!r}: unknown dtype {tensor.dtype!r}")
    check_partition(name, tensor.partition, len(tensor.global_shape))
    for shard in tensor.shards:
        check_box(name, tensor.global_shape, shard.offset, shard.shape)
        if shard.file not in files:
            raise ManifestError(
                f"tensor {name!r}: shard {shard.box.describe()} is in unlisted file {shard.file!r}"
            )
    check_tiling(name, tensor.global_shape, [s.box for s in tensor.shards])


def _claimed_ranges(manifest: Manifest, file: str) -> list[tuple[int, int, str]]:
    """(start, stop, 'tensor[box]') of every non-empty shard whose dataset has a recorded byte offset."""
    offsets = manifest.files[file].byte_offsets
    return sorted(
        (
            offsets[s.dataset],
            offsets[s.dataset] + s.box.numel * itemsize(t.dtype),
            f"{name}{s.box.describe()}",
        )
        for name, t in manifest.tensors.items()
        for s in t.shards
        if s.file == file and s.dataset in offsets and s.box.numel
    )


def _check_file(name: str, entry: FileEntry, ranges: list[tuple[int, int, str]]) -> None:
    position = 0
    for start, stop, _ in entry.segments:
        if start != position or stop <= start:
            raise ManifestError(
                f"file {name!r}: segment [{start}, {stop}) does not start where the last ended ({position})"
            )
        position = stop
    if position != entry.size:
        raise ManifestError(f"file {name!r}: segments cover {position} of its {entry.size} bytes")
    end = 0
    for start, stop, label in ranges:
        if start < end or stop > entry.size:
            raise ManifestError(
                f"file {name!r}: data of {label} at bytes [{start}, {stop}) overlaps another dataset or "
                f"lies outside the file's {entry.size} bytes"
            )
        end = stop


def _get(data: dict[str, Any], key: str, where: str) -> Any:
    if key not in data:
        raise ManifestError(f"{where}: no {key!r}")
    return data[key]


def _obj(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ManifestError(f"{where}: expected an object, got {value!r:.80}")
    return value


def _str(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise ManifestError(f"{where}: expected a string, got {value!r:.80}")
    return value


def _count(value: Any, where: str) -> int:
    if type(value) is not int or value < 0:  # bool is not a count
        raise ManifestError(f"{where}: expected an integer >= 0, got {value!r:.80}")
    return value


def _counts(value: Any, where: str) -> tuple[int, ...]:
    if not isinstance(value, list):
        raise ManifestError(f"{where}: expected a list of integers, got {value!r:.80}")
    return tuple(_count(v, where) for v in value)


def _list(value: Any, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise ManifestError(f"{where}: expected a list, got {value!r:.80}")
    return value


def _tensor(data: Any, where: str) -> TensorEntry:
    data = _obj(data, where)
    shards = []
    for index, s in enumerate(_list(_get(data, "shards", where), f"{where} shards")):
        at = f"{where} shard {index}"
        s = _obj(s, at)
        shards.append(
            ShardEntry(
                _counts(_get(s, "offset", at), f"{at} offset"),
                _counts(_get(s, "shape", at), f"{at} shape"),
                _str(_get(s, "file", at), f"{at} file"),
                _str(_get(s, "dataset", at), f"{at} dataset"),
            )
        )
    return TensorEntry(
        _counts(_get(data, "global_shape", where), f"{where} global_shape"),
        _str(_get(data, "dtype", where), f"{where} dtype"),
        {
            _str(k, f"{where} partition"): _count(v, f"{where} partition")
            for k, v in _obj(_get(data, "partition", where), f"{where} partition").items()
        },
        shards,
    )


def _file(data: Any, where: str) -> FileEntry:
    data = _obj(data, where)
    segments = []
    for g in _list(_get(data, "segments", where), f"{where} segments"):
        if not isinstance(g, list) or len(g) != 3:
            raise ManifestError(f"{where} segments: expected [start, stop, digest], got {g!r:.80}")
        segments.append(
            (
                _count(g[0], f"{where} segment"),
                _count(g[1], f"{where} segment"),
                _str(g[2], f"{where} segment"),
            )
        )
    offsets = _obj(_get(data, "byte_offsets", where), f"{where} byte_offsets")
    return FileEntry(
        _count(_get(data, "size", where), f"{where} size"),
        segments,
        _str(_get(data, "digest", where), f"{where} digest"),
        {_str(k, f"{where} byte_offsets"): _count(v, f"{where} byte_offsets") for k, v in offsets.items()},
    )


def model_fingerprint(tensors: dict[str, TensorEntry]) -> str:
    rows = sorted((name, list(t.global_shape), t.dtype) for name, t in tensors.items())
    return hashlib.sha256(json.dumps(rows).encode()).hexdigest()


def shard_fingerprint(tensors: dict[str, TensorEntry]) -> str:
    rows = sorted(
        (name, list(s.offset), list(s.shape), s.file) for name, t in tensors.items() for s in t.shards
    )
    return hashlib.sha256(json.dumps(rows).encode()).hexdigest()


def read_manifest(directory: Path) -> Manifest:
    """Parse and check `directory/manifest.json` (`Manifest.from_json`); CorruptCheckpoint names the file
    and the rule broken on failure."""
    path = directory / MANIFEST
    try:
        data = json.loads(read_capped(path, MAX_MANIFEST_BYTES, follow_symlinks=False))
    except FileNotFoundError:
        raise CorruptCheckpoint(f"{path}: manifest missing") from None
    except OSError as err:  # a symlink, not a regular file, over MAX_MANIFEST_BYTES
        raise CorruptCheckpoint(f"{path}: manifest unreadable: {err.strerror or err}") from None
    except (ValueError, RecursionError) as err:  # torn, not UTF-8, nested beyond the parser's depth
        raise CorruptCheckpoint(f"{path}: manifest does not parse: {err!r}") from err
    try:
        return Manifest.from_json(data)
    except ValueError as err:  # ManifestError, ShardError: the message names the field and the rule
        raise CorruptCheckpoint(f"{path}: invalid manifest: {err}") from err
