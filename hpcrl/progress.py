"""Progress of the launcher's long passes (checking or writing up to 100,000 configs): a rich progress bar
on stderr that appears only once the command has run DELAY_S seconds.

Why delayed: most commands end well under a second, and a bar that flashes up and vanishes is noise; a
100,000-element sweep takes tens of seconds, and that long a silence reads as a hang. Why stderr, and only
on a terminal: stdout carries the command's output (tables, JSON lines, scripts), which is often piped.

A pass is tracked by wrapping its iterable: `for x in track(items, total, "checking")`. Code that may run
without a terminal (the library, tests) takes a `Track` and defaults to `untracked`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress

T = TypeVar("T")
Track = Callable[[Iterable[T], int, str], Iterator[T]]
"""Wraps a pass's iterable: (items, how many, what the pass does) -> the same items."""

DELAY_S = 2.0
"""The bar appears once the command has run this long (a few seconds: a human starts to wonder)."""
CHECK_EVERY = 256
"""Items between looks at the clock and updates of the bar (a few ms of work; rich's update takes a lock)."""


def untracked(items: Iterable[T], total: int, label: str) -> Iterator[T]:
    """No progress shown: the default of every tracked pass."""
    return iter(items)


class DelayedProgress:
    """A `Track` that shows one bar per pass (label, done/total, elapsed, remaining) on stderr, from the
    moment the command has run `delay_s` seconds; a context manager that removes the bars at the end."""

    def __init__(self, delay_s: float = DELAY_S, console: Console | None = None) -> None:
        self._delay_s = delay_s
        self._console = console
        self._started = time.monotonic()
        self._progress: Progress | None = None
        self._enabled: bool | None = None

    def __call__(self, items: Iterable[T], total: int, label: str) -> Iterator[T]:
        task: Any = None
        done = 0
        for done, item in enumerate(items, 1):
            yield item
            if done % CHECK_EVERY == 0:
                task = self._show(task, label, total, done)
        if task is not None:
            self._progress.update(task, completed=done)

    def _show(self, task: Any, label: str, total: int, done: int) -> Any:
        """Start the bar once the delay has passed; then move it. Returns the pass's task (or None)."""
        if task is None:
            if time.monotonic() - self._started < self._delay_s or not self._start():
                return None
            task = self._progress.add_task(label, total=total)
        self._progress.update(task, completed=done)
        return task

    def _start(self) -> bool:
        """Make the rich bar on first use (rich is imported only then); False when stderr is no terminal."""
        if self._enabled is None:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            console = self._console or Console(stderr=True)
            self._enabled = console.is_terminal
            if self._enabled:
                self._progress = Progress(
                    TextColumn("{task.description}"),
                    BarColumn(),
                    MofNCompleteColumn(),
                    TimeElapsedColumn(),
                    TimeRemainingColumn(),
                    console=console,
                    transient=True,
                )
                self._progress.start()
        return self._enabled

    def __enter__(self) -> DelayedProgress:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._progress is not None:
            self._progress.stop()
