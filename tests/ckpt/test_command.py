"""`hpcrl ckpt check`: verify, loadability under a layout, exit codes."""

from __future__ import annotations

import json

import pytest

from hpcrl.ckpt.checkpointer import Checkpointer
from hpcrl.ckpt.state import RunState
from hpcrl.cli import main
from tests.ckpt import _tamper
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


# --- hostile input (2026-12-02): the manifest's ranks agree with its files, `latest` is judged one way --


@pytest.mark.parametrize("world_size", [10**9, 2])
def test_a_manifest_claiming_more_ranks_than_it_has_states_is_corrupt(ckpt, capsys, world_size):
    """Was 'verified' (and 'loads under t=4,p=2,d=1') for world_size 10^9 with one file."""
    step = ckpt / "step_00000004"
    data = _tamper.read_json(step)
    data["world_size"] = world_size
    _tamper.write_json(step, data)
    assert main(["ckpt", "check", str(ckpt), "--layout", "t=4,p=2,d=1"]) == 1
    out, err = capsys.readouterr()
    assert f"CORRUPT: {step / 'manifest.json'}: invalid manifest: world_size {world_size}" in err
    assert "loads under" not in out and "verified" not in out


def test_a_file_of_a_rank_that_did_not_save_is_corrupt(ckpt, capsys):
    step = ckpt / "step_00000004"
    data = _tamper.read_json(step)
    data["files"]["rank_00007.h5"] = data["files"].pop("rank_00000.h5")
    for tensor in data["tensors"].values():
        for shard in tensor["shards"]:
            shard["file"] = "rank_00007.h5"
    (step / "rank_00000.h5").rename(step / "rank_00007.h5")
    _tamper.reseal_fingerprints(data)
    _tamper.write_json(step, data)
    assert main(["ckpt", "check", str(step)]) == 1
    assert "'rank_00007.h5' is not the file of a rank below world_size 1" in capsys.readouterr().err


@pytest.mark.parametrize("target", ["plain_file", "symlink_loop", "latest_loop"])
def test_a_latest_that_names_no_step_directory_is_said_the_same_way(ckpt, capsys, caplog, target):
    """A `latest` naming a plain file or a symlink loop was passed over silently; only a loop on
    `latest` itself got the note."""
    newer = ckpt / "step_00000005"
    if target == "plain_file":
        newer.write_text("x")
        (ckpt / "latest").write_text("step_00000005\n")
    elif target == "symlink_loop":
        newer.symlink_to(newer.name)
        (ckpt / "latest").write_text("step_00000005\n")
    else:
        (ckpt / "latest").unlink()
        (ckpt / "latest").symlink_to("latest")
    assert main(["ckpt", "check", str(ckpt)]) == 0
    assert "step 4" in capsys.readouterr().out
    assert "latest: names no step directory; trying every committed checkpoint" in caplog.text
