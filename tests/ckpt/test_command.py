"""`hpcrl ckpt check`: verify, loadability under a layout, exit codes."""

from __future__ import annotations

import json

import pytest

from hpcrl.ckpt.checkpointer import Checkpointer
from hpcrl.ckpt.state import RunState
from hpcrl.cli import main
from tests.ckpt._model import global_tensors, rank_shards


@pytest.fixture
def ckpt(tmp_path):
    Checkpointer(tmp_path, async_save=False).save(
        4, rank_shards(global_tensors(0), 0, 1, 1), RunState(step=4)
    )
    return tmp_path


def test_check_verifies_and_answers_for_a_layout(ckpt, capsys):
    assert main(["ckpt", "check", str(ckpt), "--layout", "t=4,p=2,d=1", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["verified"] and report["loads"] and report["step"] == 4 and report["problems"] == []


def test_check_names_the_first_tensor_an_impossible_layout_cannot_split(ckpt, capsys):
    assert main(["ckpt", "check", str(ckpt), "--layout", "t=3,p=1,d=1"]) == 2
    err = capsys.readouterr().err
    assert "--layout: tensor 'embedding': dim 0 of size 32 does not divide by tp size 3" in err


def test_check_reports_corruption_with_exit_1(ckpt, capsys):
    path = ckpt / "step_00000004" / "rank_00000.h5"
    path.write_bytes(path.read_bytes()[:-1])
    assert main(["ckpt", "check", str(ckpt)]) == 1
    assert "rank_00000.h5: size" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["ckpt", "check", "{root}", "--layout", "2x2"],
            "--layout: layout '2x2': expected 't=<int>,p=<int>,d=<int>'",
        ),
        (["ckpt", "check", "{root}/nothing"], "no checkpoint"),
        (["ckpt", "export", "{root}"], "--hf: export needs --hf DIR"),
    ],
)
def test_usage_errors_exit_2_and_name_the_option(ckpt, capsys, argv, message):
    assert main([a.format(root=ckpt) for a in argv]) == 2
    assert message in capsys.readouterr().err
