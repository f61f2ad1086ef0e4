"""reward.terms: a weighted mix of rules, the reward model and the user's function; its rules at expand
(hypothesis over hostile term maps) and the mix inside a real GRPO run."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcrl.data.config import DataConfig
from hpcrl.metrics.sinks import read_jsonl
from hpcrl.rewards.config import RewardConfig
from hpcrl.rewards.scoring import RewardError, build_scorer, rule_batch_scorer, score_batch, task_rule_scorer
from hpcrl.rewards.terms import SOURCES, WeightedScorer, reward_problems
from tests.cli_runs import run_cli

REPO = Path(__file__).resolve().parents[2]
GRPO = REPO / "templates" / "grpo_tiny.yaml"


def test_the_mix_is_the_weighted_sum_and_logs_each_terms_mean():
    """copy_digits' task rule (positional) + 0.5 x exact_match: 1.0 + 0.5, 2/3 + 0, 0 + 0."""
    scorer = build_scorer(RewardConfig(terms={"task": 1.0, "exact_match": 0.5}), DataConfig())
    assert isinstance(scorer, WeightedScorer) and scorer.__name__ == "1*task + 0.5*exact_match"
    scores = scorer(["412="] * 3, ["412", "41", "9"], ["412"] * 3)
    assert scores == [1.5, pytest.approx(2 / 3), 0.0]
    assert scorer.last_metrics == {
        "reward_term/task": pytest.approx((1 + 2 / 3) / 3),
        "reward_term/exact_match": pytest.approx(1 / 3),
    }


def _flaky(prompt, response, answer):
    if response == "boom":
        raise ZeroDivisionError("bad sample")
    return math.nan if response == "nan" else 1.0


def test_a_failing_term_fails_only_its_sample_and_names_the_term():
    scorer = WeightedScorer(
        [("task", 1.0, rule_batch_scorer(lambda p, r, a: 1.0)), ("flaky", 2.0, rule_batch_scorer(_flaky))]
    )
    result = score_batch(scorer, ["p"] * 3, ["ok", "boom", "nan"], ["a"] * 3, "skip")
    assert result.keep_B.tolist() == [True, False, False] and result.scores_B.tolist() == [3.0, 0.0, 0.0]
    assert "term flaky raised ZeroDivisionError: bad sample" in result.reasons[0]
    assert "term flaky returned nan" in result.reasons[1]
    assert result.metrics == {"reward_term/task": 1.0, "reward_term/flaky": 1.0}
    with pytest.raises(RewardError, match=r"sample 1 .*term flaky raised ZeroDivisionError"):
        score_batch(scorer, ["p"] * 3, ["ok", "boom", "nan"], ["a"] * 3, "error")


def test_a_term_returning_the_wrong_count_fails_every_sample_naming_it():
    scorer = WeightedScorer([("short", 1.0, lambda p, r, a: [1.0])])
    result = score_batch(scorer, ["p"] * 2, ["a", "b"], ["a"] * 2, "skip")
    assert (
        result.num_skipped == 2
        and "term short raised TermFailed: returned 1 scores for 2" in result.reasons[0]
    )


TEXT = st.one_of(
    st.sampled_from([*SOURCES, "", "Task", "a\nb", "\x00", "model ", "e\x1b[2J"]), st.text(max_size=8)
)
WEIGHT = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(-(10**30), 10**30),
    st.booleans(),
    st.text(max_size=3),
)


@settings(max_examples=300, deadline=None)
@given(terms=st.dictionaries(TEXT, WEIGHT, max_size=4))
def test_every_term_map_is_built_or_refused_naming_its_key(terms):
    """Any map: either the rules pass and the scorer builds (model and function given where named), or
    each problem names a reward key; never an exception of another kind."""
    reward = RewardConfig(terms=terms, model_path="/nonexistent/rm" if "model" in terms else None)
    problems = reward_problems(reward, DataConfig())
    valid = (
        bool(terms)
        and "function" not in terms
        and all(
            k in SOURCES and not isinstance(w, bool) and isinstance(w, int | float) and math.isfinite(w)
            for k, w in terms.items()
        )
    )
    assert (not problems) == valid, (terms, problems)
    assert all(p.key and p.key.startswith("reward.") for p in problems)
    if valid and "model" not in terms:
        assert len(build_scorer(reward, DataConfig()).terms) == len(terms)


