"""hpcrl.data.export: a built-in task written as jsonl reads back through the file path as the same
splits, and templates/data/long_tail.jsonl is what the export writes today (it cannot drift)."""

from __future__ import annotations

import stat
from pathlib import Path

from hpcrl.data.config import DataConfig
from hpcrl.data.export import main
from hpcrl.data.sources import load_splits
from hpcrl.data.tokenizer import model_tokenizer

REPO = Path(__file__).resolve().parents[2]
COMMITTED = REPO / "templates" / "data" / "long_tail.jsonl"
ARGS = ["long_tail", "--num_digits", "16", "--train_size", "2048", "--heldout_size", "64"]


def test_the_file_path_reads_the_builtin_splits(tmp_path):
    out = tmp_path / "long_tail.jsonl"
    assert main([*ARGS, "--out", str(out)]) == 0
    tokenizer = model_tokenizer(None, 16)
    builtin = DataConfig(task="long_tail", num_digits=16, train_size=2048, heldout_size=64)
    from_file = DataConfig(source="jsonl", path=str(out), heldout_size=64)
    want, got = load_splits(builtin, tokenizer), load_splits(from_file, tokenizer)
    for want_split, got_split in zip(want, got, strict=True):
        assert [(e.prompt, e.answer) for e in got_split] == [(e.prompt, e.answer) for e in want_split]
    assert len(got[0]) == 2048 and len(got[1]) == 64
    assert stat.S_IMODE(out.stat().st_mode) == 0o644 and not list(tmp_path.glob(".*"))  # no temp file left


def test_the_committed_dataset_is_todays_export(tmp_path):
    out = tmp_path / "fresh.jsonl"
    main([*ARGS, "--out", str(out)])
    assert out.read_bytes() == COMMITTED.read_bytes(), "rerun: python -m hpcrl.data.export " + " ".join(ARGS)


def test_bad_arguments_are_exit_2_and_write_nothing(tmp_path, capsys):
    out = tmp_path / "x\n$(touch pwned);.jsonl"
    assert main(["no_such_task", "--out", str(out)]) == 2
    assert "no_such_task" in capsys.readouterr().err
    assert main(["long_tail", "--heldout_size", "0", "--train_size", "0", "--out", str(out)]) == 2
    assert "data.train_size" in capsys.readouterr().err
    blocked = tmp_path / "file"
    blocked.write_text("")
    assert main(["long_tail", "--out", str(blocked / "sub" / "d.jsonl")]) == 2
    assert "cannot write" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"] and not (tmp_path / "pwned").exists()
