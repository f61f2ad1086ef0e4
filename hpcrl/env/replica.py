"""One generation replica's environments, stepped on its first rank only and broadcast to the others.

The ranks of a generation replica (the t_g x p_g ranks of the megatron engine, a TP group of SPMD vLLM)
decode the same rows in lockstep, so every turn each of them must append the same observations and end
the same episodes: contexts that differ by one token on one rank change the shapes of the next
collective (a hang past the group timeout, or garbage). A copy of the environment on each rank cannot
promise that: a step that times out under load on one rank and not on another, or an environment that is
not a pure function of its actions (a clock, a random draw, a service), sends them apart. So the
replica's leader alone runs the EnvPool (`env_workers` user-code processes) and broadcasts each batch's
results over the replica's process group; the other ranks start no environment worker at all.

Every rank of the replica must call `result()` of the futures it got from `submit` in the same order:
the episode runner does, since it takes the same decisions on the same (broadcast) results.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist

from hpcrl.env.pool import EnvFailure, EnvPool, EnvRequest
from hpcrl.env.result import StepResult


@dataclass(frozen=True)
class ReplicaGroup:
    """The ranks that decode one generation replica together."""

    group: Any
    """torch.distributed ProcessGroup of the replica's ranks."""
    leader: int
    """Global rank that steps the environments (the replica's first rank)."""


class ReplicaEnvPool:
    """EnvPool's `submit`/`forget`/`close` for the ranks of one replica: `pool` on the leader (None on the
    others, which run no environment)."""

    def __init__(self, pool: EnvPool | None, replica: ReplicaGroup):
        self.pool, self.replica = pool, replica
        if (pool is None) == (dist.get_rank() == replica.leader):
            raise ValueError("the replica's leader, and only it, steps the environments")

    def submit(self, requests: Sequence[EnvRequest]) -> _BroadcastResults:
        inner = self.pool.submit(requests) if self.pool is not None else None
        return _BroadcastResults(inner, self.replica, len(requests))

    def forget(self, episodes: Sequence[int]) -> None:
        if self.pool is not None:
            self.pool.forget(episodes)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()


class _BroadcastResults:
    """A batch's results: the leader waits for its pool and broadcasts them (or the error that stopped
    them, raised on every rank alike); the others receive them."""

    def __init__(self, inner, replica: ReplicaGroup, size: int):
        self.inner, self.replica, self.size = inner, replica, size

    def result(self) -> list[StepResult | EnvFailure]:
        payload: list[Any] = [None]
        if self.inner is not None:
            try:
                payload[0] = ("ok", self.inner.result())
            except Exception as err:  # noqa: BLE001 - the other ranks must raise it too, not hang
                payload[0] = ("error", f"{type(err).__name__}: {err}")
        dist.broadcast_object_list(payload, src=self.replica.leader, group=self.replica.group)
        kind, value = payload[0]
        if kind == "error":
            raise RuntimeError(
                f"the environments of this replica (stepped on rank {self.replica.leader}): {value}"
            )
        if len(value) != self.size:
            raise RuntimeError(
                f"rank {self.replica.leader} sent {len(value)} results for {self.size} episodes"
            )
        return value
