"""ReplicaEnvPool (hpcrl.env.replica): the leader of a replica steps the environments and every rank gets
the same results, or the same error, over a real 2-rank gloo group."""

from __future__ import annotations

from concurrent.futures import Future
from pathlib import Path

import pytest
import torch.distributed as dist

from hpcrl.distributed.spawn import run_ranks
from hpcrl.env.pool import EnvFailure, EnvPool, EnvRequest
from hpcrl.env.replica import ReplicaEnvPool, ReplicaGroup
from hpcrl.env.result import StepResult

pytestmark = pytest.mark.dist
ENVS = Path(__file__).resolve().parent / "_envs.py"


class _BrokenPool:
    """A pool whose batch ends in an exception (what EnvPool's gather sets when a pool thread raises)."""

    def submit(self, requests):
        future: Future = Future()
        future.set_exception(OSError("pipe closed"))
        return future

    def close(self):
        pass


def _steps(rank: int, world: int, broken: bool) -> list:
    group = dist.new_group([0, 1])
    inner = None
    if rank == 0:
        inner = _BrokenPool() if broken else EnvPool(f"{ENVS}:Hostile", timeout_s=1.0)
    pool = ReplicaEnvPool(inner, ReplicaGroup(group, leader=0))
    requests = [EnvRequest(i, {"prompt": p}, actions) for i, p in enumerate(["ok", "hang:", "raise:"])
                for actions in [["1"]]]  # fmt: skip
    resets = pool.submit([EnvRequest(i, {"prompt": r.example["prompt"]}) for i, r in enumerate(requests)])
    try:
        return [resets.result(), pool.submit(requests).result()]
    except RuntimeError as err:  # returned, not raised: each rank must raise it, none may hang
        return [str(err)]
    finally:
        pool.close()


def test_every_rank_gets_the_leaders_results():
    (resets, steps), follower = run_ranks(_steps, 2, False, timeout_s=120)
    assert follower == [resets, steps]
    assert [type(r) for r in steps] == [StepResult, EnvFailure, EnvFailure]
    assert "did not return within 1 s" in steps[1].message and "the environment broke" in steps[2].message


def test_a_failed_batch_raises_on_every_rank_naming_the_leader():
    leader, follower = run_ranks(_steps, 2, True, timeout_s=120)
    assert leader == follower and "stepped on rank 0): OSError: pipe closed" in leader[0]
