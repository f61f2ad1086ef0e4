"""Rejected checkpoints (`step_N.rejected-<UTC time>`, set aside by a load that fell back past them) are
pruned by `checkpoint.keep_rejected`: the newest are kept for inspection, older ones are deleted before
the next save. Before, every one stayed until deleted by hand: a run falling back after each of many
crashes filled its disk with checkpoints nothing reads."""

from __future__ import annotations

import pytest

from hpcrl.ckpt.checkpointer import Checkpointer
from hpcrl.ckpt.commit import REJECTED
from hpcrl.ckpt.state import RunState
from hpcrl.cli import main
from tests.ckpt._model import global_tensors, rank_shards, rank_specs


def rejected(root) -> list[str]:
    return sorted(p.name for p in root.iterdir() if REJECTED in p.name)


def reject_latest(root) -> None:
    """Damage the newest checkpoint and load with fallback: it is set aside."""
    [newest, *_] = sorted(root.glob("step_*[0-9]"), reverse=True)
    shard = newest / "rank_00000.h5"
    shard.write_bytes(shard.read_bytes()[:-1])
    Checkpointer(root, async_save=False).load(rank_specs(global_tensors(0), 0, 1, 1), fallback=True)


@pytest.mark.parametrize("keep", [0, 1, 2])
def test_only_the_newest_rejected_checkpoints_outlive_the_next_save(tmp_path, keep):
    ck = Checkpointer(tmp_path, async_save=False, keep_last=5, keep_rejected=keep)
    save = lambda step: ck.save(step, rank_shards(global_tensors(step), 0, 1, 1), RunState(step=step))  # noqa: E731
    save(1)
    for step in (2, 3, 4):  # each crash leaves a damaged newest checkpoint that the restart sets aside
        save(step)
        reject_latest(tmp_path)
    names = rejected(tmp_path)  # each save pruned those before it: the last one is still there
    assert len(names) == min(3, keep + 1), names
    save(5)
    newest_first = sorted(names, key=lambda name: name.rpartition(REJECTED)[2], reverse=True)
    assert rejected(tmp_path) == sorted(newest_first[:keep])


def test_a_negative_keep_rejected_is_exit_2_at_expand(capsys):
    from pathlib import Path

    template = Path(__file__).resolve().parents[2] / "templates" / "grpo_tiny.yaml"
    assert main(["expand", str(template), "--checkpoint.keep_rejected", "-1"]) == 2
    assert (
        "command line:checkpoint.keep_rejected: out of range: must be in [0, 2^16], got -1"
        in capsys.readouterr().err
    )
