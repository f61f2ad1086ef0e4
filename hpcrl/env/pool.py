"""`EnvPool`: a rank's episodes spread over `workers` killable processes, each an `EnvHost`
(hpcrl.env.host) in a user-code worker (hpcrl.usercode.runner: its own process group, memory bound,
output captured; killed whole past its deadline).

An episode always goes to the same worker (its index mod workers), so its environment stays live there;
the workers' batches run concurrently. A worker that dies takes only the episode that killed it: the
batch is run again one episode at a time, the others rebuilt by replaying their actions. What comes back is checked (hpcrl.env.result): every episode gets
a StepResult or an EnvFailure saying what went wrong at which turn - an environment that raises, hangs
past `timeout_s`, dies or returns garbage fails its episode, never the pool.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from hpcrl.env.result import EnvOutputError, StepResult, checked_reset, checked_step
from hpcrl.usercode.runner import (
    DEFAULT_MEMORY_BYTES,
    UserCodeError,
    UserCodeImportFailed,
    UserCodeRunner,
)

HOST = "hpcrl.env.host:EnvHost"
CHARS_PER_TOKEN = 32
"""Characters of observation text kept per token kept (see EnvPool.observation_tokens)."""
REPLY_GRACE_S = 10.0
"""How long past its steps' deadlines a worker may take to answer (starting Python, framing) before it is
killed as a whole."""


@dataclass(frozen=True)
class EnvRequest:
    """One episode's next step: `actions` are every turn it has taken, this one last (none: reset)."""

    episode: int
    example: dict[str, str]
    actions: Sequence[str] = ()


class EnvironmentBroken(RuntimeError):
    """The environment's module raises when a worker imports it: every episode would fail the same way,
    so the run stops naming it, whatever reward.nan_policy says (skip would train on nothing)."""


@dataclass(frozen=True)
class EnvFailure:
    """Why an episode's environment gave no step result (the message names the turn)."""

    message: str


@dataclass
class EnvPool:
    spec: str
    """The environment class (rollout.env)."""
    timeout_s: float
    """Seconds one step may take (rollout.env_timeout_s)."""
    workers: int = 1
    env_args: dict[str, Any] = field(default_factory=dict)
    memory_bytes: int = DEFAULT_MEMORY_BYTES
    observation_tokens: int = 1 << 12
    """Tokens an observation keeps (rollout.max_observation_tokens): its text is cut in the worker to
    CHARS_PER_TOKEN times that, more than those tokens span in any tokenizer, so the rank reads and
    tokenizes a bounded text and still cuts (and counts, env/observation_cut) the tokens beyond."""

    def __post_init__(self):
        self._runners = [
            UserCodeRunner(
                HOST,
                timeout_s=self.timeout_s,
                memory_bytes=self.memory_bytes,
                init_args=[
                    self.spec,
                    self.env_args,
                    self.timeout_s,
                    CHARS_PER_TOKEN * self.observation_tokens,
                ],
            )
            for _ in range(self.workers)
        ]
        # one thread per worker: a worker's calls are one at a time (one pipe), workers run side by side
        self._threads = [
            ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"hpcrl-env-pool-{w}")
            for w in range(self.workers)
        ]
        self._forget: list[list[str]] = [[] for _ in range(self.workers)]

    def submit(self, requests: Sequence[EnvRequest]) -> Future:
        """Start the steps; the future's result is one StepResult or EnvFailure per request, in order."""
        by_worker: list[list[int]] = [[] for _ in range(self.workers)]
        for i, request in enumerate(requests):
            by_worker[request.episode % self.workers].append(i)
        parts = [
            (indices, self._threads[w].submit(self._call, w, [requests[i] for i in indices]))
            for w, indices in enumerate(by_worker)
            if indices
        ]
        out: Future = Future()
        lock = threading.Lock()

        def gather(_done=None):
            with lock:  # the last part to finish sets the result, once
                if out.done() or not all(f.done() for _, f in parts):
                    return
                try:
                    results: list[Any] = [None] * len(requests)
                    for indices, f in parts:
                        for i, result in zip(indices, f.result(), strict=True):
                            results[i] = result
                    out.set_result(results)
                except BaseException as err:  # noqa: BLE001 - the waiting rank must see it, not hang
                    out.set_exception(err)

        for _, f in parts:
            f.add_done_callback(gather)
        if not parts:
            out.set_result([])
        return out

    def step(self, requests: Sequence[EnvRequest]) -> list[StepResult | EnvFailure]:
        return self.submit(requests).result()

    def forget(self, episodes: Sequence[int]) -> None:
        """These episodes are over: their workers drop their environments at the next call."""
        for episode in episodes:
            self._forget[episode % self.workers].append(str(episode))

    def worker_pids(self) -> list[int | None]:
        """Each worker's process id (None: not started, or killed and not restarted yet)."""
        return [runner.pid for runner in self._runners]

    def close(self) -> None:
        for runner in self._runners:
            runner.close()
        for threads in self._threads:
            threads.shutdown(wait=True)

    def _call(
        self, worker: int, requests: list[EnvRequest], alone: bool = False
    ) -> list[StepResult | EnvFailure]:
        """One worker's batch. When the worker dies or must be killed as a whole (os._exit, the memory
        limit, code that holds the GIL past the deadline), the batch is run again one request at a time on
        fresh workers (the others rebuilt by replay), so only the episode that did it fails."""
        runner = self._runners[worker]
        steps = max(1 + len(r.actions) for r in requests)  # a rebuilt episode replays its history
        runner.timeout_s = self.timeout_s * steps + REPLY_GRACE_S
        forget, self._forget[worker] = self._forget[worker], []
        wire = [{"id": str(r.episode), "example": r.example, "actions": list(r.actions)} for r in requests]
        try:
            reply = runner.call(wire, forget)
        except OSError as err:  # the worker could not be started (argv too long, no processes left)
            return [_failure(r, f"its worker could not start: {err}") for r in requests]
        except UserCodeImportFailed as err:  # every worker would fail alike: no episode can run
            raise EnvironmentBroken(f"{self.spec}: the environment cannot start in a worker: {err}") from None
        except UserCodeError as err:  # killed past its deadline, died, or did not start
            if not alone:
                return [result for r in requests for result in self._call(worker, [r], alone=True)]
            return [_failure(r, f"its worker failed: {err}") for r in requests]
        if reply.get("stuck"):
            runner.close()  # a step's thread is still running: only killing the process stops it
        return [_result(r, reply["replies"].get(str(r.episode), {})) for r in requests]


def _result(request: EnvRequest, reply: dict[str, Any]) -> StepResult | EnvFailure:
    if "timeout" in reply:
        calls = reply.get("calls", 1)
        rebuilt = f" per call over {calls} calls (its environment was rebuilt by replay)" if calls > 1 else ""
        return _failure(
            request, f"did not return within {reply['timeout']:g} s (rollout.env_timeout_s){rebuilt}"
        )
    if "error" in reply:
        error = reply["error"]
        return _failure(request, f"raised {error['type']}: {error['message']}\n{error['traceback']}")
    if "value" not in reply:
        return _failure(request, "no reply")
    try:
        return checked_step(reply["value"]) if request.actions else checked_reset(reply["value"])
    except EnvOutputError as err:
        return _failure(request, str(err))


def _failure(request: EnvRequest, why: str) -> EnvFailure:
    where = f"step of turn {len(request.actions)}" if request.actions else "reset"
    prompt = request.example.get("prompt", "")
    return EnvFailure(f"environment {where} on prompt {prompt[:60]!r}: {why}")
