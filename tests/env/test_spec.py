"""`rollout.env` and the episode keys at `expand`: every bad environment is exit 2 naming the key,
without running its code."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from hpcrl.env.spec import environment_problems
from tests.cli_runs import run_cli

TOOL = Path(__file__).resolve().parents[2] / "templates" / "tool_tiny.yaml"

GOOD = "class Env:\n    def reset(self, example):\n        return ''\n    def step(self, action):\n        return '', 1.0, True, {}\n"


def _template(directory: Path, env: str, extra: str = "") -> Path:
    template = directory / "t.yaml"
    template.write_text(
        f"extends: {TOOL}\nname: envcheck\nrun_root: {directory / 'runs'}\nrollout:\n  env: '{env}'\n{extra}"
    )
    return template


BAD_ENVIRONMENTS = [
    ("missing.py:Env", None, "No such file"),
    ("env.py:Other", GOOD, "defines no top-level class 'Other'"),
    ("env.py:Env", "class Env:\n    def reset(self, example):\n        return ''\n", "does not define step"),
    ("env.py:Env", "class Env:\n    pass\n", "does not define reset and step"),
    ("env.py:Env", "def Env():\n    pass\n", "defines no top-level class 'Env'"),
    (
        "env.py:Env",
        "class Base:\n    def reset(self, e): ...\nclass Env(Base):\n    pass\n",
        "does not define step",
    ),
    ("env.py:Env", "class Env(\n", "cannot read the environment's source"),
    ("env.py:Env", b"\xff\xfe", "cannot read the environment's source"),
    ("env.py", GOOD, "expected 'path/to/file.py:function'"),
    ("no_such_package_xyz.envs:Env", None, "is not found on the Python path"),
    ("hpcrl.env.builtin:Nothing", None, "defines no top-level class 'Nothing'"),
]


@pytest.mark.parametrize("spec, source, says", BAD_ENVIRONMENTS)
def test_a_bad_environment_is_exit_2_at_expand_naming_the_key(tmp_path, capsys, spec, source, says):
    if source is not None:
        (tmp_path / "env.py").write_bytes(source if isinstance(source, bytes) else source.encode())
    code, _, err = run_cli(capsys, "expand", _template(tmp_path, spec))
    assert code == 2 and "rollout.env" in err and says in err, err


def test_inherited_methods_count_and_a_base_from_elsewhere_is_trusted(tmp_path):
    (tmp_path / "env.py").write_text(
        "import gymnasium\nclass Base:\n    def reset(self, e): ...\n    def step(self, a): ...\n"
        "class Env(Base):\n    pass\nclass Gym(gymnasium.Env):\n    pass\nclass Loop(Loop):\n    pass\n"
    )
    assert environment_problems(f"{tmp_path / 'env.py'}:Env") == []
    assert environment_problems(f"{tmp_path / 'env.py'}:Gym") == []  # may inherit: the ranks' error
    [loop] = environment_problems(f"{tmp_path / 'env.py'}:Loop")
    assert "does not define reset and step" in loop.message


def test_a_fifo_or_a_directory_is_refused_without_blocking(tmp_path):
    os.mkfifo(tmp_path / "fifo.py")
    (tmp_path / "dir.py").mkdir()
    for name in ("fifo.py", "dir.py"):
        [problem] = environment_problems(f"{tmp_path / name}:Env")
        assert problem.key == "rollout.env" and "cannot read" in problem.message


@pytest.mark.parametrize(
    "option, value, says",
    [
        ("--rollout.max_turns", "0", "rollout.max_turns: out of range"),
        ("--rollout.env_timeout_s", "0", "rollout.env_timeout_s: out of range"),
        ("--rollout.env_workers", "0", "rollout.env_workers: out of range"),
        ("--rollout.max_observation_tokens", "-1", "rollout.max_observation_tokens: out of range"),
        ("--algorithm.overlong_buffer_len", "2", "algorithm.overlong_buffer_len: DAPO's length penalty"),
        (
            "--model.max_position_embeddings",
            "24",
            "model.max_position_embeddings: max_prompt_length + an episode's tokens (rollout.response_tokens) = 28 exceeds the model's context 24",
        ),
    ],
)
def test_episode_numbers_out_of_range_are_exit_2(tmp_path, capsys, option, value, says):
    (tmp_path / "env.py").write_text(GOOD)
    code, _, err = run_cli(capsys, "expand", _template(tmp_path, "env.py:Env"), option, value)
    assert code == 2 and says in err, err


def test_episode_keys_without_an_environment_are_refused(tmp_path, capsys):
    template = tmp_path / "t.yaml"
    template.write_text(
        f"extends: {TOOL}\nname: noenv\nrollout:\n  env: null\n  max_turns: 3\nreward:\n  name: task\n"
    )
    code, _, err = run_cli(capsys, "expand", template)
    assert code == 2 and "rollout.max_turns: only a multi-turn environment reads it" in err, err


def test_reward_name_null_needs_an_environment(tmp_path, capsys):
    template = tmp_path / "t.yaml"
    template.write_text(f"extends: {TOOL}\nname: noenv\nrollout:\n  env: null\n  max_turns: 1\n")
    code, _, err = run_cli(capsys, "expand", template)
    assert code == 2 and "reward.name" in err and "null names no reward" in err, err


def test_a_relative_environment_path_means_the_templates_directory(tmp_path, capsys, monkeypatch):
    (tmp_path / "env.py").write_text(GOOD)
    monkeypatch.chdir("/")
    code, out, err = run_cli(capsys, "expand", _template(tmp_path, "env.py:Env"), "--json")
    assert code == 0, err
    assert json.loads(out.splitlines()[0])["config"]["rollout"]["env"] == f"{tmp_path / 'env.py'}:Env"


@pytest.mark.parametrize(
    "args, says",
    [
        ("{'not a name': 1}", "'not a name' is not a keyword argument name"),
        ("{class: 1}", "'class' is not a keyword argument name"),
        ("{rate: .nan}", "rate: nan is not a finite number"),
        ("{rate: .inf}", "rate: inf is not a finite number"),
    ],
)
def test_env_args_must_be_keywords_and_finite(tmp_path, capsys, args, says):
    (tmp_path / "env.py").write_text(GOOD)
    code, _, err = run_cli(capsys, "expand", _template(tmp_path, "env.py:Env", f"  env_args: {args}\n"))
    assert code == 2 and f"rollout.env_args: {says}" in err, err


@pytest.mark.parametrize(
    "spec", ["env\n.py:Env", "env\x1b[2J.py:Env", "a" * 2000 + ".py:Env", "$(touch x).py:Env"]
)
def test_control_characters_overlong_and_shell_text_in_the_path_are_refused(tmp_path, capsys, spec):
    code, _, err = run_cli(capsys, "expand", _template(tmp_path, "env.py:Env"), "--rollout.env", spec)
    assert code == 2 and "rollout.env" in err and "\x1b" not in err, err
    assert not (tmp_path / "x").exists() and not (Path.cwd() / "x").exists()  # nothing is run
