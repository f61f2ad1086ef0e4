"""Preference data for the offline preference stage (stage: dpo): pairs for DPO/IPO, unpaired rows for KTO.

Row shapes of a jsonl file (TRL's preference and unpaired-preference formats, standard or conversational):
  paired:    prompt, chosen, rejected        (the Anthropic-HH / UltraFeedback-binarised convention)
  unpaired:  prompt, completion, label       (label true = desirable; KTO only)
`prompt` is text or a conversation (rendered with the chat template and the generation prompt,
hpcrl.data.chat); each response is text or a list holding one assistant message. The last `heldout_size`
rows are the held-out split. KTO reads paired rows as two unpaired ones (chosen desirable, rejected not), as
TRL does, so one key (`dpo.loss_type`) switches DPO <-> KTO on the same data.

The built-in task pairs each prompt of a toy task (hpcrl.data.tasks) with its exact answer (chosen) and a
wrong answer of the same length (rejected), so a policy that learns the preference also learns the task.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass
from pathlib import Path

from hpcrl.data.chat import parse_conversation, prompt_text, response_text
from hpcrl.data.config import DataConfig
from hpcrl.data.files import read_jsonl
from hpcrl.data.sources import split_heldout
from hpcrl.data.tasks import ALPHABET, Example, get_task, make_splits
from hpcrl.errors import ConfigError, Problem, short

RESPONSE_KEYS = ("chosen", "rejected")
UNPAIRED_KEYS = ("completion", "label")


@dataclass(frozen=True)
class PreferencePair:
    prompt: str
    chosen: str
    rejected: str


@dataclass(frozen=True)
class UnpairedRow:
    prompt: str
    completion: str
    desirable: bool


PreferenceRow = PreferencePair | UnpairedRow


def unpair(rows: list[PreferenceRow]) -> list[UnpairedRow]:
    """Every row as unpaired rows: a pair is its chosen (desirable) then its rejected (undesirable)."""
    out: list[UnpairedRow] = []
    for row in rows:
        if isinstance(row, UnpairedRow):
            out.append(row)
        else:
            out += [UnpairedRow(row.prompt, row.chosen, True), UnpairedRow(row.prompt, row.rejected, False)]
    return out


def wrong_answer(answer: str, rng: random.Random) -> str:
    """A string of digits as long as `answer` that differs from it (at least one position changed)."""
    while True:
        candidate = "".join(rng.choice("0123456789") for _ in answer)
        if candidate != answer:
            return candidate


def wrong_length_answer(answer: str, rng: random.Random) -> str:
    """Characters of the tasks' alphabet, of a length other than `answer`'s, from empty to two longer (a
    response that stops too soon, runs on, or writes what no answer holds)."""
    length = rng.choice([n for n in range(len(answer) + 3) if n != len(answer)])
    return "".join(rng.choice(ALPHABET) for _ in range(length))


def near_miss(answer: str, rng: random.Random) -> str:
    """`answer` with one position changed."""
    i = rng.randrange(len(answer))
    return answer[:i] + rng.choice([d for d in "0123456789" if d != answer[i]]) + answer[i + 1 :]


def toy_pairs(examples: list[Example], seed: int, *, lengths: bool = False) -> list[PreferencePair]:
    """Each example's answer (chosen) against a wrong one (rejected) of the same length. With `lengths`
    (a reward model's data) the rejected responses cycle through three kinds: random of the same length,
    a wrong length (empty to two longer) and a near miss (one digit changed); a reward model that only
    ever compared random equal-length strings scores an empty or a degenerate response at random, and a
    policy trained on it learns exactly those."""
    rng = random.Random(seed)
    kinds = (wrong_answer, wrong_length_answer, near_miss) if lengths else (wrong_answer,)
    pairs = []
    for i, e in enumerate(examples):
        make = kinds[i % len(kinds)] if e.answer else wrong_length_answer
        pairs.append(PreferencePair(e.prompt, e.answer, make(e.answer, rng)))
    return pairs


def read_preference_jsonl(path: Path, prompt_key: str = "prompt", tokenizer=None) -> list[PreferenceRow]:
    """All rows of a preference jsonl, paired or unpaired. A missing key, a malformed conversation or an
    empty file is a ConfigError naming the file, the row and the key (the first few at once). Without a
    `tokenizer` conversations are checked but not rendered (what `expand` does)."""
    if not os.path.lexists(path):
        raise ConfigError(Problem("does not exist", file=str(path), key="data.path"))
    rows = read_jsonl(path)
    if not rows:
        raise ConfigError(Problem("dataset is empty", file=str(path), key="data.path"))
    problems: list[Problem] = []
    out: list[PreferenceRow] = []
    for i, row in enumerate(rows):
        try:
            out.append(_preference_row(row, i, str(path), prompt_key, tokenizer))
        except ConfigError as err:
            problems += err.problems
    if problems:
        raise ConfigError(problems)
    return out


def _preference_row(row: object, i: int, file: str, prompt_key: str, tokenizer) -> PreferenceRow:
    where = f"row {i}"
    if not isinstance(row, dict):
        raise ConfigError(Problem(f"{where} is a {type(row).__name__}, not a mapping", file, "data.path"))
    unpaired = "completion" in row
    keys = UNPAIRED_KEYS if unpaired else RESPONSE_KEYS
    missing = [k for k in (prompt_key, *keys) if k not in row]
    if missing:
        message = f"{where} has no {missing} (keys: {short(sorted(map(str, row)))})"
        raise ConfigError(Problem(message, file, "data.path"))
    prompt = _prompt(row[prompt_key], where, file, f"data.{prompt_key}", tokenizer)
    if not unpaired:
        chosen, rejected = (response_text(row[k], where=where, file=file, key=f"data.{k}") for k in keys)
        return PreferencePair(prompt, chosen, rejected)
    if not isinstance(row["label"], bool):
        message = f"{where}: label must be true or false, got {short(row['label'])}"
        raise ConfigError(Problem(message, file, "data.label"))
    return UnpairedRow(
        prompt, response_text(row["completion"], where=where, file=file, key="data.completion"), row["label"]
    )


def _prompt(value: object, where: str, file: str, key: str, tokenizer) -> str:
    if isinstance(value, str):
        return value
    turns = parse_conversation(value, where=where, file=file, key=key)
    if tokenizer is None:
        return ""  # checked, not rendered
    try:
        return prompt_text(tokenizer, turns)
    except ConfigError as err:
        raise ConfigError([Problem(f"{where}: {p.message}", file, p.key) for p in err.problems]) from None


def load_preference_splits(
    cfg: DataConfig, tokenizer, *, lengths: bool = False
) -> tuple[list[PreferenceRow], list[PreferenceRow]]:
    """(train, heldout) preference rows for `data.source` builtin or jsonl (`lengths`: the built-in
    task's rejected responses vary in length too, see toy_pairs)."""
    if cfg.source == "builtin":
        task = get_task(cfg.task)
        train, heldout = make_splits(task, cfg.num_digits, cfg.train_size, cfg.heldout_size, cfg.shuffle_seed)
        seed = cfg.shuffle_seed
        return toy_pairs(train, seed, lengths=lengths), toy_pairs(heldout, seed + 1, lengths=lengths)
    if cfg.source != "jsonl":
        raise ConfigError(
            Problem(
                f"the preference stage reads rows from builtin or jsonl, not {cfg.source!r}",
                key="data.source",
            )
        )
    if cfg.path is None:
        raise ConfigError(Problem("source 'jsonl' needs a path", key="data.path"))
    return split_heldout(read_preference_jsonl(Path(cfg.path), cfg.prompt_key, tokenizer), cfg)
