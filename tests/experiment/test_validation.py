"""Validation reports ALL problems of a template at once, with file and dotted key, exit 2."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from hpcrl import cli
from hpcrl.errors import MESSAGE_CHARS, WHERE_CHARS, ConfigError, Problem, short

BAD = """\
    name: bad
    optim:
      lrr: 1.0e-3              # unknown key, close to `lr`
    algorithm:
      steps: many              # wrong type
    data:
      source: jsonl            # needs data.path: missing required field
    parallel:
      tensor: 3                # does not divide the 8 GPUs
    cluster:
      gres: gpu:a100:8
      tasks_per_node: 8
    sweep:
      grid:
        algorithm.kl_coeff: [0.0, 0.1]       # bad sweep axis, close to algorithm.kl_coef
      zip:
        seed: [1, 2, 3]
        data.task: [copy_digits, even_digits]  # unequal zip lengths
"""


def test_every_mistake_is_reported_with_file_and_key(tmp_path, capsys):
    base = tmp_path / "base.yaml"
    base.write_text("name: base\n")
    template = tmp_path / "bad.yaml"
    template.write_text("extends: base.yaml\n" + textwrap.dedent(BAD))
    runs = tmp_path / "runs"
    assert cli.main(["submit", str(template), "--run_root", str(runs)]) == 2
    err = capsys.readouterr().err
    f = str(template)
    expected = [
        f"{f}:optim.lrr: unknown key (did you mean 'lr'?)",
        f"{f}:algorithm.steps: wrong type: expected int, got 'many'",
        f"{f}:data.path: missing required field",
        f"{f}:parallel.tensor: layout does not divide the GPU count",
        f"{f}:cluster.nodes: layout mismatch",
        f"{f}:sweep.grid.algorithm.kl_coeff: bad sweep axis: 'algorithm.kl_coeff' is not a config key "
        "(did you mean 'algorithm.kl_coef'?)",
        f"{f}:sweep.zip: zip axes have unequal lengths (seed=3, data.task=2)",
    ]
    for line in expected:
        assert line in err, f"missing: {line}\n--- got:\n{err}"
    assert not runs.exists(), "nothing may be written (let alone submitted) for a bad template"


def test_layout_rules_name_the_keys(tmp_path, capsys):
    t = Path(tmp_path / "t.yaml")
    t.write_text(
        "parallel: {tensor: 2, rollout_tensor: 4, data: 2}\ncluster: {nodes: 1, tasks_per_node: 2}\n"
    )
    assert cli.main(["expand", str(t)]) == 2
    err = capsys.readouterr().err
    assert "cluster.nodes: layout mismatch: cluster.nodes*cluster.tasks_per_node = 1*2 = 2 ranks" in err
    assert "parallel.rollout_tensor: rollout_tensor=4 must divide parallel.tensor=2" in err


def test_unsafe_sbatch_directive_values_are_rejected(tmp_path, capsys):
    t = tmp_path / "t.yaml"
    t.write_text('cluster: {partition: "debug\\n#SBATCH --wrap=x", env: {"BAD-NAME": "v"}}\n')
    assert cli.main(["expand", str(t)]) == 2
    err = capsys.readouterr().err
    assert "cluster.partition" in err and "cluster.env.BAD-NAME" in err


def test_megatron_optimizer_backend_is_valid_with_and_without_gpus(tmp_path):
    """On CPU elements megatron's DDP + distributed optimizer run through hpcrl.train.megatron_compat
    (what `hpcrl rehearse` uses to run a GPU recipe's update path); on GPU nodes unmodified."""
    cpu = tmp_path / "cpu.yaml"
    cpu.write_text("optim: {backend: megatron}\n")
    assert cli.main(["expand", str(cpu)]) == 0
    gpu = tmp_path / "gpu.yaml"
    gpu.write_text("optim: {backend: megatron}\ncluster: {gres: 'gpu:a100:1', tasks_per_node: 1}\n")
    assert cli.main(["expand", str(gpu)]) == 0


def test_a_problem_is_bounded_and_on_one_line_whatever_it_quotes():
    """The one place that bounds error text: a Problem cuts and escapes its message, file and key."""
    problem = Problem("m" * 10_000, "f\n" * 1_000, "k\x1b[2J")
    text = str(problem)
    assert text.isprintable() and len(text) < MESSAGE_CHARS + 2 * WHERE_CHARS + 100
    assert "more characters" in text and "k\\x1b[2J" in text
    assert len(short("y" * 1_000_000)) < 200 and short(list(range(1_000_000))).endswith("...]")
    many = ConfigError([Problem(f"p{i}") for i in range(500)])
    assert len(many.problems) == 500 and str(many).endswith("... and 450 more problem(s)")


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["--cluster.signal_delay_s", "300", "--cluster.time_min", "1"], "cluster.signal_delay_s"),
        (["--cluster.signal_delay_s", "-5"], "cluster.signal_delay_s"),
        (["--cluster.mem_gb", "-10"], "cluster.mem_gb"),
        (["--cluster.gpus_per_node", "-3"], "cluster.gpus_per_node"),
        (["--cluster.stop_grace_s", "-1"], "cluster.stop_grace_s"),
    ],
)
def test_cluster_numbers_sbatch_would_take_are_refused_at_expand(overrides, key, capsys):
    """Issue 12: `--mem=-10GB` reached sbatch, and USR2@300 on a 1-minute job killed it after 8 s."""
    template = Path(__file__).resolve().parents[2] / "templates" / "grpo_tiny.yaml"
    assert cli.main(["expand", str(template), *overrides]) == 2
    problems = [line for line in capsys.readouterr().err.splitlines() if line.startswith("  - ")]
    assert [p.split(":")[1] for p in problems] == [key], problems


def test_a_key_swept_by_two_sections_is_named_where_it_repeats(tmp_path, capsys):
    """A key belongs to one sweep section; the list section may name it in several points."""
    t = tmp_path / "t.yaml"
    t.write_text(
        "sweep:\n"
        "  grid: {seed: [1, 2]}\n"
        "  zip: {seed: [3, 4], optim.lr: [0.1, 0.2]}\n"
        "  list: [{optim.lr: 0.3}, {algorithm.kl_coef: 0.1}, {algorithm.kl_coef: 0.2}]\n"
    )
    assert cli.main(["expand", str(t)]) == 2
    err = capsys.readouterr().err
    assert f"{t}:sweep.zip.seed: bad sweep axis: 'seed' is already swept in sweep.grid" in err
    assert f"{t}:sweep.list[0].optim.lr: bad sweep axis: 'optim.lr' is already swept in sweep.zip" in err
    assert "kl_coef" not in err and err.count("already swept") == 2
