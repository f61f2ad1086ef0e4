"""The stage tag: each stage reads the shared sections and its own; another stage's section is refused
at expand naming file and key, a resolved element holds only its stage's sections, --help-config STAGE
lists only what a stage reads, and the element runs its stage's entrypoint."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcrl.config.schema import leaf_types
from hpcrl.errors import ConfigError
from hpcrl.experiment.config import ExperimentConfig, StageName
from hpcrl.experiment.reference import reference
from hpcrl.experiment.resolve import resolve
from hpcrl.experiment.stage_kinds import (
    SHARED_SECTIONS,
    STAGE_KINDS,
    STAGE_SECTIONS,
    entrypoint_of,
    stage_data,
)
from hpcrl.stages.run_identity import identity_config
from tests.cli.test_cli import run_cli

REPO = Path(__file__).resolve().parents[2]
GRPO, DPO, SFT = (REPO / "templates" / f"{name}_tiny.yaml" for name in ("grpo", "dpo", "sft"))


def test_every_section_is_shared_or_owned_by_exactly_one_stage():
    assert set(STAGE_KINDS) == set(typing.get_args(StageName))
    sections = {f.name for f in dataclasses.fields(ExperimentConfig) if dataclasses.is_dataclass(f.type)}
    sections |= {key.partition(".")[0] for key in leaf_types(ExperimentConfig) if "." in key}
    owned = [s for kind in STAGE_KINDS.values() for s in kind.sections]
    assert len(owned) == len(set(owned)) and sections == set(SHARED_SECTIONS) | STAGE_SECTIONS
    for kind in STAGE_KINDS.values():
        assert kind.steps_key.partition(".")[0] in kind.sections
        assert kind.steps_key in leaf_types(ExperimentConfig)


def test_a_dpo_template_over_an_rl_one_names_each_rl_section_and_writes_nothing(tmp_path, capsys):
    template = tmp_path / "t.yaml"
    template.write_text(f"extends: {GRPO}\nstage: dpo\nrun_root: {tmp_path / 'runs'}\n")
    code, _, err = run_cli(capsys, "submit", template, "--dry-run")
    assert code == 2
    for section, key in (
        ("rollout", "rollout.engine"),
        ("algorithm", "algorithm.name"),
        ("reward", "reward.name"),
    ):
        assert f"{GRPO}:{key}: the dpo stage does not read {section} (the rl stage's section)" in err
    assert err.count(" does not read ") == 3 and not (tmp_path / "runs").exists()


def test_another_stages_key_on_the_command_line_or_in_a_sweep_is_refused(tmp_path):
    with pytest.raises(ConfigError) as err:
        resolve(DPO, {"algorithm.kl_coef": 0.1, "dpo.beta": 0.2})
    [problem] = err.value.problems
    assert (problem.file, problem.key) == ("command line", "algorithm.kl_coef")
    with pytest.raises(ConfigError, match="the rl stage does not read dpo"):
        resolve(GRPO, {"dpo.beta": 0.2})
    swept = tmp_path / "s.yaml"
    swept.write_text(
        f"extends: {DPO}\nsweep:\n  grid:\n    rollout.temperature: [0.5, 1.0]\n    stage: [rl, dpo]\n"
    )
    with pytest.raises(ConfigError) as err:
        resolve(swept)
    found = {(p.file, p.key) for p in err.value.problems}
    assert (str(swept), "rollout.temperature") in found
    assert any(p.key == "sweep.grid.stage" and "cannot be swept" in p.message for p in err.value.problems)


@settings(max_examples=40, deadline=None)
@given(st.one_of(st.text(max_size=12), st.integers(), st.none(), st.lists(st.text(max_size=3), max_size=2)))
def test_any_other_stage_value_is_a_config_error_naming_the_key(value):
    if isinstance(value, str) and value in STAGE_KINDS:
        return
    with pytest.raises(ConfigError) as err:
        resolve(GRPO, {"stage": value})
    assert any(p.key == "stage" and p.file == "command line" for p in err.value.problems)


def test_a_resolved_element_holds_only_its_stages_sections():
    dpo = resolve(DPO).elements[0]
    rl = resolve(GRPO).elements[0]
    assert set(dpo.data) & STAGE_SECTIONS == {"dpo"} and "dpo:" in dpo.yaml_text()
    assert set(rl.data) & STAGE_SECTIONS == set(STAGE_KINDS["rl"].sections)
    assert "algorithm:" not in dpo.yaml_text() and "\ndpo:" not in rl.yaml_text()
    # the id hashes only what the stage reads: another stage's defaults do not move it
    other = dataclasses.replace(dpo.config, algorithm=dataclasses.replace(dpo.config.algorithm, kl_coef=0.5))
    from hpcrl.config.schema import to_dict
    from hpcrl.experiment.ids import config_id

    assert stage_data(to_dict(other)) == stage_data(to_dict(dpo.config))
    assert config_id(stage_data(to_dict(other))) == dpo.config_id


def test_run_identity_reads_the_stages_sections_and_frees_its_step_count():
    dpo = resolve(DPO).elements[0].config
    identity = identity_config(dpo)
    assert "dpo.pairs_per_step" in identity and "dpo.steps" not in identity
    assert "dpo.beta" not in identity  # set to its default: as if unset (hpcrl.experiment.ids)
    assert not any(key.startswith(("algorithm.", "rollout.", "reward.", "placement.")) for key in identity)
    longer = dataclasses.replace(dpo, dpo=dataclasses.replace(dpo.dpo, steps=400))
    assert identity_config(longer) == identity
    rl = resolve(GRPO).elements[0].config
    assert "algorithm.steps" not in identity_config(rl) and "algorithm.entropy_coef" in identity_config(rl)


def test_the_entrypoint_is_the_stages_unless_the_config_names_one():
    assert entrypoint_of(resolve(DPO).elements[0].config) == "hpcrl.posttrain.dpo:main"
    assert entrypoint_of(resolve(SFT).elements[0].config) == "hpcrl.posttrain.sft:main"
    assert entrypoint_of(resolve(GRPO).elements[0].config) == "hpcrl.rl.job:main"
    own = resolve(GRPO, {"entrypoint": "hpcrl.launcher.probe:main"}).elements[0].config
    assert entrypoint_of(own) == "hpcrl.launcher.probe:main"


def test_help_config_of_a_stage_lists_only_what_it_reads(capsys):
    dpo, rl = reference("dpo"), reference("rl")
    assert (
        "--dpo.beta" in dpo and "--optim.lr" in dpo and "--algorithm." not in dpo and "--rollout." not in dpo
    )
    assert "--algorithm.clip_ratio" in rl and "--placement.kind" in rl and "--dpo." not in rl
    sft = reference("sft")
    assert "--sft.examples_per_step" in sft and "--dpo." not in sft and "--algorithm." not in sft
    everything = reference()
    assert "algorithm: The RL algorithm the driver runs (stage: rl). [stage rl only]" in everything
    code, out, _ = run_cli(capsys, "run", "--help-config", "dpo")
    assert code == 0 and out == dpo
    code, _, err = run_cli(capsys, "run", "--help-config", "dp")
    assert code == 2 and "did you mean" in err


def test_rehearse_refuses_a_stage_it_does_not_model_and_plan_plans_every_stage(capsys, tmp_path):
    code, _, err = run_cli(capsys, "rehearse", SFT)
    assert code == 2 and "this template's stage is sft" in err
    code, out, err = run_cli(capsys, "rehearse", DPO, "--dir", tmp_path / "r")
    assert (
        code == 2 and f"{DPO}:stage: hpcrl rehearse models the rl stage; this template's stage is dpo" in err
    )
    assert not (tmp_path / "r").exists()
    for template in (SFT, DPO):  # hpcrl.plan.offline (tests/plan/test_offline.py)
        code, out, err = run_cli(capsys, "plan", template)
        assert code == 0 and "policy params" in out, err


@pytest.mark.parametrize(
    ("args", "refused"),
    [
        (["--checkpoint.save_on_exit", "false"], True),  # grpo_tiny: 40 steps, every_steps 10 divides them
        (["--checkpoint.save_on_exit", "false", "--checkpoint.every_steps", "0"], True),
        (["--checkpoint.save_on_exit", "false", "--checkpoint.every_steps", "3"], True),
        (["--checkpoint.save_on_exit", "false", "--checkpoint.every_steps", "4"], False),
        (["--checkpoint.save_on_exit", "false", "--checkpoint.export_hf", "false"], False),
        ([], False),
    ],
)
def test_an_export_without_its_final_checkpoint_is_refused_at_expand(capsys, args, refused):
    """checkpoint.export_hf reads the final step's checkpoint: it is refused where none would be saved
    (it used to finish with a warning and no export)."""
    code, _, err = run_cli(capsys, "expand", GRPO, "--algorithm.steps", "8", *args)
    assert (code == 2) == refused, err
    if refused:
        assert "command line:checkpoint.save_on_exit: false leaves the final step 8 (algorithm.steps)" in err
