"""A built-in task's splits written as a jsonl dataset, so the file path (reader, checks, tokenization,
held-out split) meets the same rows the built-in source generates: the train rows, then the held-out
rows last, where a file source holds them out (hpcrl.data.sources.split_heldout).

    python -m hpcrl.data.export long_tail --num_digits 16 --train_size 2048 --heldout_size 64 \\
        --out templates/data/long_tail.jsonl

Rows: {"prompt": ..., "answer": ...}. The file is written atomically (a reader never sees half of it).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from hpcrl.data.tasks import get_task, make_splits
from hpcrl.errors import ConfigError


def task_rows(task: str, num_digits: int, train_size: int, heldout_size: int, seed: int) -> list[dict]:
    """The built-in source's (train, held-out) examples as rows, held-out last."""
    train, heldout = make_splits(get_task(task), num_digits, train_size, heldout_size, seed)
    return [{"prompt": e.prompt, "answer": e.answer} for e in (*train, *heldout)]


def write_jsonl(rows: list[dict], out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.")
    try:
        os.fchmod(fd, 0o644)  # mkstemp's 0600 would keep the dataset from other users of the cluster
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.writelines(json.dumps(row) + "\n" for row in rows)
        os.replace(tmp, out)
    except BaseException:
        os.unlink(tmp)
        raise


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("task")
    parser.add_argument("--num_digits", type=int, default=3)
    parser.add_argument("--train_size", type=int, default=2048)
    parser.add_argument("--heldout_size", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0, help="the built-in source's data.shuffle_seed")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        rows = task_rows(args.task, args.num_digits, args.train_size, args.heldout_size, args.seed)
        write_jsonl(rows, args.out)
    except ConfigError as err:
        print(f"hpcrl.data.export: {err}", file=sys.stderr)
        return 2
    except OSError as err:
        print(f"hpcrl.data.export: cannot write {str(args.out)!r}: {err.strerror}", file=sys.stderr)
        return 2
    print(f"{len(rows)} rows -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
