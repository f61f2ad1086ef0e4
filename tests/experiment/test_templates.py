"""Templates: extends chains, sweeps (grid x zip x list), stable ids, overrides, bad files."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from hpcrl import cli
from hpcrl.config.yaml_io import loads_yaml
from hpcrl.errors import ConfigError
from hpcrl.experiment.resolve import resolve

REPO = Path(__file__).resolve().parents[2]


def write(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text))
    return path


def test_probe24_expands_grid_times_zip_in_stable_order():
    sweep = resolve(REPO / "templates/sweeps/probe-24.yaml")
    assert len(sweep.elements) == 24
    assert sweep.keys == ["optim.lr", "rollout.samples_per_prompt", "seed", "data.task"]
    first, second, last = sweep.elements[0], sweep.elements[1], sweep.elements[-1]
    assert first.swept == {
        "optim.lr": 1e-3,
        "rollout.samples_per_prompt": 2,
        "seed": 1,
        "data.task": "copy_digits",
    }
    assert second.swept == {
        "optim.lr": 1e-3,
        "rollout.samples_per_prompt": 2,
        "seed": 2,
        "data.task": "even_digits",
    }
    assert last.swept["optim.lr"] == 1e-5 and last.swept["rollout.samples_per_prompt"] == 16
    assert first.config.optim.lr == 1e-3 and first.config.cluster.partition == "debug"  # from the profile
    assert len({e.config_id for e in sweep.elements}) == 24
    again = resolve(REPO / "templates/sweeps/probe-24.yaml")
    assert [e.config_id for e in again.elements] == [e.config_id for e in sweep.elements]


def test_extends_merges_base_first_and_list_axis_multiplies(tmp_path):
    write(
        tmp_path / "base.yaml",
        """
        name: b
        algorithm: {steps: 3, kl_coef: 0.5}
        cluster: {env: {HPCRL_A: "1", HPCRL_B: "2"}}
    """,
    )
    child = write(
        tmp_path / "child.yaml",
        """
        extends: base.yaml
        algorithm: {steps: 7}
        cluster: {env: {HPCRL_B: "3"}}
        sweep:
          grid: {seed: [1, 2]}
          list:
            - {algorithm.name: grpo}
            - {algorithm.name: rloo, algorithm.kl_coef: 0.0}
    """,
    )
    sweep = resolve(child)
    assert len(sweep.elements) == 4
    cfg = sweep.elements[0].config
    assert cfg.algorithm.steps == 7 and cfg.algorithm.kl_coef == 0.5 and cfg.name == "b"
    assert cfg.cluster.env == {"HPCRL_A": "1", "HPCRL_B": "3"}
    assert [e.config.algorithm.name for e in sweep.elements] == ["grpo", "rloo", "grpo", "rloo"]
    assert sweep.elements[1].config.algorithm.kl_coef == 0.0


def test_id_is_the_hash_of_the_resolved_config_not_of_the_template(tmp_path):
    a = write(tmp_path / "a.yaml", "algorithm: {steps: 5}\n")
    b = write(tmp_path / "b.yaml", "extends: a.yaml\nseed: 0\n")  # seed 0 is the default: same experiment
    assert resolve(a).elements[0].config_id == resolve(b).elements[0].config_id
    c = write(tmp_path / "c.yaml", "algorithm: {steps: 6}\n")
    assert resolve(c).elements[0].config_id != resolve(a).elements[0].config_id


def test_command_line_overrides_are_typed_and_dotted(tmp_path, capsys):
    t = write(tmp_path / "t.yaml", "name: t\n")
    assert (
        cli.main(
            ["expand", str(t), "--optim.lr", "1e-6", "--cluster.env", "{HPCRL_X: 'a b'}", "--print_config"]
        )
        == 0
    )
    printed = loads_yaml(capsys.readouterr().out)
    assert printed["optim"]["lr"] == 1e-6 and printed["cluster"]["env"] == {"HPCRL_X": "a b"}
    assert cli.main(["expand", str(t), "--optim.lr", "fast", "--parallel.tensor", "two"]) == 2
    err = capsys.readouterr().err
    assert "command line:optim.lr" in err and "command line:parallel.tensor" in err


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        ({}, "file not found"),
        ({"t.yaml": "name: [unclosed\n"}, "invalid YAML"),
        (
            {"t.yaml": "name: a\nseed: 1\nname: b\n"},
            "duplicate key 'name' (first on line 1, again on line 3)",
        ),
        ({"t.yaml": "extends: u.yaml\n", "u.yaml": "extends: t.yaml\n"}, "extends cycle"),
        ({"t.yaml": "- a list\n"}, "a template must be a mapping"),
    ],
    ids=["missing", "unreadable", "duplicate-key", "extends-cycle", "not-a-mapping"],
)
def test_bad_template_files_exit_2_naming_the_file(tmp_path, capsys, files, expected):
    for name, text in files.items():
        write(tmp_path / name, text)
    assert cli.main(["submit", str(tmp_path / "t.yaml"), "--run_root", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err
    assert expected in err and str(tmp_path) in err
    assert not (tmp_path / "runs").exists()
    with pytest.raises(ConfigError):
        resolve(tmp_path / "t.yaml")


def test_unknown_profile_lists_the_available_ones(tmp_path):
    t = write(tmp_path / "t.yaml", "cluster: {profile: a100}\n")
    with pytest.raises(ConfigError) as err:
        resolve(t)
    assert "unknown profile 'a100'" in str(err.value) and "a100-ib" in str(err.value)
