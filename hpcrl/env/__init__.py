"""Multi-turn environments: what a rollout talks to between the model's turns (tools, games, graders).

A user writes an environment as a class in a file, named like a reward function (`rollout.env:
path/to/file.py:ClassName` or `package.module:ClassName`):

    class MyEnv:
        def __init__(self, **env_args): ...              # rollout.env_args
        def reset(self, example: dict) -> str: ...        # {"prompt": ..., "answer": ...} -> observation
        def step(self, action: str) -> tuple[str, float, bool, dict]:
            ...                                           # the model's turn -> (observation, reward, done, info)

| file        | role                                                                                   |
|-------------|----------------------------------------------------------------------------------------|
| spec.py     | `environment_problems`: the class is found and defines reset and step, checked at expand without running it |
| result.py   | `StepResult` and the check of what an environment returned (text, a finite number, a bool) |
| tools.py    | tool calls in a turn's text: the tiny tag syntax (`<|tool|>...`), Hermes/Qwen JSON `<tool_call>` blocks; a bounded arithmetic evaluator |
| builtin.py  | the built-in environments (`hpcrl.env.builtin:Calculator`, ...) |
| host.py     | `EnvHost`, in the user-code worker: one environment per episode, each step in a thread of its own bounded by the timeout, an episode it lost rebuilt by replaying its actions |
| pool.py     | `EnvPool`, in the rank: episodes spread over `rollout.env_workers` killable worker processes (hpcrl.usercode.runner) |

An environment must be deterministic given its example and the actions so far: an episode whose worker was
killed (another episode's step hung) is rebuilt on a fresh worker by replaying them.
"""
