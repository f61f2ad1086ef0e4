"""Prompt datasets: the built-in tasks or rows from jsonl / parquet / an HF `datasets` directory.

Every source yields `Example(prompt, answer)` rows. For file sources the last `heldout_size` rows are the
held-out split (deterministic, no overlap with train). Empty datasets and missing keys are ConfigErrors
that name the file and the key.
"""

from __future__ import annotations

import json
from pathlib import Path

from hpcrl.data.config import DataConfig
from hpcrl.data.tasks import Example, get_task, make_splits
from hpcrl.errors import ConfigError, Problem


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


def read_examples(cfg: DataConfig) -> list[Example]:
    """All rows of a file source as Examples (answer '' when the answer key is absent everywhere)."""
    if cfg.path is None:
        raise ConfigError(Problem(f"source {cfg.source!r} needs a path", key="data.path"))
    path = Path(cfg.path)
    if not path.exists():
        raise ConfigError(Problem("does not exist", file=str(path), key="data.path"))
    rows = READERS[cfg.source](path)
    if not rows:
        raise ConfigError(Problem("dataset is empty", file=str(path), key="data.path"))
    has_answers = any(cfg.answer_key in row for row in rows)
    examples = []
    for i, row in enumerate(rows):
        if cfg.prompt_key not in row:
            raise ConfigError(
                Problem(
                    f"row {i} has no {cfg.prompt_key!r} (keys: {sorted(row)})",
                    file=str(path),
                    key="data.prompt_key",
                )
            )
        if has_answers and cfg.answer_key not in row:
            raise ConfigError(
                Problem(f"row {i} has no {cfg.answer_key!r}", file=str(path), key="data.answer_key")
            )
        examples.append(Example(str(row[cfg.prompt_key]), str(row.get(cfg.answer_key, ""))))
    return examples


def load_splits(cfg: DataConfig) -> tuple[list[Example], list[Example]]:
    """(train, heldout) for the configured source."""
    if cfg.source == "builtin":
        task = get_task(cfg.task)
        return make_splits(task, cfg.num_digits, cfg.train_size, cfg.heldout_size, cfg.shuffle_seed)
    return split_heldout(read_examples(cfg), cfg)


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
