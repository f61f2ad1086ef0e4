"""Pipeline files (hpcrl.pipeline): parsed, ordered and resolved at `expand`, every stage's outputs known
before it runs; every bad input is exit 2 naming the file and the key, all problems at once, nothing
written; a fuzz over random pipeline graphs with hostile names and references."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hpcrl.errors import ConfigError
from hpcrl.pipeline.plan import plan_pipeline
from hpcrl.pipeline.refs import ReferenceError, parse, references
from tests.cli_runs import run_cli

REPO = Path(__file__).resolve().parents[2]
TEMPLATES = REPO / "templates"
DEMO = TEMPLATES / "pipelines" / "tiny.yaml"


def _write(folder: Path, text: str, name: str = "pipe.yaml") -> Path:
    path = folder / name
    path.write_text(text.replace("TEMPLATES", str(TEMPLATES)))
    return path


def test_the_demo_expands_every_stage_in_order_each_consuming_its_upstreams_paths(tmp_path, capsys):
    root = tmp_path / "runs"
    code, out, err = run_cli(capsys, "expand", DEMO, "--json", f"--run_root={root}")
    assert code == 0, err
    records = [json.loads(line) for line in out.splitlines()]
    assert [(r["stage"], r["after"]) for r in records] == [
        ("sft", []),
        ("rm", ["sft"]),
        ("rl", ["sft", "rm"]),
    ]
    sft, rm, rl = records
    assert sft["run_dir"] == str(
        root / "sft_reverse_exact" / sft["config_id"]
    )  # the command line: every stage
    assert rm["config"]["model"]["hf_path"] == f"{sft['run_dir']}/hf"
    assert rl["config"]["model"]["hf_path"] == f"{sft['run_dir']}/hf"
    assert rl["config"]["reward"]["model_path"] == f"{rm['run_dir']}/hf"
    assert rl["config"]["data"]["task"] == "reverse_exact" and rl["config"]["stage"] == "rl"
    assert not root.exists()  # expand writes nothing


def test_a_sweep_stage_is_consumed_by_element_and_the_consumer_follows_it(tmp_path, capsys):
    pipe = _write(
        tmp_path,
        """
stages:
  sft:
    template: TEMPLATES/sft_tiny.yaml
  rl:
    template: TEMPLATES/grpo_tiny.yaml
    set: {model.hf_path: "${stages.sft.1.hf}", checkpoint.resume_from: "${stages.sft.0.checkpoint}"}
