"""The data cursor a fresh sampler reaches (shared by the stage checkpointing tests)."""

from __future__ import annotations

from hpcrl.data.cursor import DataCursor, PromptSampler


def cursor_after(steps: int, *, seed: int, batch: int, rows: int = 10) -> dict:
    """The cursor of a sampler over `rows` rows with shuffle `seed` after `steps` batches of `batch`."""
    sampler = PromptSampler(list(range(rows)), DataCursor(seed=seed))
    for _ in range(steps):
        sampler.next_batch(batch)
    return sampler.cursor.to_dict()
