"""Environments of the tests, loaded by file path in hpcrl's environment workers (never imported by the
tests themselves)."""

import os
import time


class Echo:
    """Deterministic: observation `=<turn><last digit of the prompt>` after each turn, reward 0.25 per
    turn, done after `turns` turns."""

    def __init__(self, turns: int = 99):
        self.turns, self.taken, self.prompt = turns, 0, ""

    def reset(self, example):
        self.prompt, self.taken = example["prompt"], 0
        return ""

    def step(self, action):
        if self.prompt.startswith("slow"):
            time.sleep(0.3)
        self.taken += 1
        digit = [c for c in self.prompt if c.isdigit()][-1]
        return f"={self.taken}{digit}", 0.25, self.taken >= self.turns, {"taken": self.taken}


class Hostile:
    """Misbehaves on prompts that ask it to: `hang` sleeps forever, `raise` raises, `str` returns a
    non-string observation, `exit` ends its process, `nan` a NaN reward, `spam` prints 1 MB; anything
    else behaves (observation "=1", reward 1, done after one step)."""

    def reset(self, example):
        self.mode = example["prompt"].split(":")[0]
        return ""

    def step(self, action):
        if self.mode == "hang":
            while True:
                time.sleep(1)
        if self.mode == "raise":
            raise RuntimeError("the environment broke")
        if self.mode == "str":
            return 42, 1.0, True, {}
        if self.mode == "exit":
            os._exit(3)
        if self.mode == "nan":
            return "=1", float("nan"), True, {}
        if self.mode == "spam":
            print("x" * (1 << 20))
        if self.mode == "huge":
            return "=1", 10**400, True, {}
        if self.mode == "flood":
            return "=" + "1" * (16 << 20), 1.0, True, {}
        if self.mode == "flood_messages":
            return (
                [{"role": "tool", "content": "2" * (8 << 20)}, {"role": "user", "content": "3" * 99}],
                1.0,
                True,
                {},
            )
        if self.mode == "info":
            return "=1", 1.0, True, {"turns": 99.0, "calls": 2, **{f"k{i}": i for i in range(100)}}
        if self.mode.startswith("slow"):
            time.sleep(0.2)
        return "=1", 1.0, True, {}


class Counting:
    """Counts its resets in a file (`path`): how often an episode was rebuilt by replay."""

    def __init__(self, path: str):
        self.path = path
        self.actions = []

    def reset(self, example):
        with open(self.path, "a") as f:
            f.write(example["prompt"] + "\n")
        self.actions = []
        return ""

    def step(self, action):
        self.actions.append(action)
        return "=" + str(len(self.actions)), float(len(self.actions)), len(self.actions) >= 3, {}


class RaisesOnSevens:
    """The Calculator's task, but a step raises on prompts that start with 7 (about a tenth of them)."""

    def reset(self, example):
        self.prompt, self.answer = example["prompt"], example["answer"]
        return ""

    def step(self, action):
        if self.prompt.startswith("7"):
            raise ValueError("sevens are not allowed")
        return "", float(action == self.answer), True, {}


class RankBound:
    """What a copy of it on each rank of a replica would disagree on: observation `=<RANK>` and, on any
    rank but 0, a step that never returns (a timeout on one rank only)."""

    def reset(self, example):
        return ""

    def step(self, action):
        rank = os.environ.get("RANK", "?")
        while rank != "0":
            time.sleep(1)
        return f"={rank}", 0.5, False, {}


class ChatTool:
    """Answers each turn with chat messages: a tool message `=<turn>` (and a user nudge when `nudge`),
    reward 1 per turn, done after 2 turns."""

    def __init__(self, nudge: bool = False):
        self.nudge, self.taken = nudge, 0

    def reset(self, example):
        self.taken = 0
        return ""

    def step(self, action):
        self.taken += 1
        messages = [{"role": "tool", "content": f"={self.taken}"}]
        if self.nudge:
            messages.append({"role": "user", "content": "0"})
        return messages, 1.0, self.taken >= 2, {}