""",
    )
    sweep = tmp_path / "lr.yaml"
    sweep.write_text(f"extends: {TEMPLATES}/sft_tiny.yaml\nsweep:\n  grid:\n    optim.lr: [1.0e-3, 3.0e-3]\n")
    pipe.write_text(pipe.read_text().replace(f"{TEMPLATES}/sft_tiny.yaml", str(sweep)))
    code, out, err = run_cli(capsys, "expand", pipe, "--json", f"--run_root={tmp_path / 'runs'}")
    assert code == 0, err
    sft0, sft1, rl = (json.loads(line) for line in out.splitlines())
    assert rl["config"]["model"]["hf_path"] == f"{sft1['run_dir']}/hf"
    assert rl["config"]["checkpoint"]["resume_from"] == f"{sft0['run_dir']}/checkpoints"


def test_a_rule_leaves_the_choice_to_the_consumers_start_over_every_element(tmp_path):
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(f"extends: {TEMPLATES}/sft_tiny.yaml\nsweep:\n  grid:\n    seed: [1, 2, 3]\n")
    rule = "${stages.s.min(sft/heldout_loss).hf}"
    pipe = _write(
        tmp_path,
        f"stages:\n  s: {{template: {sweep}}}\n  a: {{template: TEMPLATES/grpo_tiny.yaml, set: {{model.hf_path: '{rule}'}}}}\n",
    )
    pipeline = plan_pipeline(pipe, {"run_root": str(tmp_path / "runs")})
    upstream, consumer = pipeline.stages
    assert consumer.sweep.elements[0].config.model.hf_path == rule  # bound when it starts
    [taken] = consumer.inputs
    assert (taken.key, taken.rule, taken.metric, taken.reference) == (
        "model.hf_path",
        "min",
        "sft/heldout_loss",
        rule,
    )
    assert taken.candidates == [str(e.run_dir) for e in upstream.sweep.elements]
    assert taken.outputs == [f"{e.run_dir}/hf" for e in upstream.sweep.elements]


BAD = {
    "after an unknown stage": (
        "stages:\n  a: {template: TEMPLATES/sft_tiny.yaml, after: [b]}\n",
        "stages.a.after",
        "no stage 'b'",
    ),
    "a reference to an unknown stage": (
        "stages:\n  a: {template: TEMPLATES/grpo_tiny.yaml, set: {model.hf_path: '${stages.zz.hf}'}}\n",
        "stages.a.set.model.hf_path",
        "no stage 'zz'",
    ),
    "an unknown output": (
        "stages:\n  s: {template: TEMPLATES/sft_tiny.yaml}\n"
        "  a: {template: TEMPLATES/grpo_tiny.yaml, set: {model.hf_path: '${stages.s.weights}'}}\n",
        "stages.a.set.model.hf_path",
        "run_dir, checkpoint, hf",
    ),
    "a cycle": (
        "stages:\n  a: {template: TEMPLATES/sft_tiny.yaml, after: [b]}\n"
        "  b: {template: TEMPLATES/sft_tiny.yaml, set: {model.hf_path: '${stages.a.hf}'}}\n",
        "stages",
        "cycle",
    ),
    "its own output": (
        "stages:\n  a: {template: TEMPLATES/grpo_tiny.yaml, set: {model.hf_path: '${stages.a.hf}'}}\n",
        "stages.a.set.model.hf_path",
        "its own outputs",
    ),
    "a sweep consumed whole": (
        "stages:\n  s: {template: SWEEP}\n"
        "  a: {template: TEMPLATES/grpo_tiny.yaml, set: {model.hf_path: '${stages.s.hf}'}}\n",
        "stages.a.set.model.hf_path",
        "is a sweep of 2: name an element",
    ),
    "an element out of range": (
        "stages:\n  s: {template: TEMPLATES/sft_tiny.yaml}\n"
        "  a: {template: TEMPLATES/grpo_tiny.yaml, set: {model.hf_path: '${stages.s.1.hf}'}}\n",
        "stages.a.set.model.hf_path",
        "elements 0..0",
    ),
    "an export the stage does not write": (
        "stages:\n  s: {template: TEMPLATES/sft_tiny.yaml, set: {checkpoint.export_hf: false}}\n"
        "  a: {template: TEMPLATES/grpo_tiny.yaml, set: {model.hf_path: '${stages.s.hf}'}}\n",
        "stages.a.set.model.hf_path",
        "writes no HF export",
    ),
    "a reference inside a mapping": (
        "stages:\n  s: {template: TEMPLATES/sft_tiny.yaml}\n"
        "  a: {template: TEMPLATES/grpo_tiny.yaml, set: {reward: {name: model, model_path: '${stages.s.hf}'}}}\n",
        "stages.a.set.reward",
        "name the key in full",
    ),
    "an upper-case pipeline name": (
        "name: SFT\nstages:\n  a: {template: TEMPLATES/sft_tiny.yaml}\n",
        "name",
        "pipeline name",
    ),
    "a misspelt reference": (
        "stages:\n  s: {template: TEMPLATES/sft_tiny.yaml}\n"
        "  a: {template: TEMPLATES/grpo_tiny.yaml, set: {model.hf_path: '${stage.s.hf}'}}\n",
        "stages.a.set.model.hf_path",
        "${stages.NAME.OUTPUT}",
    ),
    "an unclosed reference": (
        "stages:\n  a: {template: TEMPLATES/grpo_tiny.yaml, set: {model.hf_path: '/x/${stages.s.hf'}}\n",
        "stages.a.set.model.hf_path",
        "does not open a reference",
    ),
    "an unknown config key in set": (
        "stages:\n  a: {template: TEMPLATES/grpo_tiny.yaml, set: {model.hiden_size: 3}}\n",
        "stages.a.set.model.hiden_size",
        "stage a",
    ),
    "a bad value in set": (
        "stages:\n  a: {template: TEMPLATES/grpo_tiny.yaml, set: {optim.lr: -1}}\n",
        "stages.a.set.optim.lr",
        "stage a",
    ),
    "a template that is not there": (
        "stages:\n  a: {template: nowhere.yaml}\n",
        "stages.a.template",
        "no template file at",
    ),
    "a hostile stage name": (
        'stages:\n  "x\\e[2J": {template: TEMPLATES/sft_tiny.yaml}\n',
        "stages",
        "stage name",
    ),
    "an unknown stage key": (
        "stages:\n  a: {template: TEMPLATES/sft_tiny.yaml, needs: [b]}\n",
        "stages.a.needs",
        "unknown key",
    ),
    "an unknown top-level key": (
        "stages:\n  a: {template: TEMPLATES/sft_tiny.yaml}\nsweep: {}\n",
        "sweep",
        "unknown",
    ),
    "no stages": ("stages: {}\n", "stages", "must map stage names"),
    "stages as a list": ("stages: [a, b]\n", "stages", "must map stage names"),
    "a template path with a newline": ('stages:\n  a: {template: "a\\nb.yaml"}\n', "stages.a.template", ""),
}


@pytest.mark.parametrize("case", BAD, ids=list(BAD))
def test_a_bad_pipeline_is_exit_2_naming_file_and_key_and_writes_nothing(tmp_path, capsys, case):
    text, key, words = BAD[case]
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(f"extends: {TEMPLATES}/sft_tiny.yaml\nsweep:\n  grid:\n    seed: [1, 2]\n")
    pipe = _write(tmp_path, text.replace("SWEEP", str(sweep)))
    before = sorted(tmp_path.rglob("*"))
    code, out, err = run_cli(capsys, "expand", pipe, f"--run_root={tmp_path / 'runs'}")
    assert code == 2 and "Traceback" not in err and "\x1b" not in err, err
    assert f":{key}:" in err or f"{key}:" in err.split("\n", 1)[1], err
    assert words in err and out == "", err
    assert sorted(tmp_path.rglob("*")) == before


def test_every_stage_reports_its_problems_at_once_each_naming_its_stage(tmp_path, capsys):
    code, _, err = run_cli(capsys, "expand", DEMO, "--parallel.tensor", "3")
    assert code == 2
    for stage in ("sft", "rm", "rl"):
        assert f"stage {stage}: rule heads % t == 0" in err, err


def test_a_consumer_is_checked_against_the_model_it_starts_from(tmp_path, capsys):
    """rl sets no model dims: at expand the SFT export does not exist, so its layout is checked with the
    SFT model's dims (a tensor split of 3 cannot split 4 heads); a dim that contradicts them is refused."""
    bare = tmp_path / "bare_rl.yaml"
    bare.write_text(
        f"extends: {TEMPLATES}/base.yaml\nname: bare\nstage: rl\n"
        "data: {source: builtin, task: copy_digits, num_digits: 3, max_prompt_length: 8}\n"
        "rollout: {engine: megatron, max_new_tokens: 3}\nalgorithm: {name: grpo, steps: 2}\n"
    )
    text = f"stages:\n  sft: {{template: TEMPLATES/sft_tiny.yaml}}\n  rl: {{template: {bare}, set: SET}}\n"
    pipe = _write(tmp_path, text.replace("SET", "{model.hf_path: '${stages.sft.hf}'}"))
    assert run_cli(capsys, "expand", pipe)[0] == 0
    pipe = _write(tmp_path, text.replace("SET", "{model.hf_path: '${stages.sft.hf}', parallel.tensor: 3}"))
    code, _, err = run_cli(capsys, "expand", pipe)
    assert code == 2 and "stage rl: rule heads % t == 0" in err and "(with stage sft's model)" in err, err
    assert "stage sft:" not in err
    pipe = _write(tmp_path, text.replace("SET", "{model.hf_path: '${stages.sft.hf}', model.hidden_size: 32}"))
    code, _, err = run_cli(capsys, "expand", pipe)
    assert (
        code == 2 and "model.hidden_size=32, but the model it starts from (stage sft's export) has 64" in err
    ), err


