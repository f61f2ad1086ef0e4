"""What an environment's step returned, checked (hpcrl.env.result): text or chat messages as the
observation; anything else, and hostile messages, fail the episode with a message saying what."""

from __future__ import annotations

import pytest

from hpcrl.data.chat import Message
from hpcrl.env.result import MAX_OBSERVATION_MESSAGES, EnvOutputError, checked_reset, checked_step


def test_messages_are_an_observation():
    result = checked_step(
        [[{"role": "tool", "content": "=872"}, {"role": "user", "content": "go"}], 0.5, False]
    )
    assert result.observation == (Message("tool", "=872"), Message("user", "go"))
    assert (result.reward, result.done) == (0.5, False)
    assert checked_step([[], 0, True]).observation == ""  # no message: nothing to show


@pytest.mark.parametrize(
    ("observation", "says"),
    [
        ({"role": "tool", "content": "x"}, "not a string or a list of messages"),
        ([{"role": "assistant", "content": "x"}], "the model writes the assistant's turns"),
        ([{"role": "tool", "content": 7}], "content is a int"),
        ([{"role": "robot", "content": "x"}], "role 'robot'"),
        ([{"role": "tool"}], "has no 'content'"),
        ([{"role": "tool", "content": "x", "name": "calc"}], "unsupported keys"),
        (["=1"], "not a {role, content} mapping"),
        ([{"role": "tool", "content": "x"}] * (MAX_OBSERVATION_MESSAGES + 1), "at most 64"),
        ([{"role": "tool\x00\n" * 500, "content": "x"}], "role"),
    ],
)
def test_hostile_messages_fail_the_episode_saying_what(observation, says):
    with pytest.raises(EnvOutputError) as info:
        checked_step([observation, 1.0, True, {}])
    assert says in str(info.value) and len(str(info.value)) < 1000


def test_reset_returns_text_only():
    with pytest.raises(EnvOutputError, match="a chat opening is the data's prompt"):
        checked_reset([{"role": "user", "content": "x"}])
