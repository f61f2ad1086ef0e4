"""Rollout with Hugging Face transformers: batched `generate` with KV cache and left padding.

Log-probs of the sampled tokens come from the raw logits generate returns (`output_logits=True`),
divided by the sampling temperature, i.e. the same distribution the trainer evaluates (top-k/top-p
truncation is not part of the log-prob, as in verl). Use `attn_implementation="eager"` for bit-exact
parity with megatron at TP=1 (docs/FACTS.md).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

from hpcrl.rollout.base import GenerationOutput, SamplingParams, left_pad, response_mask_from_eos
from hpcrl.train.config import ModelConfig
from hpcrl.train.hf_convert import model_config_to_hf


def build_hf_causal_lm(cfg: ModelConfig, attn_implementation: str = "eager"):
    """An HF causal LM of the configured architecture (weights random; `load_weights` fills them)."""
    from transformers import AutoModelForCausalLM

    if cfg.hf_path is not None:
        return AutoModelForCausalLM.from_pretrained(
            cfg.hf_path, attn_implementation=attn_implementation, local_files_only=True
        )
    torch.manual_seed(cfg.init_seed)
    return AutoModelForCausalLM.from_config(model_config_to_hf(cfg), attn_implementation=attn_implementation)


class HFRolloutEngine:
    """RolloutEngine over an HF `PreTrainedModel` (one process, no tensor parallelism)."""

    def __init__(self, model, pad_id: int, eos_id: int, device: torch.device | str | None = None):
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.model = model.to(self.device).eval()
        self.pad_id = pad_id
        self.eos_id = eos_id
        self._params = dict(self.model.named_parameters())
        self._tied = bool(getattr(self.model.config, "tie_word_embeddings", False))

    @classmethod
    def from_model_config(cls, cfg: ModelConfig, pad_id: int, eos_id: int, **kwargs) -> HFRolloutEngine:
        return cls(build_hf_causal_lm(cfg), pad_id, eos_id, **kwargs)

    def sleep(self) -> None:
        """Nothing to free: the model is the weights it holds."""

    def wake_up(self) -> None:
        """Nothing was freed."""

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]], strict: bool = True) -> int:
        """Copy HF-named tensors into the model. strict: every parameter must arrive exactly once
        (the tied lm_head may be absent); unknown names and shape mismatches raise naming the tensor."""
        seen: set[str] = set()
        for name, tensor in weights:
            if self._tied and name == "lm_head.weight":
                continue  # the same Parameter as model.embed_tokens.weight
            param = self._params.get(name)
            if param is None:
                raise KeyError(f"rollout model has no parameter {name!r}")
            if tuple(tensor.shape) != tuple(param.shape):
                raise ValueError(f"{name}: got shape {tuple(tensor.shape)}, model has {tuple(param.shape)}")
            if name in seen:
                raise ValueError(f"{name} was sent twice")
            param.copy_(tensor.to(device=param.device, dtype=param.dtype))
            seen.add(name)
        missing = sorted(set(self._params) - seen - ({"lm_head.weight"} if self._tied else set()))
        if strict and missing:
            raise KeyError(f"weights for {len(missing)} parameters were not sent, e.g. {missing[:3]}")
        return len(seen)

    @torch.no_grad()
    def generate(
        self,
        prompt_ids: Sequence[Sequence[int]],
        sampling: SamplingParams,
        seeds: Sequence[int] | None = None,  # noqa: ARG002
    ) -> GenerationOutput:
        """`seeds` are not used: HF `generate` samples from the process RNG (the caller seeds it)."""
        input_ids_BP, attention_mask_BP = left_pad(prompt_ids, self.pad_id)
        do_sample = sampling.temperature > 0
        out = self.model.generate(
            input_ids=input_ids_BP.to(self.device),
            attention_mask=attention_mask_BP.to(self.device),
            do_sample=do_sample,
            temperature=sampling.temperature if do_sample else None,
            top_k=sampling.top_k if do_sample else None,
            top_p=sampling.top_p if do_sample else None,
            max_new_tokens=sampling.max_new_tokens,
            pad_token_id=self.pad_id,
            eos_token_id=self.eos_id,
            use_cache=True,
            return_dict_in_generate=True,
            output_logits=True,
        )
        response_ids_BT = out.sequences[:, input_ids_BP.shape[1] :].cpu()
        logits_BTV = torch.stack(out.logits, dim=1).float().cpu()
        logprobs_BT = token_logprobs(logits_BTV, response_ids_BT, sampling.logprob_temperature)
        mask_BT = response_mask_from_eos(response_ids_BT, self.eos_id)
        return GenerationOutput(
            response_ids_BT.masked_fill(mask_BT == 0, self.pad_id), mask_BT, logprobs_BT * mask_BT
        )


def token_logprobs(
    logits_BTV: torch.Tensor, tokens_BT: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """log softmax(logits / temperature) at the given tokens."""
    logp_BTV = torch.log_softmax(logits_BTV / temperature, dim=-1)
    return logp_BTV.gather(-1, tokens_BT.unsqueeze(-1)).squeeze(-1)
