"""Run identity (hpcrl.stages.run_identity): what the fingerprint ignores and keeps, and run.json."""

from __future__ import annotations

import json

import pytest

from hpcrl.errors import ConfigError
from hpcrl.experiment.config import ExperimentConfig
from hpcrl.stages.run_identity import (
    RUN_FILE,
    fingerprint,
    fingerprint_of,
    identity_config,
    load_or_create,
)


def _fp(**changes) -> str:
    cfg = ExperimentConfig()
    for dotted, value in changes.items():
        section, _, key = dotted.rpartition("__")
        setattr(getattr(cfg, section) if section else cfg, key, value)
    return fingerprint(identity_config(cfg))


def test_how_long_where_and_how_a_run_is_carried_out_keep_its_identity():
    base = _fp()
    same = {
        "algorithm__steps": 999,
        "logging__progress": False,
        "checkpoint__every_steps": 3,
        "checkpoint__dir": "/elsewhere",
        "checkpoint__resume": "never",
        "cluster__nodes": 4,
        "cluster__env": {"HPCRL_STEP_SLEEP_S": "1"},
        "parallel__tensor": 2,
        "name": "renamed",
        "run_root": "/other",
    }
    for key, value in same.items():
        assert _fp(**{key: value}) == base, key


def test_what_a_run_trains_changes_its_identity():
    base = _fp()
    for key, value in {
        "seed": 1,
        "optim__lr": 5e-4,
        "algorithm__name": "rloo",
        "checkpoint__resume_from": "/ckpt/of/another/run",
    }.items():
        assert _fp(**{key: value}) != base, key


def test_run_json_is_written_once_and_read_back(tmp_path):
    first = load_or_create(tmp_path, ExperimentConfig())
    assert fingerprint_of(first.run_id) == first.fingerprint
    more_steps = ExperimentConfig()
    more_steps.algorithm.steps = 500
    assert load_or_create(tmp_path, more_steps) == first  # the same run, extended
    assert json.loads((tmp_path / RUN_FILE).read_text())["run_id"] == first.run_id


def test_run_json_of_another_config_is_refused_naming_the_keys_that_differ(tmp_path):
    first = load_or_create(tmp_path, ExperimentConfig())
    other = ExperimentConfig(seed=1)
    with pytest.raises(ConfigError, match=f"belongs to run {first.run_id}") as err:
        load_or_create(tmp_path, other)
    assert "seed: (default) -> 1" in str(err.value) and str(tmp_path / RUN_FILE) in str(err.value)
