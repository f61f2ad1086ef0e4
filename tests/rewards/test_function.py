"""`reward.function` (hpcrl.rewards.function): a reward of one's own from a file next to the template
drives a GRPO run through the command a user runs; every bad function is exit 2 at `expand` without
running it; at run time a raising, hanging, miscounting or non-finite function is handled by nan_policy."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from hpcrl.rewards.function import FunctionScorer, function_problems
from hpcrl.rewards.scoring import RewardError, score_batch
from hpcrl.usercode.spec import source_sha256
from tests.cli_runs import run_cli
from tests.templates import GRPO, write_grpo_template

REPO = Path(__file__).resolve().parents[2]

DIGITS = """\
calls = []

def digits(prompts, responses, answers, extras):
    calls.append(len(responses))
    return [
        {"score": float(r.strip() == a.strip()), "length": len(r), "flag": True}
        for r, a in zip(responses, answers)
    ]
"""


def _template(directory: Path, function: str) -> Path:
    return write_grpo_template(
        directory, "fn", steps=3, eval_every=0, extra=f"reward: {{function: '{function}'}}\n"
    )


def test_a_function_in_a_file_next_to_the_template_drives_a_grpo_run(tmp_path, capsys, monkeypatch):
    (tmp_path / "rewards").mkdir()
    (tmp_path / "rewards" / "mine.py").write_text(DIGITS)
    template = _template(tmp_path, "rewards/mine.py:digits")
    monkeypatch.chdir(REPO)  # the path is the template's, not the working directory's
    code, out, err = run_cli(capsys, "run", template)
    assert code == 0, err
    run_dir = Path(out.splitlines()[0].removeprefix("run dir: "))
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 3 and all(r["reward_fn/length"] > 0 for r in rows)  # the extra number, logged
    assert not any("reward_fn/flag" in r for r in rows)  # a bool is not a number
    assert all(0.0 <= r["reward/mean"] <= 1.0 for r in rows)
    config = (run_dir / "config.yaml").read_text()
    assert f"{tmp_path / 'rewards' / 'mine.py'}:digits" in config  # made absolute at expand
    digest = source_sha256(f"{tmp_path / 'rewards' / 'mine.py'}:digits")
    identity = json.loads((run_dir / "run.json").read_text())
    assert identity["code"] == {
        "reward.function": f"{tmp_path / 'rewards' / 'mine.py'}:digits sha256={digest}"
    }


def test_the_sweep_manifest_records_each_functions_digest(tmp_path, capsys):
    (tmp_path / "mine.py").write_text(DIGITS)
    template = _template(tmp_path, "mine.py:digits")
    assert run_cli(capsys, "submit", template, "--dry-run", "--sweep_dir", tmp_path / "sweep")[0] == 0
    manifest = json.loads((tmp_path / "sweep" / "manifest.json").read_text())
    spec = f"{tmp_path / 'mine.py'}:digits"
    assert manifest["code"] == {spec: source_sha256(spec)}


BAD_FUNCTIONS = [
    ("missing.py:digits", None, "No such file"),
    ("mine.py:nothing", DIGITS, "defines no top-level function 'nothing'"),
    ("mine.py:digits", "def digits(prompts, responses):\n    return []\n", "must take these four positional"),
    ("mine.py:digits", "def digits(a, b, c, d, e):\n    return []\n", "must take these four positional"),
    ("mine.py:digits", "def digits(:\n", "cannot read the reward function's source"),
    ("mine.py:digits", b"\xff\xfe not utf-8", "cannot read the reward function's source"),
    ("mine.py:digits", "digits = lambda p, r, a, e: []\n", "defines no top-level function"),
    ("mine.py", DIGITS, "expected 'path/to/file.py:function'"),
    ("mine.py:digits:x", DIGITS, "expected 'path/to/file.py:function'"),
    ("no_such_package_xyz.rewards:digits", None, "is not found on the Python path"),
    ("os:getcwd", None, "defines no top-level function 'getcwd'"),  # found, read, not run
]


@pytest.mark.parametrize("spec, source, says", BAD_FUNCTIONS)
def test_a_bad_function_is_exit_2_at_expand_naming_the_key(tmp_path, capsys, spec, source, says):
    if source is not None:
        path = tmp_path / "mine.py"
        path.write_bytes(source if isinstance(source, bytes) else source.encode())
    code, out, err = run_cli(capsys, "expand", _template(tmp_path, spec))
    assert code == 2 and "reward.function" in err and says in err, err


def test_a_directory_a_fifo_or_a_huge_file_is_refused_without_blocking(tmp_path):
    (tmp_path / "dir.py").mkdir()
    os.mkfifo(tmp_path / "fifo.py")
    (tmp_path / "big.py").write_bytes(b"#" * ((1 << 20) + 1))
    for name in ("dir.py", "fifo.py", "big.py"):
        [problem] = function_problems(f"{tmp_path / name}:f")
        assert problem.key == "reward.function" and "cannot read" in problem.message, problem


def test_reward_name_and_function_together_and_a_bad_timeout_are_refused(tmp_path, capsys):
    (tmp_path / "mine.py").write_text(DIGITS)
    template = _template(tmp_path, "mine.py:digits")
    code, _, err = run_cli(capsys, "expand", template, "--reward.name", "exact_match")
    assert code == 2 and "reward.function replaces reward.name" in err, err
    code, _, err = run_cli(capsys, "expand", template, "--reward.timeout_s", "0")
    assert code == 2 and "command line:reward.timeout_s: out of range: must be in (0, 86400], got 0.0" in err


def _scorer(tmp_path: Path, body: str, timeout_s: float = 120.0) -> FunctionScorer:
    (tmp_path / "f.py").write_text(body)
    return FunctionScorer(f"{tmp_path / 'f.py'}:f", timeout_s)


PROMPTS, RESPONSES, ANSWERS = ["p0", "p1"], ["r0", "r1"], ["a0", "a1"]


@pytest.mark.parametrize(
    "body, says",
    [
        ("def f(p, r, a, e):\n    raise KeyError('boom')\n", "KeyError: 'boom'"),
        ("def f(p, r, a, e):\n    return [1.0]\n", "returned 1 results for 2 responses"),
        ("def f(p, r, a, e):\n    return 3.0\n", "returned float results for 2 responses"),
        ("def f(p, r, a, e):\n    return ['1', '2']\n", "not a number or a dict with 'score'"),
        (
            "import time\ndef f(p, r, a, e):\n    time.sleep(60)\n",
            "did not return within 0.2 s: its processes were killed",
        ),
    ],
)
def test_a_failing_call_fails_every_sample_by_nan_policy(tmp_path, body, says):
    # only the sleeping call is meant to time out: on a busy machine a late thread start must not turn
    # the others into timeouts too (60 s of sleep against 0.2 s cannot go the other way)
    scorer = _scorer(tmp_path, body, timeout_s=0.2 if "time.sleep" in body else 120)
    with pytest.raises(RewardError, match="sample 0") as err:
        score_batch(scorer, PROMPTS, RESPONSES, ANSWERS, "error")
    assert says in str(err.value) and "f.py:f" in str(err.value)
    skipped = score_batch(scorer, PROMPTS, RESPONSES, ANSWERS, "skip")
    assert skipped.num_skipped == 2 and skipped.keep_B.tolist() == [False, False]


def test_a_non_finite_score_fails_only_its_sample(tmp_path):
    scorer = _scorer(tmp_path, "def f(p, r, a, e):\n    return [{'score': float('nan'), 'x': 1}, 0.5]\n")
    result = score_batch(scorer, PROMPTS, RESPONSES, ANSWERS, "skip")
    assert result.keep_B.tolist() == [False, True] and result.scores_B.tolist() == [0.0, 0.5]
    assert result.metrics == {"reward_fn/x": 1.0}
    with pytest.raises(RewardError, match="sample 0.*returned nan"):
        score_batch(scorer, PROMPTS, RESPONSES, ANSWERS, "error")


@pytest.mark.parametrize("spec", ["mine\n.py:digits", "mine\x1b[2J.py:digits", "a" * 2000 + ".py:digits"])
def test_control_characters_and_overlong_paths_are_refused_by_the_path_rule(tmp_path, capsys, spec):
    template = tmp_path / "t.yaml"
    template.write_text(f"extends: {GRPO}\nrun_root: {tmp_path / 'runs'}\n")
    code, _, err = run_cli(capsys, "expand", template, "--reward.function", spec)
    assert code == 2 and "reward.function" in err and "\x1b" not in err, err


HANGS_ONCE = """\
import os, time
from pathlib import Path

