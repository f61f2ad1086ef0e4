"""Data files are untrusted input (issue 43, item 3): each hostile `data.path` is exit 2 at `expand`
naming the file and `data.path` (and the row where there is one), nothing written, no traceback, no hang.

Before: a FIFO made `hpcrl expand` hang forever (`open` blocked for a writer); invalid UTF-8, a
directory, JSON nested 5,000 deep, a jsonl file given as parquet and a non-dataset directory for
`hf_disk` were tracebacks; `{"prompt": null}` trained on the text "None". The FIFO cases run `hpcrl` in a
child with a timeout, so that a regression fails the test instead of hanging the suite.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hpcrl.cli import main
from hpcrl.data.files import MAX_LINE_BYTES, MAX_NESTING

REPO = Path(__file__).resolve().parents[2]
SFT, DPO = REPO / "templates" / "sft_tiny.yaml", REPO / "templates" / "dpo_tiny.yaml"
GOOD = "".join(json.dumps({"prompt": f"{i}{i}=", "answer": f"{i}{i}"}) + "\n" for i in range(8))
MESSAGE_BOUND = 4000
"""The most characters a refusal may print (hpcrl.errors shortens values; a row is never echoed whole)."""


def _expand(capsys, tmp_path: Path, template: Path, source: str, path: Path | str, *extra: str):
    runs = tmp_path / "runs"
    args = [
        "expand",
        str(template),
        "--data.source",
        source,
        "--data.path",
        str(path),
        "--run_root",
        str(runs),
    ]
    code = main([*args, "--data.heldout_size", "1", *extra])
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err) < MESSAGE_BOUND, err
    assert not runs.exists()
    return code, err


def _refused(capsys, tmp_path, template, source, path, says, *extra) -> str:
    code, err = _expand(capsys, tmp_path, template, source, path, *extra)
    assert code == 2 and f"{path}" in err and says in err, err
    return err


def _write(path: Path, data: bytes | str) -> Path:
    path.write_bytes(data if isinstance(data, bytes) else data.encode())
    return path


def test_a_good_jsonl_file_expands(capsys, tmp_path):
    code, err = _expand(capsys, tmp_path, SFT, "jsonl", _write(tmp_path / "ok.jsonl", GOOD))
    assert code == 0, err


@pytest.mark.parametrize(
    ("name", "content", "says"),
    [
        ("utf8.jsonl", b'{"prompt": "\xff\xfe", "answer": "1"}\n', "line 1 is not UTF-8 text"),
        ("deep.jsonl", "[" * 5000 + "]" * 5000 + "\n", f"line 1 nests deeper than {MAX_NESTING} levels"),
        ("deep2.jsonl", '{"prompt": ' + "[" * 100 + "]" * 100 + "}\n", "nests deeper than"),
        ("nan.jsonl", '{"prompt": "1=", "answer": NaN}\n', "line 1 is not JSON: NaN is not JSON"),
        ("garbage.jsonl", GOOD + "{oops\n", "line 9 is not JSON"),
        ("list.jsonl", "[1, 2]\n", "row 0 is a list, not a mapping"),
        ("null_prompt.jsonl", '{"prompt": null, "answer": "1"}\n' + GOOD, "row 0: 'prompt' must be text"),
        ("int_prompt.jsonl", '{"prompt": 12, "answer": "1"}\n' + GOOD, "row 0: 'prompt' must be text"),
        ("null_answer.jsonl", GOOD + '{"prompt": "1=", "answer": null}\n', "row 8: 'answer' must be text or"),
        ("bool_answer.jsonl", GOOD + '{"prompt": "1=", "answer": true}\n', "row 8: 'answer' must be text or"),
        ("empty.jsonl", "\n\n", "dataset is empty"),
    ],
)
def test_a_hostile_jsonl_file_is_exit_2_naming_the_file_and_row(capsys, tmp_path, name, content, says):
    _refused(capsys, tmp_path, SFT, "jsonl", _write(tmp_path / name, content), says)


def test_a_line_past_the_row_bound_is_refused(capsys, tmp_path):
    line = json.dumps({"prompt": "1" * MAX_LINE_BYTES})
    huge = _write(tmp_path / "huge.jsonl", GOOD + line + "\n")
    _refused(capsys, tmp_path, SFT, "jsonl", huge, f"line 9 is {len(line):,} bytes; a row has at most")


def test_a_number_answer_is_its_text(capsys, tmp_path):
    rows = "".join(json.dumps({"prompt": f"{i}=", "answer": i}) + "\n" for i in range(8))
    code, err = _expand(capsys, tmp_path, SFT, "jsonl", _write(tmp_path / "n.jsonl", rows))
    assert code == 0, err


@pytest.mark.parametrize("source", ["jsonl", "parquet", "hf_disk"])
def test_a_directory_a_device_and_a_file_of_another_format_are_refused(capsys, tmp_path, source):
    (tmp_path / "dir").mkdir()
    if source != "hf_disk":
        _refused(capsys, tmp_path, SFT, source, tmp_path / "dir", "is not a regular file")
        _refused(capsys, tmp_path, SFT, source, "/dev/zero", "is not a regular file")
    else:
        _refused(
            capsys, tmp_path, SFT, source, tmp_path / "dir", "is not a `datasets` save_to_disk directory"
        )
        _refused(capsys, tmp_path, SFT, source, _write(tmp_path / "f.jsonl", GOOD), "is not a directory")
    other = _write(tmp_path / "other", GOOD if source == "parquet" else b"PAR1\x00\x01\x02PAR1")
    if source == "parquet":
        _refused(capsys, tmp_path, SFT, source, other, "is not a parquet file pyarrow can read")
    elif source == "jsonl":
        _refused(capsys, tmp_path, SFT, source, other, "line 1 is not")


def test_a_dataset_directory_holding_a_link_or_a_fifo_is_refused(capsys, tmp_path):
    dataset = tmp_path / "ds"
    dataset.mkdir()
    _write(dataset / "state.json", "{}")
    (dataset / "data-00000-of-00001.arrow").symlink_to("/etc/passwd")
    _refused(capsys, tmp_path, SFT, "hf_disk", dataset, "is a symlink")
    (dataset / "data-00000-of-00001.arrow").unlink()
    os.mkfifo(dataset / "data-00000-of-00001.arrow")
    _refused(capsys, tmp_path, SFT, "hf_disk", dataset, "is not a regular file")


def test_a_damaged_dataset_directory_is_exit_2(capsys, tmp_path):
    dataset = tmp_path / "ds"
    dataset.mkdir()
    _write(dataset / "state.json", "{not json")
    _refused(capsys, tmp_path, SFT, "hf_disk", dataset, "`datasets` cannot load it")


@pytest.mark.parametrize(("template", "source"), [(SFT, "jsonl"), (SFT, "parquet"), (DPO, "jsonl")])
def test_a_fifo_as_the_data_file_is_refused_without_blocking(tmp_path, template, source):
    """No writer ever opens the FIFO: a blocking open would wait forever (the child's timeout ends it)."""
    fifo = tmp_path / "rows.jsonl"
    os.mkfifo(fifo)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "hpcrl",
            "expand",
            str(template),
            "--data.source",
            source,
            "--data.path",
            str(fifo),
            "--run_root",
            str(tmp_path / "runs"),
        ],  # fmt: skip
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and f"data.path: {fifo}: " in proc.stderr, proc.stderr
    assert "is not a regular file" in proc.stderr and not (tmp_path / "runs").exists()


