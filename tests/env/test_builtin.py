"""The built-in Calculator environment, episode by episode (its class is plain Python: called here
directly; the rollout calls it in a worker process, tests/env/test_pool.py)."""

from __future__ import annotations

import pytest

from hpcrl.env.builtin import Calculator


def test_a_call_with_the_expression_is_computed_and_the_answer_ends_the_episode():
    env = Calculator()
    assert env.reset({"prompt": "482+390=", "answer": "872"}) == ""
    assert env.step("<|tool|>482+390") == ("=872", 0.0, False, {"tool_calls": 1, "success": 0.0})
    assert env.step("<|tool|>1+") == ("=", 0.0, False, {"tool_calls": 2, "success": 0.0})
    assert env.step("872") == ("", 1.0, True, {"tool_calls": 2, "success": 1.0})


def test_without_the_tool_every_call_is_answered_with_nothing():
    env = Calculator(tool=False)
    env.reset({"prompt": "482+390=", "answer": "872"})
    assert env.step("<|tool|>482+390")[0] == "="
    assert env.step("870") == ("", pytest.approx(2 / 3), True, {"tool_calls": 1, "success": 0.0})


def test_three_operands_need_two_calls_in_order_each_with_its_step_reward():
    """add3_digits: call 1 is a+b, call 2 the running sum plus c; a third call earns nothing."""
    env = Calculator(call_reward=0.3, match_reward=1.0)
    env.reset({"prompt": "48+39+11=", "answer": "98"})
    assert env.step("<|tool|>48+39")[:3] == ("=87", 1.3, False)
    assert env.step("<|tool|>87+10")[:3] == ("=97", pytest.approx(0.3 + 0.8), False)  # 4 of 5 right
    assert env.step("<|tool|>97+1")[:3] == ("=98", 0.0, False)
    assert env.step("98")[1:3] == (1.0, True)


def test_asking_by_prompt_computes_the_running_sums_whatever_the_call_says():
    env = Calculator(call_reward=0.2, ask="prompt")
    env.reset({"prompt": "48+39+11=", "answer": "98"})
    assert [env.step("<|tool|>")[:2] for _ in range(3)] == [("=87", 0.2), ("=98", 0.2), ("=", 0.0)]


def test_an_unknown_way_to_ask_is_refused():
    with pytest.raises(ValueError, match="ask must be 'argument' or 'prompt'"):
        Calculator(ask="both")


def test_a_fixed_width_display_pads_values_and_the_answer_is_right_padded_or_not():
    env = Calculator(ask="prompt", display_digits=4)
    env.reset({"prompt": "482+390=", "answer": "872"})
    assert env.step("<|tool|>")[0] == "=0872"
    assert env.step("0872")[1:3] == (1.0, True)
    for answer, score, success in (("872", 1.0, 1.0), ("0871", 0.75, 0.0)):
        env.reset({"prompt": "482+390=", "answer": "872"})
        _, reward, done, info = env.step(answer)
        assert (reward, done, info["success"]) == (score, True, success)
    env.reset({"prompt": "reverse me", "answer": "em"})  # not a number: scored as it is
    assert env.step("em")[1] == 1.0
