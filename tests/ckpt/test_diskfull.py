"""Disk full during a save (a real tiny tmpfs): the save fails loudly, `latest` keeps the previous good one."""

from __future__ import annotations

import subprocess

import pytest
import torch

from hpcrl.ckpt.checkpointer import Checkpointer
from hpcrl.ckpt.commit import read_latest
from hpcrl.ckpt.load import load_checkpoint
from hpcrl.ckpt.manifest import CheckpointError
from hpcrl.ckpt.shards import ShardedTensor
from hpcrl.ckpt.state import RunState
from hpcrl.ckpt.verify import verify_directory

MIB = 1 << 20


@pytest.fixture
def tiny_disk(tmp_path):
    """A 3 MiB tmpfs: room for two 1 MiB checkpoints, not for a third beside them."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {done.stderr.decode().strip()}")
    yield mount
    subprocess.run(["umount", str(mount)], check=True)


def _shards(step: int):
    return [ShardedTensor.whole("w", torch.full((MIB // 4,), float(step)))]


@pytest.mark.parametrize("async_save", [False, True], ids=["sync", "async"])
def test_disk_full_fails_loudly_and_latest_stays_good(tiny_disk, async_save):
    ck = Checkpointer(tiny_disk, keep_last=2, async_save=async_save)
    for step in (1, 2):
        ck.save(step, _shards(step), RunState(step=step))
    ck.wait()
    with pytest.raises(CheckpointError, match="No space left on device"):
        ck.save(3, _shards(3), RunState(step=3))
        ck.wait()
    assert read_latest(tiny_disk).name == "step_00000002"
    verify_directory(tiny_disk / "step_00000002")
    verify_directory(tiny_disk / "step_00000001")
    loaded = load_checkpoint(tiny_disk, [_shards(0)[0].spec])
    assert loaded.state.step == 2 and torch.equal(loaded.tensors["w"], _shards(2)[0].data)
    assert sorted(p.name for p in tiny_disk.iterdir()) == ["latest", "step_00000001", "step_00000002"]
