"""Wait on a condition, never on a fixed sleep: poll `probe` until it returns a truthy value."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(probe: Callable[[], T], timeout_s: float, what: str, poll_s: float = 0.2) -> T:
    """`probe()`'s first truthy result; AssertionError naming `what` and the last result after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = probe()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}; last: {result!r}")
        time.sleep(poll_s)
