"""MemoryPlan of resolved templates: components per algorithm, phases, capacities, the CLI."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcrl.cli import main as cli_main
from hpcrl.experiment.resolve import resolve
from hpcrl.plan.capacity import GIB
from hpcrl.plan.memory import PERSISTENT, predict

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "templates" / "grpo_tiny.yaml"
A100 = REPO / "templates" / "examples" / "a100-grpo-sweep.yaml"


def config(template: Path = TINY, **overrides):
    return resolve(template, overrides).elements[0].config


def names(plan) -> set[str]:
    return {c.name for c in plan.components}


def test_tiny_plan_components_and_totals():
    plan = predict(config(), host_bytes=24 * GIB)
    by_name = {c.name: c for c in plan.components}
    # 76,096 params (hand count in test_formulas) in fp32: params, grads 4 B each, AdamW 8 B
    assert by_name["actor params"].bytes == 76096 * 4
    assert by_name["actor grads"].bytes == 76096 * 4
    assert by_name["actor AdamW states"].bytes == 76096 * 8
    assert "actor fp32 master" not in by_name  # fp32 params need no master copy
    assert not {"critic params", "reference params", "DP flat grad buffer"} & names(plan)
    phases = plan.phase_bytes()
    assert plan.device_peak == pytest.approx(phases[PERSISTENT] + max(phases["train"], phases["generate"]))
    # CPU job: device memory is host RAM, so the host peak adds the device peak to host-only parts
    host_only = sum(c.bytes for c in plan.components if c.phase == "host")
    assert plan.host_peak == pytest.approx(plan.device_peak + host_only)
    assert plan.device.kind == "cpu" and plan.host.bytes == 24 * GIB and plan.fits


def test_algorithm_adds_critic_and_reference():
    ppo = predict(config(**{"algorithm.name": "ppo"}), host_bytes=24 * GIB)
    assert {"critic params", "critic grads", "critic AdamW states"} <= names(ppo)
    kl = predict(config(**{"algorithm.kl_coef": 0.01}), host_bytes=24 * GIB)
    assert "reference params" in names(kl) and "critic params" not in names(kl)
    assert kl.device_peak - predict(config(), host_bytes=24 * GIB).device_peak == pytest.approx(76096 * 4)


def test_micro_batch_and_tp_change_activations():
    base = predict(config(), host_bytes=24 * GIB)
    half = predict(config(**{"optim.micro_batch_size": 64}), host_bytes=24 * GIB)
    act = lambda p: next(c.bytes for c in p.components if c.name.startswith("activations"))  # noqa: E731
    assert act(half) == pytest.approx(act(base) / 2)
    tp2 = predict(config(**{"parallel.tensor": 2, "cluster.tasks_per_node": 2}), host_bytes=24 * GIB)
    assert act(tp2) < act(base) and "reshard staging" in names(tp2)
    dp2 = predict(config(**{"parallel.data": 2, "cluster.tasks_per_node": 2}), host_bytes=24 * GIB)
    assert "DP flat grad buffer" in names(dp2)


def test_gpu_template_uses_a100_capacity_and_bf16_master():
    plan = predict(config(A100), host_bytes=24 * GIB)
    assert plan.device.kind == "gpu" and plan.device.bytes == 80 * GIB
    assert "actor fp32 master (1/d)" in names(plan)  # GPU: megatron's distributed optimizer
    # the a100-ib profile: 900 GB per node over 8 ranks
    assert plan.host.bytes == pytest.approx(900e9 / 8)
    assert plan.fits
    # engine vllm: the KV cache is vLLM's pre-allocated budget, not the all-at-once demand; on a GPU its
    # weights (and the megatron engine's store) sleep during training: a generate-phase component
    cfg = config(A100)  # validated here, where vLLM is absent; the compute nodes are assumed to have it
    cfg.rollout = dataclasses.replace(cfg.rollout, engine="vllm")
    vllm = predict(cfg, host_bytes=24 * GIB)
    by_name = {c.name: c.bytes for c in vllm.components}
    assert by_name["KV cache"] == pytest.approx(0.5 * 80 * GIB - by_name["rollout engine weights"])
    weights = next(c for c in vllm.components if c.name == "rollout engine weights")
    assert weights.phase == "generate" and "vllm engine" in weights.formula
    # engine auto without model.hf_path = megatron (vLLM starts from an HF directory): all-at-once KV cache
    auto = {c.name: c for c in plan.components}
    assert "megatron engine" in auto["rollout engine weights"].formula
    assert auto["KV cache"].bytes < by_name["KV cache"]


def test_gpu_distributed_optimizer_shards_masters_and_moments_over_data_parallel():
    """optim.backend auto on a GPU job = megatron DDP + distributed optimizer: masters and AdamW moments
    per rank are 1/d of the torch backend's; grads are one fp32 buffer, no extra DP flat copy."""
    sharded = predict(config(A100), host_bytes=24 * GIB)
    data = config(A100).parallel.data
    assert data == 4
    full = predict(config(A100, **{"optim.backend": "torch"}), host_bytes=24 * GIB)
    s = {c.name: c.bytes for c in sharded.components}
    f = {c.name: c.bytes for c in full.components}
    assert s["actor fp32 master (1/d)"] * data == pytest.approx(f["actor fp32 master"])
    assert s["actor AdamW states (1/d)"] * data == pytest.approx(f["actor AdamW states"])
    assert "DP flat grad buffer" in f and "DP flat grad buffer" not in s
    assert sharded.device_peak < full.device_peak


