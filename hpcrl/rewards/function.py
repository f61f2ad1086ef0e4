"""A reward of the user's own: `reward.function: path/to/file.py:name` or `package.module:name`.

The function is called once per batch (verl's and OpenRLHF's custom reward convention):

    def name(prompts: list[str], responses: list[str], answers: list[str], extras: list[dict]) -> list

and returns one entry per response: a number, or a dict with a number under `score` and more numbers
under other keys (their means over the batch are logged as `reward_fn/<key>`). `extras` holds one dict per
sample (empty today; per-row fields of richer data sources go there).

It is code, like `entrypoint`: `function_problems` checks it at `expand` WITHOUT running it (the file
exists, is a regular UTF-8 file of at most MAX_SOURCE_BYTES, parses, defines `name` at top level with a
signature that takes the four arguments; a module is found on sys.path without importing it), and only
a worker process of each rank imports it (hpcrl.usercode.runner: started once, reused across batches,
its process group killed at `reward.timeout_s`, its output captured and capped, its memory bounded). A file path is relative to the template that sets it (hpcrl.experiment.resolve
makes it absolute). Its sha256 is recorded in the run's run.json and in the sweep manifest.

At run time (FunctionScorer) a call that raises, runs past `reward.timeout_s` (then killed, with every
process it started), dies, returns the wrong count or a non-number is a failure of every sample of the batch, and a non-finite score a failure of its sample:
`reward.nan_policy` decides (error: stop, naming the function and the sample; skip: drop them).
"""

from __future__ import annotations

import ast
import math
from collections.abc import Sequence

from hpcrl.errors import Problem, cut, short
from hpcrl.usercode.runner import DEFAULT_MEMORY_BYTES, UserCodeError, UserCodeRunner
from hpcrl.usercode.spec import read_source_tree

KEY = "reward.function"
ARGUMENTS = ("prompts", "responses", "answers", "extras")
MAX_KEY_CHARS = 64
"""An extra number's key is logged as reward_fn/<key>, printable and at most this long."""


def function_problems(text: str) -> list[Problem]:
    """Why `text` cannot name a reward function (see the module docstring); nothing is executed."""
    found = read_source_tree(text, KEY, "reward function")
    if isinstance(found, list):
        return found
    spec, tree = found
    return [Problem(p, file=str(spec.source_file()), key=KEY) for p in _definition_problems(tree, spec.name)]


def _definition_problems(tree: ast.Module, name: str) -> list[str]:
    defs = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name]
    if not defs:
        return [f"defines no top-level function {name!r} (a plain `def`)"]
    args = defs[-1].args
    positional = [*args.posonlyargs, *args.args]
    required = len(positional) - len(args.defaults) + sum(d is None for d in args.kw_defaults)
    if (len(positional) < len(ARGUMENTS) and args.vararg is None) or required > len(ARGUMENTS):
        return [
            f"{name}({', '.join(a.arg for a in positional)}) cannot be called as "
            f"{name}({', '.join(ARGUMENTS)}): it must take these four positional arguments"
        ]
    return []


class FunctionScorer:
    """A BatchScorer over a user function: scores (or an Exception per failed sample) and the extra
    numbers of dict results, averaged over the batch (`last_metrics`: reward_fn/<key>)."""

    def __init__(self, text: str, timeout_s: float, *, memory_bytes: int = DEFAULT_MEMORY_BYTES):
        self.__name__ = text
        self.runner = UserCodeRunner(text, timeout_s=timeout_s, memory_bytes=memory_bytes)
        self.last_metrics: dict[str, float] = {}

    def __call__(
        self, prompts: Sequence[str], responses: Sequence[str], answers: Sequence[str]
    ) -> list[float | Exception]:
        self.last_metrics = {}
        n = len(responses)
        try:
            values = self.runner.call(list(prompts), list(responses), list(answers), [{} for _ in range(n)])
        except UserCodeError as err:  # raised, timed out (its processes killed) or died: every sample failed
            return [err] * n
        if not isinstance(values, Sequence) or isinstance(values, str | bytes) or len(values) != n:
            count = len(values) if isinstance(values, Sequence) else type(values).__name__
            return [ValueError(f"returned {count} results for {n} responses")] * n
        scores, extras = [], {}
        for value in values:
            score = value.get("score") if isinstance(value, dict) else value
            if type(score) not in (int, float):
                scores.append(
                    TypeError(f"returned {short(repr(value))}, not a number or a dict with 'score'")
                )
                continue
            scores.append(float(score))
            for key, extra in value.items() if isinstance(value, dict) else ():
                if key != "score" and type(extra) in (int, float) and math.isfinite(extra):
                    extras.setdefault(cut(str(key), MAX_KEY_CHARS), []).append(float(extra))
        self.last_metrics = {f"reward_fn/{key}": sum(v) / len(v) for key, v in extras.items()}
        return scores