def test_a_rule_is_checked_against_every_distinct_model_it_may_pick(tmp_path, capsys):
    """A sweep over a model dim feeds a consumer through a rule: the consumer's layout is checked with each
    distinct model the rule may pick (element 1's one query group cannot split over t=2), not element 0's
    alone; naming element 0, which can, passes."""
    sweep = tmp_path / "sft_groups.yaml"
    sweep.write_text(
        f"extends: {TEMPLATES}/sft_tiny.yaml\nsweep:\n  grid:\n    model.num_query_groups: [2, 1]\n"
    )
    bare = tmp_path / "bare_rl.yaml"
    bare.write_text(
        f"extends: {TEMPLATES}/base.yaml\nname: bare\nstage: rl\n"
        "data: {source: builtin, task: copy_digits, num_digits: 3, max_prompt_length: 8}\n"
        "rollout: {engine: megatron, max_new_tokens: 3}\nalgorithm: {name: grpo, steps: 2}\n"
    )
    text = f"stages:\n  sft: {{template: {sweep}}}\n  rl: {{template: {bare}, set: SET}}\n"
    by_rule = "{model.hf_path: '${stages.sft.best(sft/token_accuracy).hf}', parallel.tensor: 2}"
    code, _, err = run_cli(capsys, "expand", _write(tmp_path, text.replace("SET", by_rule)))
    assert code == 2 and "num_query_groups" in err and "(with stage sft's model)" in err, err
    by_index = "{model.hf_path: '${stages.sft.0.hf}', parallel.tensor: 2}"
    assert run_cli(capsys, "expand", _write(tmp_path, text.replace("SET", by_index)))[0] == 0


