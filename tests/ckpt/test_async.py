"""Async save: the fence (a write after it never reaches the checkpoint), the write guard (a write without
it fails the save, naming the tensor), at most one save in flight, failures reported and never committed."""

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


def test_a_write_after_fence_does_not_reach_the_checkpoint(tmp_path):
    w = torch.arange(1 << 20, dtype=torch.float32)
    ck = Checkpointer(tmp_path, async_save=True)
    ck.fence()  # nothing in flight: returns at once
    ck.save(1, _shards(w), RunState(step=1))
    ck.fence()  # the snapshot is taken; the write to disk may still run
    w.add_(1000.0)  # the optimizer step
    ck.fence()  # fenced already: a no-op, not a second check
    assert ck.wait() == tmp_path / "step_00000001"
    loaded = load_checkpoint(tmp_path, [_shards(w)[0].spec])
    assert torch.equal(loaded.tensors["w"], torch.arange(1 << 20, dtype=torch.float32))
    assert ck.last_save_s is not None and ck.last_save_s > 0


def test_a_write_without_fence_fails_the_save_names_the_tensor_and_leaves_latest(tmp_path):
    gen = torch.Generator().manual_seed(0)
    big = [ShardedTensor.whole(f"big{i}", torch.randn(1 << 20, generator=gen)) for i in range(4)]
    w = torch.zeros(1000)
    ck = Checkpointer(tmp_path, async_save=True)
    ck.save(1, [*big, *_shards(w)], RunState(step=1))
    ck.wait()
    ck.save(2, [*big, *_shards(w)], RunState(step=2))
    w.add_(1.0)  # no fence: the snapshot may hold the old or the new values, or a mix
    with pytest.raises(CheckpointError, match="tensor 'w' was written in place .*step 2.*not committed"):
        ck.wait()
    assert read_latest(tmp_path) == tmp_path / "step_00000001"
    assert [s for s, _ in committed(tmp_path)] == [1]
    assert [p.name for p in tmp_path.iterdir() if ".tmp-" in p.name] == []
    ck.save(3, [*big, *_shards(w)], RunState(step=3))  # reported once; the next save works
    assert ck.wait() == tmp_path / "step_00000003"


def test_an_inference_tensor_has_no_version_counter_so_save_copies_it_at_once(tmp_path):
    with torch.inference_mode():
        w = torch.ones(1000)
    ck = Checkpointer(tmp_path, async_save=True)
    ck.save(1, _shards(w), RunState(step=1))
    with torch.inference_mode():
        w.add_(1.0)  # invisible to the write guard, and harmless: save() took its own copy
    ck.close()
    assert torch.equal(load_checkpoint(tmp_path, [_shards(w)[0].spec]).tensors["w"], torch.ones(1000))


def test_the_next_save_waits_for_the_one_in_flight(tmp_path):
    w = torch.zeros(1 << 18)
    ck = Checkpointer(tmp_path, async_save=True, keep_last=5)
    for step in range(1, 5):
        ck.fence()
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


def test_settings_come_from_checkpoint_config_and_async_save_is_never_implicit(tmp_path):
    from hpcrl.ckpt.config import CheckpointConfig

    cfg = CheckpointConfig()
    ck = Checkpointer.from_config(cfg, tmp_path, None)  # a run's checkpointer
    assert (ck.async_save, ck.keep_last, ck.timeout_s) == (cfg.async_save, cfg.keep_last, cfg.timeout_s)
    assert ck.root == tmp_path / "checkpoints"
    plain = Checkpointer(tmp_path, async_save=False)  # the same defaults, no second copy of them
    assert (plain.keep_last, plain.timeout_s) == (ck.keep_last, ck.timeout_s)
    with pytest.raises(TypeError, match="async_save"):
        Checkpointer(tmp_path)  # a sync caller must not get background saves by omission