@pytest.mark.parametrize(
    ("args", "key", "says"),
    [
        (["--reward.terms={task: 1, bleu: 1}"], "reward.terms", "unknown source 'bleu'"),
        (["--reward.terms={task: .inf}"], "reward.terms", "task: the weight must be a finite number, got inf"),
        (["--reward.terms={task: 1}", "--reward.name=format"], "reward.name", "reward.terms replaces reward.name"),
        (["--reward.terms={task: 1}", "--reward.model_path=/m"], "reward.model_path", "read only as the 'model' term"),
        (["--reward.terms={task: 1, function: 1}"], "reward.function", "the 'function' term needs reward.function"),
        (["--reward.name=bleu"], "reward.name", "unknown reward 'bleu'"),
        (["--reward.terms={task: 1}", "--data.source=jsonl", "--data.path=/x.jsonl"], "reward.terms", "built-in tasks"),
        (["--reward.name=task", "--data.source=jsonl", "--data.path=/x.jsonl"], "reward.name", "built-in tasks"),
    ],
)  # fmt: skip
def test_expand_refuses_a_bad_reward_naming_the_key(tmp_path, capsys, args, key, says):
    """Each is exit 2 at expand (before this, an unknown reward.name or the task reward on jsonl rows
    passed expand and failed first on the ranks); nothing is written."""
    code, _, err = run_cli(capsys, "expand", GRPO, f"--run_root={tmp_path}/runs", *args)
    assert code == 2 and f"{key}: " in err and says in err, err
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    "reward, source, scored",
    [
        (RewardConfig(name="model", model_path="rm"), "builtin", True),
        (RewardConfig(name="exact_match"), "builtin", True),
        (RewardConfig(name=None, terms={"task": 1.0, "model": 0.01}, model_path="rm"), "builtin", True),
        (RewardConfig(name=None, terms={"task": 2.0}), "builtin", True),  # a scaled rule is not the rule
        (RewardConfig(name=None, function="f.py:g"), "builtin", True),
        (RewardConfig(name="task"), "builtin", False),
        (RewardConfig(name=None, terms={"task": 1.0}), "builtin", False),
        (RewardConfig(name=None, terms={"task": 1.0, "model": 0.0}, model_path="rm"), "builtin", False),
        (RewardConfig(name="model", model_path="rm"), "jsonl", False),  # a file has no task rule
    ],
)
def test_held_out_is_also_scored_by_the_task_rule_when_the_reward_is_another(reward, source, scored):
    """RL's evaluation logs `reward/heldout_task` beside `reward/heldout` exactly when the training reward
    is not the built-in task's rule itself (a term of weight 0 is watched, not scored): the scorer is
    that rule, or None."""
    data = DataConfig(source=source, task="reverse_exact", path=None if source == "builtin" else "x.jsonl")
    scorer = task_rule_scorer(reward, data)
    assert (scorer is not None) == scored
    if scorer is not None:
        assert scorer(["1234="] * 3, ["4321", "1234", ""], ["4321"] * 3) == [1.0, 0.0, 0.0]


@pytest.mark.slow
def test_a_grpo_run_scored_by_the_task_rule_and_a_function_of_ones_own(tmp_path, capsys):
    """The task rule + 0.5 x a reward function from a file in a temp dir (a dict result with an extra
    number): every step logs both terms and the function's extra; reward/mean is the weighted sum of
    the terms' means (one rollout batch a step: no dynamic sampling)."""
    (tmp_path / "mine.py").write_text(
        "def brevity(prompts, responses, answers, extras):\n"
        "    return [{'score': 1.0 / (1 + len(r)), 'length': len(r)} for r in responses]\n"
    )
    args = [
        "run", GRPO, f"--run_root={tmp_path}/runs", "--algorithm.steps=4", "--algorithm.eval_every=0",
        "--algorithm.dynamic_sampling=false", "--reward.terms={task: 1.0, function: 0.5}",
        f"--reward.function={tmp_path}/mine.py:brevity", "--logging.tensorboard=false",
        "--logging.progress=false", "--logging.plot=false", "--checkpoint.save_on_exit=false", "--checkpoint.export_hf=false",
    ]  # fmt: skip
    code, _, err = run_cli(capsys, *args)
    assert code == 0, err
    [metrics] = list((tmp_path / "runs").glob("*/*/metrics.jsonl"))
    rows = [r for r in read_jsonl(metrics) if "reward/mean" in r]
    assert len(rows) == 4
    for r in rows:
        assert r["reward/mean"] == pytest.approx(
            r["reward_term/task"] + 0.5 * r["reward_term/function"], abs=1e-6
        )
        assert r["reward_fn/length"] > 0 and 0 < r["reward_term/function"] < 1
