"""EnvPool against environments that misbehave: each failure is its episode's, named, within the timeout;
the other episodes go on (rebuilt by replay when their worker had to be killed)."""

from __future__ import annotations

import dataclasses
import os
import signal
from pathlib import Path

import pytest

from hpcrl.env.pool import CHARS_PER_TOKEN, EnvFailure, EnvironmentBroken, EnvPool, EnvRequest
from hpcrl.env.result import StepResult

ENVS = Path(__file__).parent / "_envs.py"


def example(prompt: str) -> dict[str, str]:
    return {"prompt": prompt, "answer": ""}


@pytest.fixture
def hostile():
    pool = EnvPool(f"{ENVS}:Hostile", timeout_s=2.0, workers=2)
    yield pool
    pool.close()


def test_the_builtin_calculator_answers_calls_and_scores_the_answer():
    pool = EnvPool("hpcrl.env.builtin:Calculator", timeout_s=10.0)
    try:
        ex = {"prompt": "482+390=", "answer": "872"}
        assert pool.step([EnvRequest(0, ex)]) == [StepResult("")]
        [call] = pool.step([EnvRequest(0, ex, ["<|tool|>482+390"])])
        assert (call.observation, call.reward, call.done) == ("=872", 0.0, False)
        [garbage] = pool.step([EnvRequest(1, ex, ["<|tool|>48+"])])
        assert garbage.observation == "="
        [answer] = pool.step([EnvRequest(0, ex, ["<|tool|>482+390", "872"])])
        assert (answer.reward, answer.done, answer.info["success"]) == (1.0, True, 1.0)
    finally:
        pool.close()


@pytest.mark.parametrize(
    ("mode", "says"),
    [
        ("raise", "raised RuntimeError: the environment broke"),
        ("str", "observation int 42, not a string"),
        ("nan", "reward float nan, not a finite number"),
        ("exit", "its worker failed"),
        ("huge", "reward int"),
    ],
)
def test_a_failing_step_fails_its_episode_naming_the_turn_and_prompt(hostile, mode, says):
    requests = [EnvRequest(0, example(f"{mode}:0"), ["a"]), EnvRequest(2, example("fine:2"), ["a"])]
    bad, good = hostile.step(requests)
    assert isinstance(bad, EnvFailure)
    assert says in bad.message and "step of turn 1" in bad.message and f"'{mode}:0'" in bad.message
    assert good == StepResult("=1", 1.0, True, {})  # same worker: run again alone, rebuilt by replay


def test_a_step_that_sleeps_forever_fails_within_the_timeout_and_the_others_are_replayed():
    """The hung episode shares the one worker with a healthy one: the worker is killed, the healthy
    episode's next step rebuilds its environment on a fresh worker by replaying its actions."""
    counting = EnvPool(f"{ENVS}:Hostile", timeout_s=2.0, workers=1)
    try:
        counting.step([EnvRequest(0, example("hang:0"))])
        hung, fine = counting.step([EnvRequest(0, example("hang:0"), ["a"]), EnvRequest(1, example("x:1"))])
        assert isinstance(hung, EnvFailure)
        assert (
            "step of turn 1 on prompt 'hang:0': did not return within 2 s (rollout.env_timeout_s)"
            in hung.message
        )
        assert fine == StepResult("")
        [after] = counting.step([EnvRequest(1, example("x:1"), ["a"])])
        assert after == StepResult("=1", 1.0, True, {})
    finally:
        counting.close()


def test_a_lost_environment_is_rebuilt_by_replaying_its_actions(tmp_path):
    resets = tmp_path / "resets"
    pool = EnvPool(f"{ENVS}:Counting", timeout_s=5.0, env_args={"path": str(resets)})
    try:
        pool.step([EnvRequest(0, example("p"))])
        [one] = pool.step([EnvRequest(0, example("p"), ["a"])])
        assert resets.read_text().splitlines() == ["p"]  # kept live: no replay
        [pid] = pool.worker_pids()
        os.kill(pid, signal.SIGKILL)  # the worker (and the environment) is gone: the OOM killer
        [two] = pool.step([EnvRequest(0, example("p"), ["a", "b"])])
        assert (one.reward, two.reward, two.observation) == (1.0, 2.0, "=2")
        assert resets.read_text().splitlines() == ["p", "p"]  # rebuilt once, then stepped twice
    finally:
        pool.close()


def test_a_megabyte_of_output_does_not_fail_a_step(hostile):
    [result] = hostile.step([EnvRequest(0, example("spam:0"), ["a"])])
    assert result == StepResult("=1", 1.0, True, {})


def test_info_keys_of_hpcrls_own_metrics_are_ignored_and_at_most_64_are_read(hostile):
    [result] = hostile.step([EnvRequest(0, example("info:0"), ["a"])])
    assert "turns" not in result.info and result.info["calls"] == 2.0
    assert len(result.info) == 63  # the first 64 entries, less the reserved "turns"


def test_two_batches_for_one_worker_at_once_take_turns_and_get_their_own_replies():
    """Interleaved halves may have a batch in flight on a worker when the next one for it comes (an
    odd number of workers): each must get its own episodes' results."""
    pool = EnvPool(f"{ENVS}:Echo", timeout_s=10.0, workers=3)
    try:
        first = [EnvRequest(0, example("slow:0")), EnvRequest(3, example("slow:3"))]  # worker 0, slow
        second = [EnvRequest(6, example("6=")), EnvRequest(1, example("1="))]  # workers 0 and 1
        assert pool.step(first + second) == [StepResult("")] * 4
        step = [EnvRequest(r.episode, r.example, ["x"]) for r in first + second]
        a, b = pool.submit(step[:2]), pool.submit(step[2:])  # b's worker-0 batch comes while a's runs
        assert [r.observation for r in a.result() + b.result()] == ["=10", "=13", "=16", "=11"]
    finally:
        pool.close()


def test_an_environment_whose_module_raises_on_import_stops_the_batch_naming_it(tmp_path):
    """Every episode would fail alike: the batch raises (the run stops), not one EnvFailure per episode."""
    broken = tmp_path / "broken_env.py"
    broken.write_text(
        "import no_such_module_hpcrl\n\nclass Env:\n    def reset(self, e): ...\n    def step(self, a): ...\n"
    )
    pool = EnvPool(f"{broken}:Env", timeout_s=5.0, workers=2)
    try:
        future = pool.submit([EnvRequest(i, {"prompt": "1="}) for i in range(3)])
        with pytest.raises(EnvironmentBroken) as info:
            future.result()
    finally:
        pool.close()
    message = str(info.value)
    assert message.startswith(f"{broken}:Env: the environment cannot start in a worker")
    assert "ModuleNotFoundError" in message and "no_such_module_hpcrl" in message


def test_an_observation_of_megabytes_is_cut_in_the_worker():
    """16 MB of text (or of message content) leaves the worker as CHARS_PER_TOKEN x the tokens kept."""
    pool = EnvPool(f"{ENVS}:Hostile", timeout_s=10.0, observation_tokens=4)
    try:
        requests = [
            EnvRequest(i, {"prompt": f"{mode}:"}) for i, mode in enumerate(["flood", "flood_messages"])
        ]
        pool.step(requests)
        text, messages = pool.step([dataclasses.replace(r, actions=["1"]) for r in requests])
    finally:
        pool.close()
    assert text.observation == "=" + "1" * (4 * CHARS_PER_TOKEN - 1)
    assert [(m.role, len(m.content)) for m in messages.observation] == [
        ("tool", 4 * CHARS_PER_TOKEN),
        ("user", 0),
    ]
