"""Preference data for offline DPO: (prompt, chosen, rejected) triples from jsonl or a built-in toy task.

jsonl rows hold the prompt under `data.prompt_key` and the two responses under "chosen" and "rejected"
(the Anthropic-HH / UltraFeedback-binarised convention, flattened to text). The last `heldout_size` rows
are the held-out split. The built-in task pairs each prompt of a toy task (hpcrl.data.tasks) with its
exact answer (chosen) and a wrong answer of the same length (rejected), so a policy that learns the
preference also learns the task.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from hpcrl.data.config import DataConfig
from hpcrl.data.sources import read_jsonl, split_heldout
from hpcrl.data.tasks import Example, get_task, make_splits
from hpcrl.errors import ConfigError, Problem

RESPONSE_KEYS = ("chosen", "rejected")


@dataclass(frozen=True)
class PreferencePair:
    prompt: str
    chosen: str
    rejected: str


def wrong_answer(answer: str, rng: random.Random) -> str:
    """A string of digits as long as `answer` that differs from it (at least one position changed)."""
    while True:
        candidate = "".join(rng.choice("0123456789") for _ in answer)
        if candidate != answer:
            return candidate


def toy_pairs(examples: list[Example], seed: int) -> list[PreferencePair]:
    rng = random.Random(seed)
    return [PreferencePair(e.prompt, e.answer, wrong_answer(e.answer, rng)) for e in examples]


def read_preference_jsonl(path: Path, prompt_key: str = "prompt") -> list[PreferencePair]:
    """All rows of a preference jsonl; a missing key or an empty file is a ConfigError naming it."""
    if not path.exists():
        raise ConfigError(Problem("does not exist", file=str(path), key="data.path"))
    rows = read_jsonl(path)
    if not rows:
        raise ConfigError(Problem("dataset is empty", file=str(path), key="data.path"))
    problems = []
    pairs = []
    for i, row in enumerate(rows):
        missing = [k for k in (prompt_key, *RESPONSE_KEYS) if k not in row]
        if missing:
            problems.append(
                Problem(f"row {i} has no {missing} (keys: {sorted(row)})", file=str(path), key="data.path")
            )
            continue
        pairs.append(PreferencePair(str(row[prompt_key]), str(row["chosen"]), str(row["rejected"])))
    if problems:
        raise ConfigError(problems[:10])
    return pairs


def load_preference_splits(cfg: DataConfig) -> tuple[list[PreferencePair], list[PreferencePair]]:
    """(train, heldout) preference pairs for `data.source` builtin or jsonl."""
    if cfg.source == "builtin":
        task = get_task(cfg.task)
        train, heldout = make_splits(task, cfg.num_digits, cfg.train_size, cfg.heldout_size, cfg.shuffle_seed)
        return toy_pairs(train, cfg.shuffle_seed), toy_pairs(heldout, cfg.shuffle_seed + 1)
    if cfg.source != "jsonl":
        raise ConfigError(
            Problem(
                f"DPO reads preference pairs from builtin or jsonl, not {cfg.source!r}", key="data.source"
            )
        )
    if cfg.path is None:
        raise ConfigError(Problem("source 'jsonl' needs a path", key="data.path"))
    return split_heldout(read_preference_jsonl(Path(cfg.path), cfg.prompt_key), cfg)
