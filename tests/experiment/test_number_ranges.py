"""Every number has its range at `expand` (issue 43, item 4), and a value that nothing reads is an error.

A range is part of its field's type (hpcrl.config.ranges): a template, a `--key VALUE` override and a sweep
value outside it are refused as the value is read, exit 2 naming the file (or "command line") and key,
before anything is written. Before: `optim.micro_batch_size 0`, `optim.lr nan`, `data.train_size 0` and
the like passed `expand` and `plan` and failed on the ranks; `--rm.steps 10^30` passed.
"""

from __future__ import annotations

import json
import math
import typing
from pathlib import Path

import pytest

from hpcrl.cli import main
from hpcrl.config.schema import leaf_types, range_of, range_problems
from hpcrl.experiment.config import ExperimentConfig

REPO = Path(__file__).resolve().parents[2]
GRPO, SFT, RM, DPO = (REPO / "templates" / f"{n}_tiny.yaml" for n in ("grpo", "sft", "rm", "dpo"))
UNRANGED = {"reward.terms", "rollout.env_args"}
"""Numbers without a field range: each term's weight is checked by hpcrl.rewards.terms (finite); the
environment's constructor arguments are its own to check (expand checks each is a keyword and finite,
hpcrl.experiment.kinds.rl)."""


def _is_number(hint) -> bool:
    """int or float, optional, or a container of them (a Literal of names is not a number)."""
    if typing.get_origin(hint) is typing.Literal:
        return False
    return hint in (int, float) or any(_is_number(arg) for arg in typing.get_args(hint))


def test_every_number_of_the_config_has_a_range_and_every_default_is_in_it():
    unranged = sorted(
        key
        for key, hint in leaf_types(ExperimentConfig).items()
        if _is_number(hint) and range_of(hint) is None and key not in UNRANGED
    )
    assert unranged == []
    assert range_problems(ExperimentConfig()) == []


def _expand(capsys, template: Path, *args: str) -> str:
    code = main(["expand", str(template), *args])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize(
    ("template", "key", "value", "message"),
    [
        (SFT, "optim.micro_batch_size", "0", "must be in [1, 2^20], got 0"),
        (SFT, "optim.micro_batch_size", "-2", "must be in [1, 2^20], got -2"),
        (SFT, "optim.lr", ".nan", "must be a finite number >= 0, got nan"),
        (SFT, "optim.lr", ".inf", "must be a finite number >= 0, got inf"),
        (SFT, "optim.lr", "-1", "must be >= 0, got -1.0"),
        (SFT, "optim.grad_clip", ".nan", "must be a finite number >= 0, got nan"),
        (SFT, "optim.betas", "[0.9, 1.0]", "must be in [0, 1), got 1.0"),
        (SFT, "data.heldout_size", "-1", "must be in [0, 2^31], got -1"),
        (SFT, "data.train_size", "0", "must be in [1, 2^31], got 0"),
        (SFT, "data.max_prompt_length", "0", "must be in [1, 2^24], got 0"),
        (RM, "rm.steps", str(10**30), f"must be in [1, 10^8], got {10**30}"),
        (DPO, "dpo.beta", "-0.1", "must be > 0, got -0.1"),
        (GRPO, "rollout.top_p", "0", "must be in (0, 1], got 0.0"),
        (GRPO, "algorithm.gamma", "1.5", "must be in [0, 1], got 1.5"),
        (GRPO, "checkpoint.keep_last", "0", "must be in [1, 2^16], got 0"),
        (GRPO, "reward.timeout_s", "0", "must be in (0, 86400], got 0.0"),
        (GRPO, "seed", "-1", "must be in [0, 2^63-1], got -1"),
    ],
)
def test_a_number_outside_its_range_is_named_on_the_command_line(capsys, template, key, value, message):
    err = _expand(capsys, template, f"--{key}", value)
    assert f"command line:{key}: out of range: {message}" in err


def test_a_number_outside_its_range_is_named_in_its_template_and_sweep(tmp_path, capsys):
    template = tmp_path / "t.yaml"
    template.write_text(
        f"extends: {SFT}\nrun_root: {tmp_path / 'runs'}\noptim: {{lr: .nan}}\n"
        "sweep: {grid: {sft.steps: [4, 0]}, list: [{data.heldout_size: -3}]}\n"
    )
    err = _expand(capsys, template)
    assert f"{template}:optim.lr: out of range: must be a finite number >= 0, got nan" in err
    assert f"{template}:sweep.grid.sft.steps[1]: out of range: must be in [1, 10^8], got 0" in err
    assert f"{template}:sweep.list[0].data.heldout_size[0]: out of range: " in err
    assert not (tmp_path / "runs").exists()


def test_a_config_built_in_code_is_checked_by_the_same_ranges():
    cfg = ExperimentConfig()
    cfg.optim.lr = math.nan
    cfg.cluster.nodes = 0
    assert {p.key for p in range_problems(cfg)} == {"optim.lr", "cluster.nodes"}


def test_the_sft_token_budget_holds_a_row(capsys):
    err = _expand(capsys, SFT, "--optim.max_tokens_per_micro_batch", "1")
    assert "command line:optim.max_tokens_per_micro_batch: 1 tokens cannot hold the longest sequence" in err


@pytest.mark.parametrize(
    ("template", "args", "key", "says"),
    [
        (GRPO, ("--reward.model_path", "/nonexistent"), "reward.model_path", "only a reward model reads it"),
        (DPO, ("--dpo.desirable_weight", "2"), "dpo.desirable_weight", "only loss_type kto reads it"),
        (DPO, ("--dpo.undesirable_weight", "0.5"), "dpo.undesirable_weight", "only loss_type kto reads it"),
        (GRPO, ("--data.path", "x.jsonl"), "data.path", "data.source builtin generates its rows"),
        (GRPO, ("--reward.name", "null"), "reward.name", "null names no reward"),
        (
            GRPO,
            ("--reward.name", "exact_match", "--reward.terms", "{task: 1.0}"),
            "reward.name",
            "reward.terms replaces reward.name: leave reward.name out (or null), not 'exact_match'",
        ),
    ],
)
def test_a_value_that_does_nothing_is_an_error_naming_what_would_read_it(capsys, template, args, key, says):
    err = _expand(capsys, template, *args)
    assert f"command line:{key}: {says}" in err


def test_null_reward_name_with_terms_is_what_terms_expect(capsys):
    assert main(["expand", str(GRPO), "--reward.name", "null", "--reward.terms", "{task: 1.0}"]) == 0


@pytest.mark.parametrize(
    ("config", "problem"),
    [
        ({"model_type": "llama"}, "a reward model has one label (a scalar score), this one has 2"),
        ({"model_type": "llama", "id2label": {"0": "a", "1": "b"}}, "this one has 2"),
        (None, "not valid JSON"),
        ({"model_type": "llama", "id2label": {"0": "LABEL_0"}}, None),
    ],
)
def test_the_hf_reward_models_config_is_checked_at_expand(tmp_path, capsys, config, problem):
    model = tmp_path / "rm"
    model.mkdir()
    (model / "config.json").write_text("{not json" if config is None else json.dumps(config))
    args = [str(GRPO), "--reward.name", "model", "--reward.model_path", str(model)]
    code = main(["expand", *args])
    err = capsys.readouterr().err
    if problem is None:
        assert code == 0, err
    else:
        assert code == 2 and "command line:reward.model_path: " in err and problem in err, err
