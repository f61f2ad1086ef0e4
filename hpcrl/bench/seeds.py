"""`--seeds` of the many-seed benchmarks (rl_main, tool_task, pipeline_demo): "0-9" or "0,3,7"."""

from __future__ import annotations

import argparse

MAX_SEEDS = 1000
"""More seeds than any benchmark here runs: a typo like "0-99999" is refused, not started."""


def seed_list(text: str) -> list[int]:
    """The seeds `text` names: an inclusive range "first-last" or a comma list of distinct seeds; an
    argparse type (argparse.ArgumentTypeError saying what is wrong, so the command exits 2)."""
    try:
        if "-" in text:
            first, last = (int(x) for x in text.split("-", 1))
            seeds = list(range(first, last + 1))
        else:
            seeds = [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f'{text[:40]!r}: seeds are "first-last" or "a,b,c" (integers >= 0)'
        ) from None
    if not seeds or min(seeds) < 0 or len(set(seeds)) != len(seeds) or len(seeds) > MAX_SEEDS:
        raise argparse.ArgumentTypeError(
            f"{text[:40]!r}: 1 to {MAX_SEEDS} distinct seeds >= 0 (a range's first must not exceed its last)"
        )
    return seeds
