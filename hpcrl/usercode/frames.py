"""The wire between hpcrl.usercode.runner and its worker: length-prefixed JSON frames.

JSON, not pickle: the parent reads what user code returned, and JSON carries only data (numbers, text,
lists, dicts; NaN and inf as Python writes them). A value JSON cannot hold (a numpy float32, a set) is
converted where it is a number and otherwise refused with a message saying what it was.
"""

from __future__ import annotations

import json
import numbers
import struct
from typing import IO, Any

HEADER = struct.Struct(">Q")
MAX_FRAME_BYTES = 256 << 20
"""A reply larger than this is not a batch of scores (the reader refuses it)."""


class FrameError(ValueError):
    """A frame that is too large, cut short or not JSON."""


def encode(message: Any) -> bytes:
    try:
        body = json.dumps(message, default=_number).encode()
    except (TypeError, ValueError) as err:
        body = json.dumps(
            {"error": {"type": "TypeError", "message": f"not JSON data: {err}", "traceback": ""}}
        ).encode()
    return HEADER.pack(len(body)) + body


def _number(value: Any) -> Any:
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    raise TypeError(f"{type(value).__name__} is not JSON data")


def write_frame(stream: IO[bytes], message: Any) -> None:
    stream.write(encode(message))


def read_frame(stream: IO[bytes]) -> Any | None:
    """The next message, or None at the end of the stream (blocking)."""
    header = _read_exactly(stream, HEADER.size)
    if not header:
        return None
    (size,) = HEADER.unpack(header)
    if size > MAX_FRAME_BYTES:
        raise FrameError(f"a frame of {size:,} bytes (at most {MAX_FRAME_BYTES:,})")
    return decode(_read_exactly(stream, size))


def decode(body: bytes) -> Any:
    try:
        return json.loads(body)
    except ValueError as err:
        raise FrameError(f"not a JSON frame: {err}") from None


def _read_exactly(stream: IO[bytes], size: int) -> bytes:
    chunks, left = [], size
    while left:
        chunk = stream.read(left)
        if not chunk:
            if left == size:
                return b""
            raise FrameError("the frame was cut short")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)
