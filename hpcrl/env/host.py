"""`EnvHost`: the environments of the episodes one user-code worker serves (it runs in that worker,
hpcrl.usercode.worker, built once with the environment's spec).

Each call carries a batch of requests, one per episode: its example, every action it has taken (the
last one is this step's; none means reset) and whether it is done with. Each request runs in a thread
of its own, so one environment's latency (a sandbox, a web call) overlaps the others', and is bounded by
`timeout_s` per step it runs. A request still running at its deadline is answered `timeout`, and the
reply says the worker is `stuck`: the parent kills it (the thread cannot be stopped otherwise) and the
next call starts a fresh one, where an episode whose environment was lost is rebuilt by replaying its
actions (environments are deterministic given their example and actions).
"""

from __future__ import annotations

import json
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from hpcrl.usercode.spec import load_function

TRACEBACK_CHARS = 2000


class EnvHost:
    def __init__(
        self, spec: str, env_args: dict[str, Any], timeout_s: float, observation_chars: int = 1 << 16
    ):
        self.make = load_function(spec)
        self.env_args, self.timeout_s = env_args, timeout_s
        self.observation_chars = observation_chars
        """An observation's text is cut to this many characters here, before it is sent: an environment
        that returns megabytes must not make the rank read and tokenize them (the pool derives it from
        rollout.max_observation_tokens, which cuts the tokens after)."""
        self.live: dict[str, tuple[Any, int]] = {}
        """Episode id -> (its environment, how many of its actions it has taken)."""
        self._threads: ThreadPoolExecutor | None = None

    def __call__(self, requests: list[dict[str, Any]], forget: list[str]) -> dict[str, Any]:
        """Replies by episode id - {"value": what reset/step returned} | {"error": {type, message,
        traceback}} | {"timeout": seconds per call, "calls": reset/step calls it was given} - and `stuck` when a step outlived its deadline."""
        for episode in forget:
            self.live.pop(episode, None)
        threads = self._threads_for(len(requests))
        started = time.monotonic()
        futures = [(r, self._steps(r), threads.submit(self._advance, r)) for r in requests]
        replies, stuck = {}, False
        for request, steps, future in futures:
            budget = self.timeout_s * steps
            try:
                replies[request["id"]] = future.result(max(0.0, started + budget - time.monotonic()))
            except FutureTimeout:
                replies[request["id"]] = {"timeout": self.timeout_s, "calls": steps}
                stuck = True
        return {"replies": replies, "stuck": stuck}  # stuck: the parent kills this process next

    def _threads_for(self, count: int) -> ThreadPoolExecutor:
        """A pool with a thread per request (kept across calls: starting threads per call costs more
        than a fast environment's step)."""
        if self._threads is None or self._threads._max_workers < count:
            if self._threads is not None:
                self._threads.shutdown(wait=True)
            self._threads = ThreadPoolExecutor(max_workers=max(1, count), thread_name_prefix="hpcrl-env")
        return self._threads

    def _steps(self, request: dict[str, Any]) -> int:
        """Calls this request makes: 1, or its whole history when its environment must be rebuilt."""
        _, taken = self.live.get(request["id"], (None, -1))
        actions = len(request["actions"])
        return 1 if actions and taken == actions - 1 else 1 + actions

    def _advance(self, request: dict[str, Any]) -> dict[str, Any]:
        episode, actions = request["id"], request["actions"]
        try:
            env, taken = self.live.get(episode, (None, -1))
            if env is None or not actions or taken != len(actions) - 1:
                env = self.make(**self.env_args)
                value, taken = env.reset(request["example"]), 0
            for action in actions[taken:]:
                value = env.step(action)
                taken += 1
            self.live[episode] = (env, taken)
            value = cut_observation(value, bool(actions), self.observation_chars)
            json.dumps(value)  # a value the reply cannot carry fails this episode, not the batch
            return {"value": value}
        except BaseException as err:  # noqa: BLE001 - the user's code may raise anything
            self.live.pop(episode, None)
            trace = "".join(traceback.format_exception(err))[-TRACEBACK_CHARS:]
            return {
                "error": {
                    "type": type(err).__name__,
                    "message": str(err)[:TRACEBACK_CHARS],
                    "traceback": trace,
                }
            }


def cut_observation(value: Any, is_step: bool, chars: int) -> Any:
    """`value` (what reset or step returned) with its observation's text cut to `chars` characters in all
    (a list of messages: each message's content in turn, the later ones emptied); anything else as it
    is, for the parent's check to refuse."""
    if is_step and isinstance(value, list | tuple) and value:
        return [cut_observation(value[0], False, chars), *value[1:]]
    if isinstance(value, str):
        return value[:chars]
    if isinstance(value, list) and all(
        isinstance(m, dict) and isinstance(m.get("content"), str) for m in value
    ):
        left, out = chars, []
        for message in value:
            out.append({**message, "content": message["content"][:left]})
            left -= len(out[-1]["content"])
        return out
    return value
