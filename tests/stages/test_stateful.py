"""Checkpointed state is a list of Statefuls (hpcrl.stages.stateful): a component registers its own JSON
and tensors and gets them back on resume; one whose `checkpoint_specs` refuses a candidate moves the
resume on to an older checkpoint; the data cursor keeps its own field of the format."""

from __future__ import annotations

import json
import signal
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from hpcrl.ckpt.manifest import Manifest
from hpcrl.ckpt.shards import ShardedTensor, ShardSpec
from hpcrl.data.cursor import DataCursor, PromptSampler
from hpcrl.experiment.config import ExperimentConfig
from hpcrl.stages.checkpointing import StageCheckpointing
from hpcrl.stages.stateful import DataCursorState
from tests.stages._sampling import cursor_after


@pytest.fixture(autouse=True)
def _keep_sigusr1():
    """StageCheckpointing installs a SIGUSR1 handler in the main thread; give pytest its own back."""
    before = signal.getsignal(signal.SIGUSR1)
    yield
    signal.signal(signal.SIGUSR1, before)


class Counter:
    """A component with state of its own: a count (JSON) and a running sum (a tensor)."""

    key = "counter"

    def __init__(self, refuse_after: int | None = None):
        self.count, self.sum_V = 0, torch.zeros(4)
        self.refuse_after = refuse_after
        self.restored: tuple[int, dict | None] | None = None

    def advance(self) -> None:
        self.count += 1
        self.sum_V += torch.arange(4.0) * self.count

    def checkpoint_state(self) -> dict[str, Any]:
        return {"count": self.count}

    def checkpoint_shards(self) -> list[ShardedTensor]:
        return [ShardedTensor("counter.sum", self.sum_V.clone(), (4,), (0,))]

    def checkpoint_specs(self, manifest: Manifest) -> list[ShardSpec]:
        count = manifest.state["algorithm_state"][self.key]["count"]
        if self.refuse_after is not None and count > self.refuse_after:
            raise ValueError(f"count {count} is newer than this component accepts")
        return [ShardSpec("counter.sum", (4,), (0,), (4,), "float32")]

    def restore(self, step: int, saved: dict[str, Any] | None, tensors: dict[str, torch.Tensor]) -> None:
        self.restored = (step, saved)
        self.count, self.sum_V = saved["count"], tensors["counter.sum"].clone()


def _config() -> ExperimentConfig:
    cfg = ExperimentConfig()
    cfg.checkpoint.async_save = False
    cfg.checkpoint.keep_last = 5
    return cfg


def _run(run_dir, counter: Counter, steps: int) -> tuple[int, SimpleNamespace]:
    """Resume, advance the counter and the data cursor once per step, save every step."""
    data = SimpleNamespace(sampler=PromptSampler(list(range(10)), DataCursor(seed=3)))
    ckpt = StageCheckpointing(_config(), run_dir, {}, [DataCursorState(data), counter])
    start = ckpt.resume()
    for step in range(start, steps):
        counter.advance()
        data.sampler.next_batch(2)
        ckpt.save(step + 1)
    ckpt.close(steps)
    return start, data


def test_a_registered_stateful_is_saved_and_restored_with_its_tensors(tmp_path):
    first = Counter()
    _run(tmp_path, first, 3)
    again = Counter()
    start, data = _run(tmp_path, again, 3)
    assert start == 3
    assert again.restored == (3, {"count": 3})
    assert torch.equal(again.sum_V, torch.arange(4.0) * (1 + 2 + 3))
    assert data.sampler.cursor.to_dict() == first_cursor_after(3)


def first_cursor_after(steps: int) -> dict:
    return cursor_after(steps, seed=3, batch=2)


def test_the_data_cursor_keeps_its_own_field_and_the_rest_goes_to_algorithm_state(tmp_path):
    _run(tmp_path, Counter(), 2)
    manifest = json.loads((tmp_path / "checkpoints" / "step_00000002" / "manifest.json").read_text())
    assert manifest["state"]["data_cursor"] == first_cursor_after(2)
    assert manifest["state"]["algorithm_state"] == {"counter": {"count": 2}}
    assert "counter.sum" in manifest["tensors"]


def test_a_stateful_refusing_a_candidate_resumes_from_an_older_checkpoint(tmp_path):
    _run(tmp_path, Counter(), 4)
    picky = Counter(refuse_after=2)
    start, _ = _run(tmp_path, picky, 4)
    assert start == 2  # steps 4 and 3 refused by the component, on every rank alike
    assert picky.restored == (2, {"count": 2})
    assert picky.count == 4  # it then redid steps 3 and 4
