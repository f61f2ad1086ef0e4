"""Config owned by the data side: where prompts come from."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from hpcrl.config.ranges import Range, Seed


@dataclass(kw_only=True)
class DataConfig:
    """Prompt dataset: a built-in toy task or a file."""

    source: Literal["builtin", "jsonl", "parquet", "hf_disk"] = "builtin"
    """builtin = a generated task (see `task`); else read `path`."""
    task: str = "copy_digits"
    """Built-in task name (copy_digits, reverse_digits, add_digits, add3_digits (three operands: the
    multi-step tool task's), even_digits, zero_digits, reverse_exact,
    long_tail: hpcrl.data.tasks)."""
    path: str | None = None
    """Dataset file or directory for non-builtin sources."""
    prompt_key: str = "prompt"
    """Field holding the prompt text."""
    answer_key: str = "answer"
    """Field holding the reference answer (for rule-based rewards)."""
    num_digits: Annotated[int, Range(ge=1, le=1 << 10)] = 3
    """Built-in tasks: digits per prompt (long_tail: the mean response length)."""
    train_size: Annotated[int, Range(ge=1, le=1 << 31)] = 2048
    """Built-in tasks: training prompts generated."""
    heldout_size: Annotated[int, Range(ge=0, le=1 << 31)] = 64
    """Built-in tasks: held-out prompts for evaluation."""
    max_prompt_length: Annotated[int, Range(ge=1, le=1 << 24)] = 32
    """Prompts longer than this (in tokens) are an error, not silently cut."""
    shuffle_seed: Seed = 0
    """Seed of the epoch shuffles (part of the resumable data cursor)."""
