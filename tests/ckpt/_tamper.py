"""Ways to damage or forge a saved checkpoint, for the trust-boundary tests.

A forger who rewrites a file also `reseal`s the manifest: file sizes, byte offsets, checksum segments
and fingerprints made consistent again, so only the loader's own rules (hpcrl.ckpt.trust) can catch it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import h5py
import numpy as np
from h5py import h5d, h5p, h5s, h5t

from hpcrl.ckpt.integrity import file_digest, hash_segments, plan_segments
from hpcrl.ckpt.manifest import DIGEST_KEY, manifest_digest
from hpcrl.ckpt.shards import itemsize


def read_json(step: Path) -> dict[str, Any]:
    return json.loads((step / "manifest.json").read_bytes())


def write_json(step: Path, data: Any) -> None:
    """Write a (forged) manifest; its own digest is recomputed, as a forger would (it guards against
    damage, not forgery), so that the rules under test are the ones that refuse it."""
    if isinstance(data, dict) and DIGEST_KEY in data:
        data[DIGEST_KEY] = manifest_digest(data)
    (step / "manifest.json").write_text(json.dumps(data))


def dataset_of(data: dict[str, Any], tensor: str, shard: int = 0) -> tuple[str, str]:
    """(file, dataset) of one shard of `tensor` in the manifest JSON."""
    entry = data["tensors"][tensor]["shards"][shard]
    return entry["file"], entry["dataset"]


def reseal_fingerprints(data: dict[str, Any]) -> None:
    """Fingerprints recomputed from the (possibly mutated) tensors, as hpcrl.ckpt.manifest does; left as
    they are when the tensors no longer have the shape needed to compute them."""
    try:
        tensors = data["tensors"]
        models = sorted((n, list(t["global_shape"]), t["dtype"]) for n, t in tensors.items())
        shards = sorted(
            (n, list(s["offset"]), list(s["shape"]), s["file"])
            for n, t in tensors.items()
            for s in t["shards"]
        )
        data["model_fingerprint"] = hashlib.sha256(json.dumps(models).encode()).hexdigest()
        data["shard_fingerprint"] = hashlib.sha256(json.dumps(shards).encode()).hexdigest()
    except (KeyError, TypeError, AttributeError):
        pass


def reseal(step: Path) -> None:
    """Make the manifest agree with the files on disk again: every file's size, its datasets' byte offsets
    (a claim is dropped when the dataset is no longer plain contiguous data big enough for it), segments
    and digests; then the fingerprints."""
    data = read_json(step)
    nbytes = _dataset_bytes(data)
    for name, entry in data["files"].items():
        path = step / name
        claims = _actual_offsets(path, entry["byte_offsets"], nbytes, name)
        size = path.stat().st_size
        claims = {ds: o for ds, o in claims.items() if o + nbytes.get((name, ds), 0) <= size}
        segments = plan_segments(size, [(o, o + nbytes.get((name, ds), 0)) for ds, o in claims.items()])
        digests = hash_segments(path, segments)
        entry.update(
            size=size,
            byte_offsets=claims,
            segments=[[lo, hi, d] for (lo, hi), d in zip(segments, digests, strict=True)],
            digest=file_digest(digests),
        )
    reseal_fingerprints(data)
    write_json(step, data)


def _dataset_bytes(data: dict[str, Any]) -> dict[tuple[str, str], int]:
    out = {}
    for tensor in data["tensors"].values():
        for s in tensor["shards"]:
            out[(s["file"], s["dataset"])] = int(np.prod(s["shape"])) * itemsize(tensor["dtype"])
    return out


def _actual_offsets(path: Path, claims: dict[str, int], nbytes: dict, file: str) -> dict[str, int]:
    try:
        fh = h5py.File(path, "r")
    except OSError:  # not HDF5 any more: keep the claims
        return dict(claims)
    out = {}
    with fh:
        for dataset in claims:
            link = fh.get(dataset, getlink=True)
            if not isinstance(link, h5py.HardLink) or not isinstance(fh[dataset], h5py.Dataset):
                continue
            offset = fh[dataset].id.get_offset()
            if offset is not None and fh[dataset].id.get_storage_size() >= nbytes.get((file, dataset), 0):
                out[dataset] = offset
    return out


def replace_dataset(path: Path, name: str, make) -> None:
    """Delete dataset `name` and let `make(fh, name, data)` put something else under that name."""
    with h5py.File(path, "a") as fh:
        data = fh[name][()]
        del fh[name]
        make(fh, name, data)


def outside_copy(path: Path, outside: Path, name: str, data: np.ndarray) -> None:
    """An HDF5 file at `outside` holding `data` as dataset `name`."""
    with h5py.File(outside, "w") as fh:
        fh.create_dataset(name, data=data)


def flip_byte(path: Path, offset: int) -> None:
    raw = bytearray(path.read_bytes())
    raw[offset] ^= 0x40
    path.write_bytes(bytes(raw))


Make = Callable[[h5py.File, str, np.ndarray], None]
"""make(fh, name, data): put something under dataset `name` (deleted) that was `data`."""


def forgeries(outside: Path) -> dict[str, Make]:
    """What a forged file may hold under a dataset's name instead of it (files it needs go in `outside`).
    Only "chunked" is allowed (the same values, chunked); every other one must be refused."""

    def external_link(fh, name, data):
        outside_copy(Path(fh.filename), outside / "outside.h5", name, data + 1)
        fh[name] = h5py.ExternalLink(str(outside / "outside.h5"), name)

    def external_storage(fh, name, data):
        raw = outside / "passwd"
        raw.write_bytes(bytes(range(256)) * (data.nbytes // 256 + 1))
        fh.create_dataset(name, shape=data.shape, dtype=data.dtype, external=[(str(raw), 0, data.nbytes)])

    def virtual(fh, name, data):
        layout = h5py.VirtualLayout(shape=data.shape, dtype=data.dtype)
        layout[...] = h5py.VirtualSource(str(outside / "gone.h5"), name, shape=data.shape)
        fh.create_virtual_dataset(name, layout, fillvalue=0)

    def compact(fh, name, data):
        dcpl = h5p.create(h5p.DATASET_CREATE)
        dcpl.set_layout(h5d.COMPACT)
        space = h5s.create(h5s.SCALAR) if data.ndim == 0 else h5s.create_simple(data.shape)
        h5d.create(fh.id, name.encode(), h5t.py_create(data.dtype), space, dcpl=dcpl)
        fh[name][...] = data

    def chunked(fh, name, data, **kw):
        fh.create_dataset(name, data=data, chunks=tuple(max(1, n // 2) for n in data.shape) or None, **kw)

    def as_dtype(dtype):
        return lambda fh, name, data: fh.create_dataset(name, data=data.astype(dtype))

    def as_data(change):
        return lambda fh, name, data: fh.create_dataset(name, data=np.ascontiguousarray(change(data)))

    return {
        "external_link": external_link,
        "external_storage": external_storage,
        "virtual": virtual,
        "compact": compact,
        "chunked": lambda fh, name, data: chunked(fh, name, data) if data.ndim else compact(fh, name, data),
        "gzip": lambda fh, name, data: chunked(fh, name, data, compression="gzip") if data.ndim else None,
        "float64": as_dtype("<f8"),
        "big_endian": lambda fh, name, data: as_dtype(data.dtype.newbyteorder(">"))(fh, name, data),
        "int16": as_dtype("<i2"),
        "one_row_more": as_data(lambda d: np.concatenate([d, d[:1]]) if d.ndim else d[None]),
        "one_row_less": as_data(lambda d: d[:-1] if d.ndim else d[None]),
        "transposed": as_data(
            lambda d: d.swapaxes(0, -1) if d.ndim > 1 and len(set(d.shape)) > 1 else d.ravel()[None]
        ),
        "flat": as_data(lambda d: d.reshape(-1, 1)),
        "missing": lambda fh, name, data: None,
        "group": lambda fh, name, data: fh.create_group(name),
    }