def hangs_once(prompts, responses, answers, extras):
    marker = Path(__file__).with_name("hung_pid")
    if not marker.exists():
        marker.write_text(str(os.getpid()))
        time.sleep(3600)
    return [float(r.strip() == a.strip()) for r, a in zip(responses, answers)]
"""


@pytest.mark.parametrize("policy", ["skip", "error"])
def test_a_hung_function_is_killed_and_the_run_goes_on_or_stops_by_nan_policy(tmp_path, capsys, policy):
    """The first batch's call hangs: at reward.timeout_s its worker is killed (checked by PID); under
    skip that batch's samples are dropped and the run completes, under error it stops naming the function."""
    (tmp_path / "mine.py").write_text(HANGS_ONCE)
    template = _template(tmp_path, "mine.py:hangs_once")
    args = ("run", template, "--reward.timeout_s", "3", "--reward.nan_policy", policy)
    if policy == "error":
        with pytest.raises(RewardError) as err:  # a one-rank run raises in this process
            run_cli(capsys, *args)
        assert f"reward {tmp_path / 'mine.py'}:hangs_once raised UserCodeTimeout" in str(err.value)
        assert "did not return within 3 s: its processes were killed" in str(err.value)
    else:
        code, out, err = run_cli(capsys, *args)
        assert code == 0, err
        run_dir = Path(out.splitlines()[0].removeprefix("run dir: "))
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        assert len(rows) == 3 and rows[0]["reward/skipped"] > 0 and rows[1]["reward/skipped"] == 0
    stat = Path(f"/proc/{int((tmp_path / 'hung_pid').read_text())}/stat")
    assert not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] == "Z"
