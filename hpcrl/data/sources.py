"""Prompt datasets: the built-in tasks or rows from jsonl / parquet / an HF `datasets` directory.

Every source yields `Example(prompt, answer)` rows; a file row may be flat (`data.prompt_key`,
`data.answer_key`) or a chat row (`messages`, or a conversation under the prompt key: hpcrl.data.chat).
For file sources the last `heldout_size` rows are the held-out split (deterministic, no overlap with
train). Empty datasets, missing keys and malformed conversations are ConfigErrors that name the file,
the row and the key.
"""

from __future__ import annotations

import json
from pathlib import Path

from hpcrl.data.chat import MESSAGES_KEY, ChatRow, chat_row, parse_conversation, prompt_text
from hpcrl.data.config import DataConfig
from hpcrl.data.tasks import Example, get_task, make_splits
from hpcrl.errors import ConfigError, Problem, short


def read_jsonl(path: Path) -> list[dict]:
    rows = []
    with path.open() as fh:
        for line_no, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise ConfigError(Problem(f"line {line_no} is not JSON: {err}", file=str(path))) from None
    return rows


def _read_parquet(path: Path) -> list[dict]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ConfigError(
            Problem("parquet needs pyarrow: pip install pyarrow", file=str(path), key="data.source")
        ) from None
    return pq.read_table(path).to_pylist()


def _read_hf_disk(path: Path) -> list[dict]:
    try:
        import datasets
    except ImportError:
        raise ConfigError(
            Problem(
                "hf_disk needs the `datasets` package: pip install datasets",
                file=str(path),
                key="data.source",
            )
        ) from None
    ds = datasets.load_from_disk(str(path))
    if isinstance(ds, datasets.DatasetDict):
        if "train" not in ds:
            raise ConfigError(Problem(f"DatasetDict without a 'train' split: {list(ds)}", file=str(path)))
        ds = ds["train"]
    return ds.to_list()


READERS = {"jsonl": read_jsonl, "parquet": _read_parquet, "hf_disk": _read_hf_disk}


def read_rows(cfg: DataConfig) -> list[dict]:
    """The rows of a file source; a missing path, an unreadable file or an empty dataset is a ConfigError
    naming the file."""
    if cfg.path is None:
        raise ConfigError(Problem(f"source {cfg.source!r} needs a path", key="data.path"))
    path = Path(cfg.path)
    if not path.exists():
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
    return Example(str(row[cfg.prompt_key]), str(row.get(cfg.answer_key, "")))


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
