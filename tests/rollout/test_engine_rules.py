"""Which rollout engine runs a config is decided at `expand`/`submit` (exit 2 naming the key, nothing
written) by the same pure rule the ranks use; every template under templates/ names a layout its engine
can run."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from hpcrl import cli
from hpcrl.experiment.resolve import resolve
from hpcrl.rollout.config import RolloutConfig
from hpcrl.rollout.engine_rule import EngineFacts, resolve_engine
from hpcrl.train.config import ModelConfig

REPO = Path(__file__).resolve().parents[2]
PARTIAL = {"smollm2_grpo", "grpo_tiny_vllm", "distill_tiny"}
"""Templates whose caller fills required fields (benchmarks/smollm2.py sets model.hf_path and data.path;
benchmarks/vllm_rl.py sets grpo_tiny_vllm's model.hf_path and runs it in the vLLM venv, the vLLM tier;
distill_tiny's user names its teacher, algorithm.teacher_path)."""
TEMPLATES = sorted(  # experiment templates: not suites (`programs:`) or pipelines, not partial `*-base.yaml`
    p
    for p in (REPO / "templates").rglob("*.yaml")
    if not {"programs", "stages"} & set(yaml.safe_load(p.read_text()))  # a suite, a pipeline (tests/pipeline)
    and not p.stem.endswith("-base")
    and p.stem not in PARTIAL
)
CPU, GPU, GPU_VLLM = EngineFacts(False, False), EngineFacts(True, False), EngineFacts(True, True)
HF_MODEL = ModelConfig(hf_path="/models/llama")


@pytest.mark.parametrize(
    ("engine", "t_g", "p_g", "model", "facts", "expected"),
    [
        ("auto", 1, 1, ModelConfig(), CPU, "hf"),
        ("auto", 2, 1, ModelConfig(), CPU, "megatron"),
        ("auto", 1, 2, ModelConfig(), CPU, "megatron"),
        ("auto", 2, 1, HF_MODEL, GPU, "megatron"),  # no vLLM on the element
        ("auto", 2, 1, ModelConfig(), GPU_VLLM, "megatron"),  # vLLM needs an HF directory
        ("auto", 2, 1, HF_MODEL, GPU_VLLM, "vllm"),  # SPMD over the strided t_g groups
        ("auto", 1, 1, HF_MODEL, GPU_VLLM, "vllm"),
        ("auto", 2, 2, HF_MODEL, GPU_VLLM, "megatron"),  # vLLM runs p_g = 1 only
        ("megatron", 1, 1, ModelConfig(), CPU, "megatron"),
    ],
)
def test_auto_resolves_to_an_engine_that_runs_the_layout(engine, t_g, p_g, model, facts, expected):
    assert resolve_engine(RolloutConfig(engine=engine), t_g, p_g, model, facts) == (expected, [])


@pytest.mark.parametrize(
    ("engine", "t_g", "p_g", "model", "facts", "keys"),
    [
        ("hf", 2, 1, ModelConfig(), CPU, ["parallel.rollout_tensor"]),
        ("hf", 1, 2, ModelConfig(), CPU, ["parallel.rollout_pipeline"]),
        ("vllm", 1, 1, HF_MODEL, CPU, ["rollout.engine"]),
        ("vllm", 1, 1, ModelConfig(), GPU_VLLM, ["model.hf_path"]),
        (
            "vllm",
            2,
            2,
            ModelConfig(),
            GPU,
            ["rollout.engine", "model.hf_path", "parallel.rollout_pipeline", "model.vocab_size"],
        ),
        ("vllm", 2, 1, ModelConfig(hf_path="/m", vocab_size=96), GPU_VLLM, ["model.vocab_size"]),
        ("vllm", 1, 1, ModelConfig(hf_path="/m", vocab_size=96), GPU_VLLM, []),  # no TP: whole rows
    ],
)
def test_an_engine_that_cannot_run_the_config_names_every_key(engine, t_g, p_g, model, facts, keys):
    name, problems = resolve_engine(RolloutConfig(engine=engine), t_g, p_g, model, facts)
    assert name == engine and [p.key for p in problems] == keys


def test_vllm_tp_over_split_pools_is_refused():
    _, problems = resolve_engine(RolloutConfig(engine="vllm"), 2, 1, HF_MODEL, GPU_VLLM, split_placement=True)
    assert [p.key for p in problems] == ["placement.kind"]


def _template(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "t.yaml"
    path.write_text(f"extends: {REPO / 'templates' / 'grpo_tiny.yaml'}\n{body}")
    return path


@pytest.mark.parametrize(
    ("body", "key", "words"),
    [
        (
            "rollout: {engine: hf}\nparallel: {tensor: 2, rollout_tensor: 2}\ncluster: {tasks_per_node: 2}\n",
            "parallel.rollout_tensor",
            "hf engine runs whole models",
        ),
        ("rollout: {engine: vllm}\n", "rollout.engine", "vllm is not installed"),
        ("rollout: {engine: vllm}\n", "model.hf_path", "set model.hf_path"),
        (  # 2 kv heads cannot be cut into 4 generation shards of whole heads
            "parallel: {tensor: 4, rollout_tensor: 4}\ncluster: {tasks_per_node: 4}\n",
            "parallel.rollout_tensor",
            "kv_heads % t_g",
        ),
    ],
)
@pytest.mark.parametrize("command", ["expand", "submit"])
def test_bad_rollout_configs_exit_2_at_expand_and_submit_naming_the_key(
    tmp_path, capsys, body, key, words, command
):
    template = _template(tmp_path, body)
    sweep_dir = tmp_path / "sweep"
    args = [command, str(template)] + (
        ["--dry-run", "--sweep_dir", str(sweep_dir)] if command == "submit" else []
    )
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert f"{key}:" in err and words in err, err
    assert str(template) in err  # the file is named
    assert not sweep_dir.exists()  # nothing written


def test_bad_sampling_and_layout_values_are_all_reported_at_expand(tmp_path, capsys):
    template = _template(
        tmp_path,
        "rollout: {engine: hf, top_p: 0, top_k: -1, temperature: -1, max_num_seqs: 0}\n"
        "parallel: {tensor: 4, rollout_tensor: 2}\ncluster: {tasks_per_node: 4}\n",  # 2 kv heads, t = 4
    )
    assert cli.main(["expand", str(template)]) == 2
    err = capsys.readouterr().err
    for key in ("rollout.top_p", "rollout.top_k", "rollout.temperature", "rollout.max_num_seqs"):
        assert f"{key}:" in err, err
    assert "model.num_query_groups: rule kv_heads % t == 0" in err  # megatron splits kv heads over TP
    assert "parallel.rollout_tensor: the hf engine runs whole models" in err  # every problem at once


@pytest.mark.parametrize("path", TEMPLATES, ids=[str(p.relative_to(REPO / "templates")) for p in TEMPLATES])
def test_every_template_expands_and_its_engine_runs_its_layout(path, capsys):
    assert cli.main(["expand", str(path)]) == 0, capsys.readouterr().err
    for element in resolve(path).elements:
        cfg = element.config
        facts = EngineFacts.for_element(cfg.cluster.gpus_per_node)
        p = cfg.parallel
        name, problems = resolve_engine(cfg.rollout, p.rollout_tensor, p.rollout_pipeline, cfg.model, facts)
        assert problems == [] and name in ("hf", "megatron", "vllm")