def test_model_too_big_for_a100_is_named():
    big = config(
        A100,
        **{
            "model.hidden_size": 8192,
            "model.num_layers": 80,
            "model.num_attention_heads": 64,
            "model.num_query_groups": 8,
            "model.ffn_hidden_size": 28672,
            "model.vocab_size": 128000,
            "model.max_position_embeddings": 4096,
        },
    )
    plan = predict(big, host_bytes=24 * GIB)
    assert not plan.fits
    assert any("A100 80GB" in p and "GiB per rank" in p for p in plan.problems())


def test_plan_command_tables_and_exit_codes(capsys):
    assert cli_main(["plan", str(TINY)]) == 0
    out = capsys.readouterr().out
    for text in ("actor AdamW states", "activations (1 micro-batch)", "KV cache", "device peak", "fits"):
        assert text in out
    assert (
        cli_main(
            [
                "plan",
                str(A100),
                "--model.num_layers",
                "320",
                "--model.hidden_size",
                "16384",
                "--model.num_attention_heads",
                "128",
                "--model.num_query_groups",
                "8",
                "--model.vocab_size",
                "128000",
                "--model.ffn_hidden_size",
                "53248",
            ]
        )
        == 1
    )
    assert "predicted not to fit" in capsys.readouterr().out
    assert cli_main(["plan", str(TINY), "--model.dtype", "float64"]) == 2


def test_dims_from_an_hf_directory(tmp_path):
    from transformers import LlamaConfig

    from hpcrl.errors import ConfigError
    from hpcrl.plan.memory import ModelDimsUnavailable

    LlamaConfig(
        vocab_size=16,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        max_position_embeddings=32,  # as grpo_tiny.yaml says: every value the template sets is checked
    ).save_pretrained(tmp_path)
    from_dir = predict(config(**{"model.hf_path": str(tmp_path)}), host_bytes=24 * GIB)
    assert {c.name: c.bytes for c in from_dir.components}["actor params"] == 76096 * 4
    # the template's own value against config.json's: an error naming the key and both values
    with pytest.raises(
        ConfigError, match=r"model\.hidden_size: 128 in the template, but 64 in .*config\.json"
    ):
        predict(config(**{"model.hf_path": str(tmp_path), "model.hidden_size": 128}), host_bytes=24 * GIB)
    # not on this machine: grpo_tiny.yaml spells out the dims (+ tie_word_embeddings here), so the plan
    # works from the template alone
    missing = str(tmp_path / "missing")
    offline_cfg = config(**{"model.hf_path": missing, "model.tie_word_embeddings": False})
    offline = predict(offline_cfg, host_bytes=24 * GIB)
    assert offline.components == from_dir.components
    # ... but not when the template leaves a planned dim to config.json
    base = REPO / "templates" / "base.yaml"
    with pytest.raises(ModelDimsUnavailable, match=r"model\.hf_path: cannot read .*model\.vocab_size"):
        predict(config(base, **{"model.hf_path": missing}), host_bytes=24 * GIB)
    from_base = predict(config(base, **{"model.hf_path": str(tmp_path)}), host_bytes=24 * GIB)
    # base.yaml sets no model dims: every one is read from config.json
    assert {c.name: c.bytes for c in from_base.components}["actor params"] == 76096 * 4


def test_split_placement_takes_the_worst_pool():
    colocated = predict(config(**{"algorithm.name": "ppo"}), host_bytes=24 * GIB)
    split_cfg = config(**{"algorithm.name": "ppo", "placement.kind": "split", "cluster.tasks_per_node": 2})
    split = predict(split_cfg, host_bytes=24 * GIB)
    pools = {c.pool for c in split.components if c.phase != "host"}
    assert pools == {"actor", "models"} and {c.pool for c in colocated.components} == {"all"}
    actor_phases, models_phases = split.phase_bytes("actor"), split.phase_bytes("models")
    actor_peak = actor_phases.pop(PERSISTENT) + max(actor_phases.values())
    models_peak = models_phases.pop(PERSISTENT) + max(models_phases.values())
    assert split.device_peak == pytest.approx(max(actor_peak, models_peak))
    # the critic's states leave the actor's ranks: each rank holds less than when colocated
    assert split.device_peak < colocated.device_peak
    assert split.update_peak == pytest.approx(colocated.update_peak)


