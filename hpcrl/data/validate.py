"""The data rules checked at `expand` / `submit`: an existing data file's rows, read once and checked
without a tokenizer (keys, conversations, labels: hpcrl.data.sources, hpcrl.data.preference), and whether
the model's tokenizer can render its chat rows.

A path that does not exist here is left to the ranks (it may live on the cluster's file system only, as a
GPU recipe's /data/... does); its rows are checked when the job reads them, by the same functions.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

from hpcrl.data.config import DataConfig
from hpcrl.data.files import read_jsonl
from hpcrl.data.preference import UnpairedRow, read_preference_jsonl
from hpcrl.data.sources import read_examples, target_problems
from hpcrl.data.tasks import Example, builtin_task_problems
from hpcrl.data.tokenizer import CHAT_VOCAB_SIZE
from hpcrl.errors import ConfigError, Problem


@dataclass(frozen=True)
class PreferenceReader:
    """A stage that reads the data file as preference rows."""

    name: str
    """What reads them, for messages ("dpo.loss_type ipo", "the rm stage")."""
    key: str
    """The key a problem with unpaired rows names (what chose this reader)."""
    unpaired: bool = False
    """It takes unpaired (completion, label) rows too (KTO); else every row must be a pair."""


def data_file_problems(
    data: DataConfig,
    *,
    preference: PreferenceReader | None,
    hf_path: str | None,
    vocab_size: int | None,
    needs_answers: bool = False,
) -> list[Problem]:
    """Problems of `data`'s file (none for built-in tasks or a path absent here). `preference`: read it
    as preference rows for that reader rather than prompt / answer / chat rows; `needs_answers`: every
    row must have something to learn (SFT)."""
    if data.source == "builtin":
        return builtin_task_problems(data.task, data.max_prompt_length)
    if not data.path:
        return []
    path = Path(data.path)
    try:
        stat = path.stat()
    except OSError:
        return []
    problems, chat = _checked(data.source, str(path), stat.st_size, stat.st_mtime_ns, data.prompt_key,
                              data.answer_key, preference, needs_answers)  # fmt: skip
    if chat and hf_path is None and vocab_size is not None and vocab_size < CHAT_VOCAB_SIZE:
        message = (
            f"chat rows need the tiny tokenizer's role tokens: vocab_size >= {CHAT_VOCAB_SIZE}, "
            f"got {vocab_size}"
        )
        problems = [*problems, Problem(message, key="model.vocab_size")]
    return list(problems)


@functools.lru_cache(maxsize=16)
def _checked(
    source, path, size, mtime_ns, prompt_key, answer_key, preference, needs_answers
) -> tuple[tuple[Problem, ...], bool]:
    """(problems, whether any row is a chat row); cached by the file's size and mtime, so a sweep's
    elements read a dataset once."""
    data = DataConfig(source=source, path=path, prompt_key=prompt_key, answer_key=answer_key)
    try:
        if not preference:
            rows = read_examples(data)
            problems = target_problems(rows, data) if needs_answers else []
            return tuple(problems), any(not isinstance(r, Example) for r in rows)
        if source != "jsonl":
            message = f"the preference stage reads rows from builtin or jsonl, not {source!r}"
            return (Problem(message, key="data.source"),), False
        rows = read_preference_jsonl(Path(path), prompt_key)
        lone = [i for i, row in enumerate(rows) if isinstance(row, UnpairedRow)]
        if lone and not preference.unpaired:
            message = f"row {lone[0]} is unpaired (completion, label): {preference.name} needs pairs"
            return (Problem(message, path, preference.key),), False
        return (), any(isinstance(v, list) for row in read_jsonl(Path(path)) for v in row.values())
    except ConfigError as err:
        return tuple(err.problems), False
