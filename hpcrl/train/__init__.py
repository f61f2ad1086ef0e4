"""Training worker on megatron-core (GPTModel): model building, HF conversion, log-probs, updates.

| file                | role                                                                            |
|---------------------|---------------------------------------------------------------------------------|
| config.py           | ModelConfig, OptimizerConfig                                                    |
| megatron_compat.py  | the ONE CPU compatibility layer for megatron-core 0.16.1 (`enable()`, `enable_optimizer()`; no-op with CUDA) |
| model.py            | TrainGroups (explicit process groups, rank = tp + t*(pp + p*dp)), GPTModel build, load/gather |
| hf_convert.py       | Megatron <-> HF (Llama/Qwen2) configs, state dicts, per-tensor TP shard rules    |
| hf_config.py        | HF config.json -> ModelConfig (the one key map; untrusted-file reader, checks)  |
| logprobs.py         | vocab-parallel log-probs/entropy, PolicyHead / ValueHead (token alignment)      |
| batch.py            | TrainBatch: ids, masks, extras, global normalisation counts                     |
| token_budget.py     | micro-batches by token budget (first-fit decreasing), DP ranks balanced by tokens |
| packing.py          | packed rows: several sequences per row, block-diagonal causal mask, unpack to [B, T] |
| pipeline.py         | one micro-batch through the pipeline stages (p2p), forward and backward         |
| optimizer.py        | AdamW; fp32 master weights + fp32 grads/states for bf16/fp16 params (Micikevicius 2018 §3.1) |
| update.py           | UpdateStep protocol (owner of the parameters' storage) and the backend choice  |
| megatron_optimizer.py | MegatronUpdate: megatron-core DDP + distributed optimizer (CUDA; CPU via megatron_compat) |
| loss_scale.py       | fp16 dynamic loss scale                                                          |
| trainer.py          | Trainer: forward() and update(batch, loss_fn); build_policy_trainer / build_value_trainer |
| dtypes.py           | the model dtypes and `cast_to_model_dtype` (a 16-bit model is one dtype, as Float16Module) |
| hf_dir.py           | write an HF directory (a random model + tokenizer) atomically                    |
"""

import warnings

# megatron-core warns at import that apex / Transformer Engine are absent and it falls back to torch
# kernels. That is the expected CPU setup, reported once by `hpcrl info`; repeated in every rank's log it
# only hides real warnings. The deprecation note about cuda_graph_scope comes from megatron's own default.
for _message in (
    r"Transformer Engine and Apex are not installed",
    r"Apex is not installed",
    r"full scope is deprecated",
):
    warnings.filterwarnings("ignore", message=_message, category=UserWarning)
# megatron's TP logits gather (`runtime_gather_output`, the generation model) still calls
# all_gather_into_tensor, which torch 2.13 deprecates in favour of all_gather_single: megatron's to change.
warnings.filterwarnings("ignore", message=r".*all_gather_into_tensor` is deprecated", category=FutureWarning)
# The same for its distributed optimizer's grad reduce-scatter (reduce_scatter_tensor -> _single).
warnings.filterwarnings("ignore", message=r".*reduce_scatter_tensor` is deprecated", category=FutureWarning)
# megatron's optimizer `zero_grad` probes `.grad` on its fp32 shard views (optimizer.py `_zero_grad_group_helper`),
# which torch flags for non-leaf tensors; those views never carry grads, megatron's main_grad does.
warnings.filterwarnings(
    "ignore", message=r"The \.grad attribute of a Tensor that is not a leaf Tensor", category=UserWarning
)
# megatron's TP layers advise CUDA_DEVICE_MAX_CONNECTIONS=1 (a CUDA stream setting) on every rank, also
# on CPU; the a100-ib profile sets it for GPU jobs.
warnings.filterwarnings("ignore", message=r"When using async grad allreduce", category=UserWarning)