@pytest.mark.parametrize(
    "text",
    ["${stages.a.hf", "${stages.A.hf}", "${stages.a.01.hf}", "${stages.a.max().hf}", "${stages.a.b(x).hf}"],
)
def test_a_reference_that_is_not_one_is_refused(text):
    with pytest.raises(ReferenceError):
        references(f"/p/{text}")


def test_references_read_element_and_rule():
    assert parse("${stages.sft.12.hf}").element == 12
    rule = parse("${stages.sft.min(loss/heldout).run_dir}")
    assert (rule.rule, rule.metric, rule.output) == ("min", "loss/heldout", "run_dir")
    assert [r.stage for r in references("${stages.a.hf}:${stages.b.checkpoint}")] == ["a", "b"]


NAMES = st.one_of(st.sampled_from(["sft", "rm", "rl", "b2"]), st.text(max_size=12))
REFS = st.builds(
    lambda stage, middle, output: "${stages." + stage + middle + "." + output + "}",
    NAMES,
    st.sampled_from(["", ".0", ".1", ".best(reward/heldout)", ".x(", ".-1"]),
    st.sampled_from(["hf", "run_dir", "checkpoint", "weights", ""]),
)
STAGE = st.fixed_dictionaries(
    {
        "template": st.sampled_from(
            ["TEMPLATES/sft_tiny.yaml", "TEMPLATES/grpo_tiny.yaml", "../x.yaml", "\x00"]
        )
    },
    optional={
        "set": st.dictionaries(
            st.sampled_from(["model.hf_path", "checkpoint.resume_from", "optim.lr", "x\ny"]),
            st.one_of(REFS, st.floats(allow_nan=True), st.text(max_size=8)),
            max_size=3,
        ),
        "after": st.lists(NAMES, max_size=3),
    },
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(stages=st.dictionaries(NAMES, STAGE, max_size=4))
def test_any_pipeline_graph_is_planned_or_refused_with_bounded_problems(tmp_path, stages):
    """Random graphs, references and names with hostile text: a valid pipeline, or ConfigError whose
    every problem is short and printable; never another exception, nothing written."""
    path = tmp_path / "fuzz.yaml"
    path.write_text(json.dumps({"stages": stages}).replace("TEMPLATES", str(TEMPLATES)))
    try:
        pipeline = plan_pipeline(path, {"run_root": str(tmp_path / "runs")})
    except ConfigError as err:
        assert err.problems
        for problem in err.problems:
            assert len(problem.message) < 1000 and str(problem).isprintable(), problem
    else:
        assert [s.name for s in pipeline.stages] and all(len(s.sweep.elements) >= 1 for s in pipeline.stages)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fuzz.yaml"]


def test_submit_sends_a_pipeline_to_slurm_only_and_a_dry_run_shows_each_stages_dependency(tmp_path, capsys):
    pipeline_dir = tmp_path / "p"
    code, out, err = run_cli(
        capsys, "submit", DEMO, "--sweep_dir", pipeline_dir, f"--run_root={tmp_path / 'runs'}"
    )
    assert (
        code == 2 and "cluster.executor" in err and "hpcrl run PIPELINE" in err and not pipeline_dir.exists()
    )
    code, out, err = run_cli(
        capsys, "submit", DEMO, "--dry-run", "--sweep_dir", pipeline_dir, f"--run_root={tmp_path / 'runs'}"
    )
    assert code == 0, err
    scripts = {
        name: (pipeline_dir / name / "sbatch" / "array-0.sh").read_text() for name in ("sft", "rm", "rl")
    }
    assert "--dependency" not in scripts["sft"]
    assert "#SBATCH --dependency='afterok:<sft>'" in scripts["rm"]
    assert "#SBATCH --dependency='afterok:<sft>:<rm>'" in scripts["rl"]
    assert all("#SBATCH --kill-on-invalid-dep=yes" in scripts[n] for n in ("rm", "rl"))
    assert [s["state"] for s in json.loads((pipeline_dir / "pipeline.json").read_text())["stages"]] == [
        "DRY_RUN"
    ] * 3
    assert not (tmp_path / "runs").exists()  # a dry run writes inside the pipeline directory only
    code, _, err = run_cli(capsys, "resume", pipeline_dir)
    assert code == 2 and "a dry run's pipeline" in err
    code, _, err = run_cli(  # a dry run's directory is used again; someone else's folder is not
        capsys, "submit", DEMO, "--dry-run", "--sweep_dir", pipeline_dir, f"--run_root={tmp_path / 'runs'}"
    )
    assert code == 0, err
    (tmp_path / "theirs").mkdir()
    (tmp_path / "theirs" / "notes.txt").write_text("mine")
    code, _, err = run_cli(capsys, "submit", DEMO, "--dry-run", "--sweep_dir", tmp_path / "theirs")
    assert code == 2 and "not a pipeline directory" in err, err


def test_the_command_line_wins_over_a_reference_and_the_element_binds_nothing_there(tmp_path):
    pipeline = plan_pipeline(DEMO, {"run_root": str(tmp_path / "runs"), "model.hf_path": str(tmp_path)})
    rl = pipeline.stage("rl")
    assert rl.sweep.elements[0].config.model.hf_path == str(tmp_path)
    assert [i.key for i in rl.inputs] == ["reward.model_path"]
