"""Async save: host snapshot isolation, at most one save in flight, failures reported and never committed."""

from __future__ import annotations

import pytest
import torch

from hpcrl.ckpt.checkpointer import Checkpointer
from hpcrl.ckpt.commit import committed, read_latest
from hpcrl.ckpt.load import load_checkpoint
from hpcrl.ckpt.manifest import CheckpointError
from hpcrl.ckpt.shards import ShardedTensor
from hpcrl.ckpt.state import RunState


def _shards(w):
    return [ShardedTensor.whole("w", w)]


def test_an_in_place_update_after_save_returns_does_not_leak_into_the_checkpoint(tmp_path):
    w = torch.arange(1 << 20, dtype=torch.float32)
    ck = Checkpointer(tmp_path, async_save=True)
    ck.save(1, _shards(w), RunState(step=1))
    w.add_(1000.0)  # the optimizer step right after save() returned, while the write may still run
    ck.wait()
    loaded = load_checkpoint(tmp_path, [_shards(w)[0].spec])
    assert torch.equal(loaded.tensors["w"], torch.arange(1 << 20, dtype=torch.float32))


def test_the_next_save_waits_for_the_one_in_flight(tmp_path):
    w = torch.zeros(1 << 18)
    ck = Checkpointer(tmp_path, async_save=True, keep_last=5)
    for step in range(1, 5):
        w.fill_(step)
        ck.save(step, _shards(w), RunState(step=step))
        # save(step) returned: save(step - 1) finished and committed before the new one started
        assert (
            read_latest(tmp_path) is None
            if step == 1
            else read_latest(tmp_path).name >= f"step_{step - 1:08d}"
        )
    ck.close()
    assert [s for s, _ in committed(tmp_path)] == [4, 3, 2, 1]
    for step in range(1, 5):
        loaded = load_checkpoint(tmp_path / f"step_{step:08d}", [_shards(w)[0].spec])
        assert torch.equal(loaded.tensors["w"], torch.full((1 << 18,), float(step)))


def test_a_failing_background_save_is_raised_on_the_next_call_and_never_committed(tmp_path):
    w = torch.ones(1000)
    ck = Checkpointer(tmp_path, async_save=True)
    ck.save(3, _shards(w), RunState(step=3))
    ck.wait()
    before = (tmp_path / "step_00000003" / "rank_00000.h5").read_bytes()
    ck.save(3, _shards(w * 2), RunState(step=3))  # step 3 is committed: the background commit refuses
    with pytest.raises(CheckpointError, match="background save failed: .*step 3 is already committed"):
        ck.save(4, _shards(w), RunState(step=4))
    assert (tmp_path / "step_00000003" / "rank_00000.h5").read_bytes() == before
    assert [p.name for p in tmp_path.iterdir() if ".tmp-" in p.name] == []
    ck.save(4, _shards(w), RunState(step=4))  # the error was reported once; saving works again
    assert ck.wait() == tmp_path / "step_00000004"
