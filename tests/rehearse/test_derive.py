"""The rehearsal's config (hpcrl.rehearse.derive): pure, so layouts and models are drawn by hypothesis."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcrl.distributed.layout import ParallelLayout, model_problems
from hpcrl.errors import ConfigError
from hpcrl.experiment.config import ExperimentConfig
from hpcrl.experiment.resolve import resolve
from hpcrl.rehearse.derive import HEAD_DIM, derive, shrink_layout, tiny_architecture
from hpcrl.train.config import ModelConfig

REPO = Path(__file__).resolve().parents[2]
GPU_TEMPLATES = sorted((REPO / "templates" / "gpu").glob("*.yaml"))


@st.composite
def recipes(draw) -> ExperimentConfig:
    """A recipe whose layout fits its model (the template rules hold), up to 128 ranks."""
    t = draw(st.sampled_from([1, 2, 4, 8]))
    p = draw(st.sampled_from([1, 2, 4, 8]))
    d = draw(st.sampled_from([1, 2, 4]))
    t_g = draw(st.sampled_from([k for k in (1, 2, 4, 8) if t % k == 0]))
    p_g = draw(st.sampled_from([k for k in (1, 2, 4, 8) if p % k == 0]))
    kv = t * draw(st.sampled_from([1, 2, 4]))
    ratio = draw(st.sampled_from([1, 2, 7, 8]))
    model = ModelConfig(
        family=draw(st.sampled_from(["llama", "qwen2"])),
        num_query_groups=kv,
        num_attention_heads=kv * ratio,
        hidden_size=kv * ratio * 128,
        ffn_hidden_size=kv * ratio * 128 * 3,
        vocab_size=32000,
        num_layers=p * draw(st.integers(1, 8)),
        qkv_bias=draw(st.booleans()),
        tie_word_embeddings=draw(st.booleans()) and p_g == 1,
        dtype=draw(st.sampled_from(["bfloat16", "float16", "float32"])),
    )
    cfg = ExperimentConfig(model=model)
    return dataclasses.replace(
        cfg,
        parallel=dataclasses.replace(
            cfg.parallel, tensor=t, pipeline=p, data=d, rollout_tensor=t_g, rollout_pipeline=p_g
        ),
    )


@settings(max_examples=200, deadline=None)
@given(recipes(), st.sampled_from([4, 8, 16]))
def test_the_shrunk_layout_fits_keeps_the_merge_factors_and_the_tiny_model_meets_every_rule(cfg, max_ranks):
    sizes, _, notes = shrink_layout(cfg, max_ranks)
    layout = ParallelLayout(**sizes)
    p = cfg.parallel
    assert layout.world_size <= max_ranks
    assert bool(notes) == (p.world_size > max_ranks)
    # the micro-DP factors t/t_g and p/p_g are kept whenever some layout within the budget keeps them
    a, b = p.tensor // p.rollout_tensor, p.pipeline // p.rollout_pipeline
    if a * b <= max_ranks:
        assert (layout.tensor // layout.rollout_tensor, layout.pipeline // layout.rollout_pipeline) == (a, b)
    tiny = tiny_architecture(cfg.model, layout)
    assert model_problems(layout, ModelConfig(**tiny)) == []
    m = cfg.model
    assert (
        tiny["num_attention_heads"] // tiny["num_query_groups"] == m.num_attention_heads // m.num_query_groups
    )
    assert tiny["hidden_size"] == tiny["num_attention_heads"] * HEAD_DIM
    for same in ("family", "qkv_bias", "tie_word_embeddings", "rope_theta", "rms_norm_eps"):
        assert tiny[same] == getattr(m, same)


@pytest.mark.parametrize("template", GPU_TEMPLATES, ids=lambda p: p.name)
def test_a_gpu_recipe_keeps_its_layout_dtype_and_algorithm_and_resolves_backends_as_on_a_gpu(
    template, tmp_path
):
    element = resolve(template).elements[0]
    cfg = element.config
    rehearsal = derive(cfg, run_root=str(tmp_path), model_dir=str(tmp_path / "model"), vllm_here=False)
    o = rehearsal.overrides
    p = cfg.parallel
    assert [
        o[f"parallel.{n}"] for n in ("tensor", "pipeline", "data", "rollout_tensor", "rollout_pipeline")
    ] == [p.tensor, p.pipeline, p.data, p.rollout_tensor, p.rollout_pipeline]
    assert rehearsal.ranks == 8 and o["cluster.tasks_per_node"] == 8
    assert o["optim.backend"] == "megatron"  # auto, as on CUDA
    assert o["rollout.engine"] == "megatron"  # auto on a GPU without vLLM here: sharded generation
    assert o["parallel.backend"] == "gloo" and o["parallel.verify_weight_sync"] is True
    assert "model.dtype" not in o and "algorithm.name" not in o  # as the recipe says
    assert o["model.hf_path"] == str(tmp_path / "model") and rehearsal.model_dir  # the recipe names hf_path
    assert any("vLLM is not installed here" in note for note in rehearsal.notes)
    # applied to the element, every config rule passes (hpcrl.experiment.resolve checks it again)
    assert o["checkpoint.every_steps"] == o["algorithm.steps"] - 1 >= 1


def test_vllm_is_the_engine_where_it_runs_here(tmp_path):
    cfg = resolve(GPU_TEMPLATES[0]).elements[0].config
    rehearsal = derive(cfg, run_root=str(tmp_path), model_dir=str(tmp_path / "m"), vllm_here=True)
    assert rehearsal.overrides["rollout.engine"] == "vllm"


def test_too_many_ranks_for_any_layout_and_too_few_steps_are_config_errors(tmp_path):
    cfg = resolve(GPU_TEMPLATES[0]).elements[0].config
    with pytest.raises(ConfigError, match="--steps"):
        derive(cfg, run_root=str(tmp_path), model_dir=str(tmp_path), vllm_here=False, steps=1)
    split = dataclasses.replace(cfg, placement=dataclasses.replace(cfg.placement, kind="split"))
    with pytest.raises(ConfigError, match="--max_ranks"):
        shrink_layout(split, 1)
