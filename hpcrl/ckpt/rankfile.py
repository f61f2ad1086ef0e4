"""One rank's HDF5 file: its owned shards as contiguous datasets.

Writing: h5py creates every dataset with contiguous layout, space allocated at creation and no fill
value, the file is closed, then the raw bytes go to each dataset's file offset with `os.pwrite`.
The result is an ordinary HDF5 file (h5py reads it), but the bulk write runs outside the HDF5 library,
so a background save thread does not hold the GIL for the duration of a tensor write (h5py does) and
training keeps running; and each dataset's byte range is known, so block checksums map to tensors.
"""

from __future__ import annotations

import bisect
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np
from h5py import h5d, h5p, h5s, h5t

from hpcrl.ckpt.integrity import HASH_WORKERS, fsync_file, hash_segments, plan_segments

_WRITE_CHUNK = 64 << 20


@dataclass(frozen=True)
class FileRecord:
    """What the manifest keeps about one written file."""

    file: str
    size: int
    segments: list[tuple[int, int, str]]
    """(start, stop, digest) covering the file (hpcrl.ckpt.integrity.segment_digest)."""
    byte_offsets: dict[str, int]
    """Dataset name -> byte offset of its data in the file (absent for empty datasets)."""


def write_rank_file(
    path: Path, arrays: dict[str, np.ndarray], attrs: dict[str, str], background: bool = False
) -> FileRecord:
    """Write `arrays` (dataset name -> C-contiguous little-endian array) durably and checksum the file.
    `background` (an async save): keep one thread busy at a time, leaving the other cores to training."""
    offsets: dict[str, int] = {}
    with h5py.File(path, "w", libver="latest") as fh:
        for key, value in attrs.items():
            fh.attrs[key] = value
        for name, array in arrays.items():
            offset = _create_contiguous(fh, name, array)
            if offset is not None:
                offsets[name] = offset
    fd = os.open(path, os.O_WRONLY)
    try:
        for name in sorted(offsets, key=offsets.__getitem__):
            _pwrite_all(fd, memoryview(arrays[name]).cast("B"), offsets[name])
    finally:
        os.close(fd)
    size = os.path.getsize(path)
    segments = plan_segments(size, [(offsets[n], offsets[n] + arrays[n].nbytes) for n in offsets])
    # checksums: the datasets from the buffers just written (the same bytes pwrite took; one pass over
    # memory fewer), the HDF5 structure read back from the file
    in_memory = _lookup(arrays, offsets)
    if background:  # measured: checksums overlapping the fsync's writeback slow training down 2-4x more
        digests = hash_segments(path, segments, workers=1, in_memory=in_memory)
        fsync_file(path)
    else:  # a sync save: checksum on every core while fsync waits for the disk
        with ThreadPoolExecutor(1) as pool:
            synced = pool.submit(fsync_file, path)
            digests = hash_segments(path, segments, workers=HASH_WORKERS, in_memory=in_memory)
            synced.result()
    return FileRecord(
        path.name, size, [(lo, hi, d) for (lo, hi), d in zip(segments, digests, strict=True)], offsets
    )


def _lookup(arrays: dict[str, np.ndarray], offsets: dict[str, int]):
    """(start, stop) -> the bytes of that file range when it lies inside one dataset, else None."""
    ranges = sorted(((offsets[n], memoryview(arrays[n]).cast("B")) for n in offsets), key=lambda r: r[0])
    starts = [start for start, _ in ranges]

    def bytes_of(start: int, stop: int) -> memoryview | None:
        index = bisect.bisect_right(starts, start) - 1
        if index < 0:
            return None
        base, data = ranges[index]
        return data[start - base : stop - base] if stop - base <= len(data) else None

    return bytes_of


def _create_contiguous(fh: h5py.File, name: str, array: np.ndarray) -> int | None:
    dcpl = h5p.create(h5p.DATASET_CREATE)
    dcpl.set_layout(h5d.CONTIGUOUS)
    dcpl.set_alloc_time(h5d.ALLOC_TIME_EARLY)
    dcpl.set_fill_time(h5d.FILL_TIME_NEVER)
    space = h5s.create(h5s.SCALAR) if array.ndim == 0 else h5s.create_simple(array.shape)
    dataset = h5d.create(fh.id, name.encode(), h5t.py_create(array.dtype), space, dcpl=dcpl)
    return dataset.get_offset() if array.nbytes else None


def _pwrite_all(fd: int, data: memoryview, offset: int) -> None:
    written = 0
    while written < len(data):
        chunk = data[written : written + _WRITE_CHUNK]
        n = os.pwrite(fd, chunk, offset + written)
        if n <= 0:
            raise OSError(f"pwrite wrote {n} bytes")
        written += n
