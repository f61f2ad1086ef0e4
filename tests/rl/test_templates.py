"""The RL templates validate as configs, and their layouts fit their models (checked before any rank starts)."""

from pathlib import Path

import pytest

from hpcrl.experiment.resolve import resolve
from hpcrl.experiment.stage_kinds import entrypoint_of
from hpcrl.rl.job import config_problems
from hpcrl.rollout.engine_rule import EngineFacts, resolve_engine

TEMPLATES = Path(__file__).resolve().parents[2] / "templates"
GPU_RECIPES = sorted((TEMPLATES / "gpu").glob("*.yaml"))


@pytest.mark.parametrize(
    "name", ["grpo_tiny.yaml", "ppo_tiny.yaml", "tool_tiny.yaml", "tool_chain_tiny.yaml"]
)
def test_cpu_templates_are_valid(name):
    cfg = resolve(TEMPLATES / name).elements[0].config
    assert config_problems(cfg, cfg.cluster.nodes * cfg.cluster.tasks_per_node) == []
    assert cfg.stage == "rl" and entrypoint_of(cfg) == "hpcrl.rl.job:main"


@pytest.mark.parametrize("path", GPU_RECIPES, ids=[p.stem for p in GPU_RECIPES])
def test_gpu_recipes_are_valid_and_pick_an_engine_that_runs_their_layout(path):
    cfg = resolve(path).elements[0].config
    assert config_problems(cfg, cfg.cluster.nodes * cfg.cluster.tasks_per_node) == []
    p = cfg.parallel
    assert p.rollout_tensor > 1  # the recipes run HybridFlow's sharded rollout
    for facts, engine in (
        (EngineFacts(cuda=True, vllm=True), "vllm"),
        (EngineFacts(cuda=True, vllm=False), "megatron"),
    ):
        assert resolve_engine(cfg.rollout, p.rollout_tensor, p.rollout_pipeline, cfg.model, facts) == (
            engine,
            [],
        )
    assert cfg.rollout.engine == "auto" and cfg.model.dtype == "bfloat16"
    assert cfg.algorithm.prompts_per_step * cfg.rollout.samples_per_prompt == 128
    assert cfg.data.max_prompt_length + cfg.rollout.max_new_tokens == 512


def test_gpu_recipes_exist():
    assert len(GPU_RECIPES) >= 2