def test_a_fifo_named_latest_does_not_block_a_checkpoint_check(tmp_path):
    root = tmp_path / "checkpoints"
    root.mkdir()
    os.mkfifo(root / "latest")
    proc = subprocess.run(
        [sys.executable, "-m", "hpcrl", "ckpt", "check", str(root)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr


@pytest.mark.parametrize(
    ("rows", "says"),
    [
        (
            [{"messages": [{"role": "user", "content": "12="}]}] * 4,
            "has nothing to learn: SFT needs 'answer' (or an assistant turn) on every row",
        ),
        ([{"prompt": "1=", "chosen": "1", "rejected": "2"}] * 4, "preference pairs: the dpo and rm stages"),
    ],
)
def test_sft_rows_without_answers_are_found_at_expand(capsys, tmp_path, rows, says):
    data = _write(tmp_path / "rows.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    err = _refused(capsys, tmp_path, SFT, "jsonl", data, says, "--model.vocab_size", "32")
    assert f"data.answer_key: {data}: row 0" in err


def test_sft_without_held_out_rows_is_refused_at_expand(capsys, tmp_path):
    code = main(["expand", str(SFT), "--data.heldout_size", "0"])
    err = capsys.readouterr().err
    assert code == 2 and "command line:data.heldout_size: SFT evaluates on held-out rows" in err


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.sampled_from(["prompt", "answer", "messages", "role", "content", "x"]), inner, max_size=3
        )
    ),  # fmt: skip
    max_leaves=12,
)
LINES = st.one_of(
    JSON_VALUES.map(lambda v: json.dumps(v).encode()),
    st.binary(max_size=40),
    st.sampled_from([b"[" * 3000, b'{"prompt": NaN}', b"\xff\xfe", b"", b"{}", b'{"prompt": "1="}']),
)


@settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(lines=st.lists(LINES, max_size=6), source=st.sampled_from(["jsonl", "parquet"]))
def test_any_data_file_is_exit_0_or_2_with_a_bounded_message(capsys, tmp_path_factory, lines, source):
    """A fuzz over generated files: rows of JSON values (well-formed or not), raw bytes, deep nesting."""
    tmp = tmp_path_factory.mktemp("fuzz")
    data = _write(tmp / "rows", b"\n".join(lines))
    code, err = _expand(capsys, tmp, SFT, source, data)
    assert code in (0, 2), err
