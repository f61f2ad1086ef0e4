"""Prompt datasets: the built-in tasks or rows from jsonl / parquet / an HF `datasets` directory.

Every source yields `Example(prompt, answer)` rows; a file row may be flat (`data.prompt_key`,
`data.answer_key`) or a chat row (`messages`, or a conversation under the prompt key: hpcrl.data.chat).
For file sources the last `heldout_size` rows are the held-out split (deterministic, no overlap with
train). Empty datasets, missing keys and malformed conversations are ConfigErrors that name the file,
the row and the key.
"""

from __future__ import annotations

import os
from pathlib import Path

from hpcrl.data.chat import MESSAGES_KEY, ChatRow, chat_row, parse_conversation, prompt_text
from hpcrl.data.config import DataConfig
from hpcrl.data.files import read_hf_disk, read_jsonl, read_parquet
from hpcrl.data.tasks import Example, get_task, make_splits
from hpcrl.errors import ConfigError, Problem, short

READERS = {"jsonl": read_jsonl, "parquet": read_parquet, "hf_disk": read_hf_disk}
"""The reader of each file source: hpcrl.data.files, where a data file is untrusted input."""


def read_rows(cfg: DataConfig) -> list[dict]:
    """The rows of a file source; a missing path, an unreadable file or an empty dataset is a ConfigError
    naming the file."""
    if cfg.path is None:
        raise ConfigError(Problem(f"source {cfg.source!r} needs a path", key="data.path"))
    path = Path(cfg.path)
    if not os.path.lexists(path):
        raise ConfigError(Problem("does not exist", file=str(path), key="data.path"))
    rows = READERS[cfg.source](path)
    if not rows:
        raise ConfigError(Problem("dataset is empty", file=str(path), key="data.path"))
    return rows


def read_examples(cfg: DataConfig) -> list[Example | ChatRow]:
    """All rows of a file source: flat rows as Examples (answer '' when the answer key is absent
    everywhere), chat rows as ChatRows (rendered by `load_splits`). Every malformed row is a ConfigError
    naming the file, the row and the key (the first ten of them at once)."""
    rows = read_rows(cfg)
    has_answers = any(cfg.answer_key in row for row in rows if isinstance(row, dict))
    examples: list[Example | ChatRow] = []
    problems: list[Problem] = []
    for i, row in enumerate(rows):
        try:
            examples.append(_example(row, i, cfg, has_answers))
        except ConfigError as err:
            problems += err.problems
    if problems:
        raise ConfigError(problems)  # it shows the first few and counts the rest
    return examples


def _example(row: object, i: int, cfg: DataConfig, has_answers: bool) -> Example | ChatRow:
    file = cfg.path
    if not isinstance(row, dict):
        raise ConfigError(Problem(f"row {i} is a {type(row).__name__}, not a mapping", file, "data.path"))
    conversation_key = cfg.prompt_key if isinstance(row.get(cfg.prompt_key), list) else MESSAGES_KEY
    if conversation_key in row:
        key = f"data.{conversation_key}"
        turns = parse_conversation(row[conversation_key], where=f"row {i}", file=file, key=key)
        if turns[0].role == "assistant":
            raise ConfigError(
                Problem(f"row {i}: the first turn is the assistant's (nothing to answer)", file, key)
            )
        return chat_row(
            turns, row.get(cfg.answer_key), where=f"row {i}", file=file, key=f"data.{cfg.answer_key}"
        )
    if cfg.prompt_key not in row:
        message = f"row {i} has neither {cfg.prompt_key!r} nor {MESSAGES_KEY!r} (keys: {short(sorted(map(str, row)))})"
        raise ConfigError(Problem(message, file=file, key="data.prompt_key"))
    if has_answers and cfg.answer_key not in row:
        raise ConfigError(Problem(f"row {i} has no {cfg.answer_key!r}", file=file, key="data.answer_key"))
    prompt = row[cfg.prompt_key]
    if not isinstance(prompt, str):
        message = f"row {i}: {cfg.prompt_key!r} must be text (or a conversation), got {short(prompt)}"
        raise ConfigError(Problem(message, file=file, key="data.prompt_key"))
    return Example(prompt, _answer_text(row.get(cfg.answer_key, ""), i, cfg))


def _answer_text(answer: object, i: int, cfg: DataConfig) -> str:
    """A flat row's answer: text, or a number written as its text (GSM8K-style `"answer": 42`); anything
    else (null, true, a list) is refused rather than turned into the text "None"."""
    if isinstance(answer, str):
        return answer
    if isinstance(answer, int | float) and not isinstance(answer, bool):
        return str(answer)
    message = f"row {i}: {cfg.answer_key!r} must be text or a number, got {short(answer)}"
    raise ConfigError(Problem(message, file=cfg.path, key="data.answer_key"))


def has_target(row: Example | ChatRow) -> bool:
    """Whether a row has tokens for SFT to learn: a flat row's answer, a chat row's assistant turn."""
    if row.conversation is None:
        return bool(row.answer)
    return any(m.role == "assistant" for m in row.conversation)


def target_problems(rows: list[Example | ChatRow], cfg: DataConfig) -> list[Problem]:
    """A Problem naming the first rows with nothing to learn (SFT), and how many there are."""
    missing = [i for i, row in enumerate(rows) if not has_target(row)]
    if not missing:
        return []
    shown = ", ".join(map(str, missing[:5])) + (f" and {len(missing) - 5:,} more" if len(missing) > 5 else "")
    message = (
        f"row {shown} has nothing to learn: SFT needs {cfg.answer_key!r} (or an assistant turn) on every row "
        "(rows of prompt, chosen, rejected are preference pairs: the dpo and rm stages read them)"
    )
    return [Problem(message, file=cfg.path, key="data.answer_key")]


def load_splits(cfg: DataConfig, tokenizer) -> tuple[list[Example], list[Example]]:
    """(train, heldout) for the configured source; chat rows rendered with `tokenizer`'s chat template."""
    if cfg.source == "builtin":
        task = get_task(cfg.task)
        return make_splits(task, cfg.num_digits, cfg.train_size, cfg.heldout_size, cfg.shuffle_seed)
    examples = [
        row if isinstance(row, Example) else render_chat_row(row, tokenizer, f"row {i}", cfg.path)
        for i, row in enumerate(read_examples(cfg))
    ]
    return split_heldout(examples, cfg)


def render_chat_row(row: ChatRow, tokenizer, where: str, file: str | None) -> Example:
    """The Example of a chat row: its prompt turns rendered with the generation prompt; a template error
    names the row and the file."""
    try:
        return Example(prompt_text(tokenizer, row.prompt), row.answer, row.conversation)
    except ConfigError as err:
        raise ConfigError([Problem(f"{where}: {p.message}", file, p.key) for p in err.problems]) from None


def split_heldout(rows: list, cfg: DataConfig) -> tuple[list, list]:
    """(train, held-out): the last `cfg.heldout_size` rows of a file are held out (at least one must
    remain for training; else a ConfigError naming the file and data.heldout_size)."""
    if cfg.heldout_size >= len(rows):
        raise ConfigError(
            Problem(
                f"{cfg.heldout_size} held-out rows leave no training rows of {len(rows)}",
                file=cfg.path,
                key="data.heldout_size",
            )
        )
    cut = len(rows) - cfg.heldout_size
    return rows[:cut], rows[cut:]