def test_a_token_budget_sizes_the_activations_of_its_worst_micro_batch():
    act = lambda p: next(c.bytes for c in p.components if c.name.startswith("activations"))  # noqa: E731
    s = 8 + 3  # grpo_tiny: max_prompt_length + max_new_tokens
    rows = {n: predict(config(**{"optim.micro_batch_size": n}), host_bytes=24 * GIB) for n in (5, 6)}
    exact = predict(config(**{"optim.max_tokens_per_micro_batch": 5 * s}), host_bytes=24 * GIB)
    assert act(exact) == pytest.approx(act(rows[5]))  # 5 full-width rows: the worst cut of 5 s tokens
    # any cut of B = 5 s + 3 tokens (R rows of width w <= s, R w <= B) has at most B tokens and B s
    # attention scores; ceil(B / s) = 6 full-width rows bound both (5 would not bound B s)
    above = predict(config(**{"optim.max_tokens_per_micro_batch": 5 * s + 3}), host_bytes=24 * GIB)
    assert act(above) == pytest.approx(act(rows[6]))


def test_async_placement_plans_a_training_pool_and_a_rollout_pool():
    overrides = {"algorithm.name": "ppo", "algorithm.kl_coef": 0.01}
    colocated = predict(config(**overrides), host_bytes=24 * GIB)
    async_2 = {"placement.kind": "async", "cluster.tasks_per_node": 2}
    plan = predict(config(**overrides, **async_2), host_bytes=24 * GIB)
    pools: dict[str, set[str]] = {}
    for c in plan.device_components():
        pools.setdefault(c.pool, set()).add(c.name)
    assert set(pools) == {"train", "rollout"}
    # the rollout pool holds the engine, the next version's back buffer and the KV cache; nothing trains
    assert pools["rollout"] == {"rollout engine weights", "next weights (back buffer)", "KV cache"}
    assert {"actor params", "critic params", "reference params"} <= pools["train"]
    assert not any("engine" in name or "KV" in name or "reshard" in name for name in pools["train"])
    by_name = {c.name: c for c in plan.components}
    engine = by_name["rollout engine weights"]
    assert engine.phase == PERSISTENT  # it generates while the training pool updates: never asleep
    assert by_name["next weights (back buffer)"].bytes == engine.bytes == 76096 * 4
    rollout = plan.phase_bytes("rollout")
    train = plan.phase_bytes("train")
    expected = max(
        rollout.pop(PERSISTENT) + max(rollout.values()), train.pop(PERSISTENT) + max(train.values())
    )
    assert plan.device_peak == pytest.approx(expected)
    assert plan.update_peak == pytest.approx(colocated.update_peak)
    # two replicas of the rollout pool each decode half the batch
    two = predict(
        config(
            **overrides,
            **{"placement.kind": "async", "placement.rollout_pool_data": 2, "cluster.tasks_per_node": 3},
        ),
        host_bytes=24 * GIB,
    )
    kv = lambda p: next(c.bytes for c in p.components if c.name == "KV cache")  # noqa: E731
    assert kv(two) == pytest.approx(kv(plan) / 2)


@settings(max_examples=40, deadline=None)
@given(
    tensor=st.sampled_from([1, 2]),  # the default model has 2 kv heads
    pipeline=st.sampled_from([1, 2]),
    data=st.sampled_from([1, 2]),
    micro=st.integers(1, 64),
    algorithm=st.sampled_from(["grpo", "ppo"]),
    kl=st.sampled_from([0.0, 0.01]),
    kind=st.sampled_from(["colocated", "split", "async"]),
)
def test_plan_invariants(tensor, pipeline, data, micro, algorithm, kl, kind):
    from dataclasses import replace

    from hpcrl.experiment.config import ExperimentConfig

    base = ExperimentConfig()
    cfg = replace(
        base,
        parallel=replace(base.parallel, tensor=tensor, pipeline=pipeline, data=data, rollout_tensor=1),
        optim=replace(base.optim, micro_batch_size=micro),
        algorithm=replace(base.algorithm, name=algorithm, kl_coef=kl),
        placement=replace(base.placement, kind=kind),
    )
    plan = predict(cfg, host_bytes=24 * GIB)
    assert all(c.bytes >= 0 for c in plan.components)
    for pool in {c.pool for c in plan.device_components()}:
        assert plan.device_peak >= plan.phase_bytes(pool)[PERSISTENT]
    bigger = predict(replace(cfg, optim=replace(cfg.optim, micro_batch_size=micro + 1)), host_bytes=24 * GIB)
    assert bigger.device_peak >= plan.device_peak  # more sequences per micro-batch never need less
    if tensor == 1:
        wider = replace(cfg, parallel=replace(cfg.parallel, tensor=2 * tensor))
        assert predict(wider, host_bytes=24 * GIB).update_peak <= plan.update_peak
