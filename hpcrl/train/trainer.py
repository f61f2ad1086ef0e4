"""The training worker the RL driver calls: one model (actor, critic or reference) on one rank.

    trainer = build_policy_trainer(model_cfg, optim_cfg, groups)     # actor (reference: optim_cfg=None)
    critic  = build_value_trainer(model_cfg, optim_cfg, groups)      # critic (ScalarHead)
    out = trainer.forward(batch)             # HeadOutputs: logprobs_BT, entropy_BT (or values_BT), no grad
    metrics = trainer.update(batch, loss_fn) # one optimizer step over the whole batch

`batch` is this DP rank's share (the worker group splits the global batch by `groups.dp_rank`).
Every rank of the TP x PP block gets the same forward outputs and the same metrics back.

Loss contract: `loss_fn(outputs: HeadOutputs, mb: TrainBatch) -> (loss, metrics)` is called once per
micro-batch on the last pipeline stage. `loss` is that micro-batch's CONTRIBUTION to the global loss,
normalised with the global counts the trainer puts on `mb` (`mb.token_mean(x_BT)`, `mb.seq_mean(x_B)`),
so that sum over micro-batches and DP ranks = the loss of the whole batch. Gradients are then summed
(not averaged) over micro-batches and DP ranks, which makes the result independent of micro-batching
and DP size (1x4 == 4x1, d=1 == d=2). `metrics` values (floats or 0-d tensors) are averaged over
micro-batches and DP ranks; the returned "loss" is the global loss and "grad_norm" the pre-clip norm.
A non-finite grad norm (NaN/inf loss or reward upstream) skips the optimizer step on every rank, logs a
warning and returns "update_skipped_nonfinite" = 1.0 (else 0.0): never a silent wrong update.

Update step (`self.update_step`, chosen by `optimizer.backend`, hpcrl.train.update.build_update):
zero grads -> micro-batches through the pipeline (hpcrl.train.pipeline) with gradient accumulation ->
grad sync -> global grad norm -> clip -> step. `TorchUpdate` (any device; the CPU path): hpcrl's flat DP
all-reduce, torch AdamW, unsharded fp32 masters of 16-bit params, fp16 loss scaling.
`MegatronUpdate` (CUDA): megatron-core DDP + distributed optimizer (masters and moments sharded over DP).
Hooks added with `add_pre_step_hook` run right before the step writes parameters and optimizer state.

Public: `Trainer`, `build_policy_trainer`, `build_value_trainer`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
import torch.distributed as dist

from hpcrl.train import hf_convert
from hpcrl.train.batch import TrainBatch
from hpcrl.train.config import ModelConfig, OptimizerConfig
from hpcrl.train.dtypes import DTYPES
from hpcrl.train.hf_config import with_hf_architecture
from hpcrl.train.logprobs import HeadOutputs, PolicyHead, ScoreHead, ValueHead
from hpcrl.train.model import (
    TrainGroups,
    build_gpt_model,
    build_model_from_hf,
    gather_full_state_dict,
)
from hpcrl.train.packing import (
    PackedRows,
    check_attention_takes_masks,
    check_first_tokens,
    packed_micro_batches,
)
from hpcrl.train.pipeline import LossFn, run_micro_batch
from hpcrl.train.update import UpdateStep, build_update

log = logging.getLogger(__name__)


class Trainer:
    """Forward and update of one GPTModel shard; `head` turns the model output into HeadOutputs."""

    def __init__(
        self,
        model: torch.nn.Module,
        model_cfg: ModelConfig,
        groups: TrainGroups,
        head: PolicyHead | ValueHead | ScoreHead,
        *,
        optim_cfg: OptimizerConfig | None,
        lr: float | None = None,
        pack_sequences: bool | None = None,
    ):
        self.model, self.model_cfg, self.groups, self.head = model, model_cfg, groups, head
        self.optim_cfg = optim_cfg
        # a reference model has no optimizer section: OptimizerConfig still owns the micro-batch default
        micro_batching = optim_cfg or OptimizerConfig()
        self.micro_batch_size = micro_batching.micro_batch_size
        self.max_tokens_per_micro_batch = micro_batching.max_tokens_per_micro_batch
        self.pack_sequences = micro_batching.pack_sequences if pack_sequences is None else pack_sequences
        """Run micro-batches as packed rows (hpcrl.train.packing); a frozen model takes the actor's choice."""
        if self.pack_sequences:
            check_attention_takes_masks(model)
        self.update_step: UpdateStep | None = None  # None for a reference model
        if optim_cfg is not None:
            lr = lr if lr is not None else optim_cfg.lr
            self.update_step = build_update(model, model_cfg, groups, optim_cfg, lr)
        self._dtype = DTYPES[model_cfg.dtype]
        self._device = next(model.parameters()).device
        self._pre_step_hooks: list[Callable[[], None]] = []

    @property
    def optimizer(self):
        """The optimizer of the update step (torch AdamW or megatron's), None for a reference model."""
        return self.update_step.optimizer if self.update_step is not None else None

    @property
    def masters(self):
        """fp32 masters of 16-bit params on the torch path (hpcrl.train.optimizer.MasterWeights)."""
        return getattr(self.update_step, "masters", None)

    def add_pre_step_hook(self, hook: Callable[[], None]) -> Callable[[], None]:
        """Call `hook()` right before every optimizer step, i.e. before the parameters and optimizer
        state are written in place (an async checkpoint fences its snapshot here). Returns the remover."""
        self._pre_step_hooks.append(hook)
        return lambda: self._pre_step_hooks.remove(hook)

    # ----------------------------------------------------------------------------------------------- forward
    @torch.no_grad()
    def forward(self, batch: TrainBatch, micro_batch_size: int | None = None) -> HeadOutputs:
        """Head outputs for this DP rank's batch ([B, T] each, aligned to tokens), on every rank of the block."""
        self.model.eval()
        batch = batch.to(self._device)
        parts: list[HeadOutputs] = []
        order = []
        for index, mb, packed in self._micro_batches(batch, micro_batch_size or self.micro_batch_size, False):
            outputs, _, _ = self._run_micro_batch(mb, packed=packed)
            parts.append(outputs)
            order.append(index)
        return self._broadcast_from_last_stage(parts, batch.input_ids_BT.shape, torch.cat(order))

    def _micro_batches(
        self, batch: TrainBatch, micro_batch_size: int, by_budget: bool
    ) -> list[tuple[torch.Tensor | None, TrainBatch, PackedRows | None]]:
        """(row indices, micro-batch, packed layout or None) in running order: packed rows
        (hpcrl.train.packing), else by token budget (`by_budget`, hpcrl.train.token_budget; row indices
        None: an update does not need them) or micro_batch_size rows."""
        budget = self.max_tokens_per_micro_batch
        if self.pack_sequences:
            check_first_tokens(batch.attention_mask_BT, batch.response_mask_BT)
            cut = packed_micro_batches(
                batch.attention_mask_BT.cpu(),
                micro_batch_size=micro_batch_size,
                max_tokens=budget,
                hidden_size=self.model_cfg.hidden_size,
            )
            return [
                (index, batch.select(index.to(self._device)), packed.to(self._device))
                for index, packed in cut
            ]
        if by_budget and budget:  # the same gradient for any cut (hpcrl.train.token_budget)
            return [(None, mb, None) for mb in batch.token_micro_batches(budget)]
        starts = range(0, len(batch), micro_batch_size)
        micro_batches = batch.micro_batches(micro_batch_size)
        return [(torch.arange(s, s + len(mb)), mb, None) for s, mb in zip(starts, micro_batches, strict=True)]

    def _run_micro_batch(
        self,
        mb: TrainBatch,
        loss_fn: LossFn | None = None,
        loss_scale: float = 1.0,
        packed: PackedRows | None = None,
    ):
        """One micro-batch through this rank's pipeline stage (forward; backward too when `loss_fn`)."""
        return run_micro_batch(
            self.model,
            mb,
            self.groups,
            self.head,
            hidden_size=self.model_cfg.hidden_size,
            dtype=self._dtype,
            loss_fn=loss_fn,
            loss_scale=loss_scale,
            packed=packed,
        )

    def _broadcast_from_last_stage(
        self, parts: list[HeadOutputs | None], shape_BT, order: torch.Tensor
    ) -> HeadOutputs:
        """The head outputs of every micro-batch, rows back in the batch's order (`order`: the batch row
        of each output row), on every stage."""
        keys = self.head.keys
        if self.groups.is_last_stage:
            inverse = torch.argsort(order.to(self._device))
            merged = {
                k: torch.cat([getattr(p, k) for p in parts])[inverse].float().contiguous() for k in keys
            }
        else:
            merged = {k: torch.empty(shape_BT, dtype=torch.float32, device=self._device) for k in keys}
        if self.groups.pipeline > 1:
            src = self.groups.rank_of(self.groups.tp_rank, self.groups.pipeline - 1, self.groups.dp_rank)
            for k in keys:
                dist.broadcast(merged[k], src=src, group=self.groups.pp)
        return HeadOutputs(**merged)

    # ------------------------------------------------------------------------------------------------ update
    def update(
        self, batch: TrainBatch, loss_fn: LossFn, micro_batch_size: int | None = None
    ) -> dict[str, float]:
        """One optimizer step over this DP rank's batch (all DP ranks call it together)."""
        if self.optimizer is None:
            raise RuntimeError(
                "this trainer has no optimizer (built with optim_cfg=None, e.g. a reference model)"
            )
        self.model.train()
        batch = batch.to(self._device)
        self._set_global_counts(batch)
        step = self.update_step
        step.zero_grads()
        micro_batches = self._micro_batches(batch, micro_batch_size or self.micro_batch_size, True)
        losses, metric_sums = [], {}
        computed = real = 0
        for position, (_, mb, packed) in enumerate(micro_batches):
            with step.accumulating(last=position == len(micro_batches) - 1):
                _, loss, metrics = self._run_micro_batch(mb, loss_fn, step.loss_scale(), packed)
            step.after_micro_batch()
            computed += packed.computed_tokens if packed else mb.input_ids_BT.numel()
            real += packed.real_tokens if packed else int(mb.attention_mask_BT.bool().sum())
            if loss is not None:
                losses.append(float(loss.detach()))
                for k, v in metrics.items():
                    metric_sums[k] = metric_sums.get(k, 0.0) + float(v.detach() if torch.is_tensor(v) else v)
        norm, stepped = step.step(self._run_pre_step_hooks)
        if not stepped:
            log.warning("non-finite gradient norm (%s): optimizer step skipped, weights unchanged", norm)
        result = {"loss": sum(losses), **{k: v / len(micro_batches) for k, v in metric_sums.items()}}
        result |= {
            "computed_tokens": float(computed),
            "real_tokens": float(real),
        }  # DP means: the ratio holds
        result = self._reduce_metrics(result)
        result["padding_fraction"] = 1.0 - result["real_tokens"] / max(result["computed_tokens"], 1.0)
        result["grad_norm"] = norm
        result["update_skipped_nonfinite"] = 0.0 if stepped else 1.0
        return result

    def _run_pre_step_hooks(self) -> None:
        for hook in list(self._pre_step_hooks):
            hook()

    def param_state(self, param: torch.nn.Parameter) -> dict[str, torch.Tensor]:
        """Checkpoint state of `param` beyond its value: "master", "exp_avg", "exp_avg_sq", "step" (those
        that exist; {} for a reference model). Collective over DP with megatron's distributed optimizer."""
        return self.update_step.param_state(param) if self.update_step is not None else {}

    def scaler_state(self) -> dict:
        """fp16 loss-scale state of the update step ({} when there is none): part of a checkpoint."""
        return self.update_step.scaler_state() if self.update_step is not None else {}

    def load_scaler_state(self, state: dict) -> None:
        if self.update_step is not None:
            self.update_step.load_scaler_state(state)

    def load_param_state(self, param: torch.nn.Parameter, value: torch.Tensor, state: dict | None) -> None:
        """Set `param` to `value` (and its master), and its optimizer state when `state` is given."""
        if self.update_step is None:
            param.copy_(value)
        else:
            self.update_step.load_param_state(param, value, state)

    def _set_global_counts(self, batch: TrainBatch) -> None:
        counts = torch.tensor(
            [len(batch), int(batch.response_mask_BT.bool().sum())], dtype=torch.float64, device=self._device
        )
        if self.groups.data > 1:
            dist.all_reduce(counts, group=self.groups.dp)
        batch.num_global_seqs, batch.num_global_response_tokens = int(counts[0]), int(counts[1])

    def _reduce_metrics(self, local: dict[str, float]) -> dict[str, float]:
        """Global loss (sum over DP), metric means over DP; the same dict on every rank of the layout."""
        keys = sorted(local)
        if self.groups.pipeline > 1:
            box = [keys]
            src = self.groups.rank_of(self.groups.tp_rank, self.groups.pipeline - 1, self.groups.dp_rank)
            dist.broadcast_object_list(box, src=src, group=self.groups.pp)
            keys = box[0]
        values = torch.tensor([local.get(k, 0.0) for k in keys], dtype=torch.float64, device=self._device)
        if self.groups.pipeline > 1:
            dist.broadcast(values, src=src, group=self.groups.pp)
        if self.groups.data > 1:
            dist.all_reduce(values, group=self.groups.dp)
            is_loss = torch.tensor([k == "loss" for k in keys], device=self._device)
            values = torch.where(is_loss, values, values / self.groups.data)
        return dict(zip(keys, values.tolist(), strict=True))

    # ---------------------------------------------------------------------------------------------- weights
    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Full (t=1, p=1) Megatron state dict on every rank of the TP x PP block (small models/tests)."""
        return gather_full_state_dict(self.model, self.model_cfg, self.groups)

    def hf_state_dict(self) -> dict[str, torch.Tensor]:
        """Full HF state dict of a policy model (see full_state_dict)."""
        return hf_convert.megatron_to_hf_state_dict(self.full_state_dict(), self.model_cfg)


def _kept_fields(cfg: ModelConfig) -> dict:
    """Non-architecture fields of the user's ModelConfig that an HF directory's config must not override."""
    return {"dtype": cfg.dtype, "init_seed": cfg.init_seed}


def _from_hf(cfg: ModelConfig, groups: TrainGroups, *, value_head: bool = False):
    """(model, ModelConfig of the directory) for `cfg.hf_path`. The template's own architecture values
    are checked against config.json first: a mismatch is a ConfigError before any weight is read."""
    with_hf_architecture(cfg)
    return build_model_from_hf(cfg.hf_path, groups, value_head=value_head, **_kept_fields(cfg))


def _build(model, cfg, groups, head, optim_cfg, lr, pack_sequences=None):
    return Trainer(model, cfg, groups, head, optim_cfg=optim_cfg, lr=lr, pack_sequences=pack_sequences)


def build_policy_trainer(
    model_cfg: ModelConfig,
    optim_cfg: OptimizerConfig | None,
    groups: TrainGroups,
    *,
    temperature: float = 1.0,
    greedy: bool = False,
    pack_sequences: bool | None = None,
) -> Trainer:
    """Actor (with optimizer) or reference (optim_cfg=None): log-probs and entropy from the LM head (with
    `greedy`, whether each token is the argmax too). Loads `model_cfg.hf_path` when set, else random init
    from `model_cfg.init_seed`. `pack_sequences` None: optim_cfg's (off without one)."""
    if model_cfg.hf_path:
        model, model_cfg = _from_hf(model_cfg, groups)
    else:
        model = build_gpt_model(model_cfg, groups)
    return _build(
        model,
        model_cfg,
        groups,
        PolicyHead(groups.tp, groups.tp_rank, temperature, greedy=greedy),
        optim_cfg,
        None,
        pack_sequences,
    )


def build_value_trainer(model_cfg: ModelConfig, optim_cfg: OptimizerConfig, groups: TrainGroups) -> Trainer:
    """Critic: the same trunk with a ScalarHead; lr = optim_cfg.critic_lr or optim_cfg.lr."""
    lr = optim_cfg.critic_lr if optim_cfg.critic_lr is not None else optim_cfg.lr
    return _build(*_scalar_model(model_cfg, groups), groups, ValueHead(), optim_cfg, lr)


def build_reward_trainer(
    model_cfg: ModelConfig,
    optim_cfg: OptimizerConfig | None,
    groups: TrainGroups,
    *,
    pack_sequences: bool | None = None,
) -> Trainer:
    """Reward model: the critic's trunk and ScalarHead (the head fresh, the trunk from `model.hf_path`,
    e.g. the SFT model, when set), scoring each prefix (ScoreHead); lr = optim_cfg.lr."""
    return _build(*_scalar_model(model_cfg, groups), groups, ScoreHead(), optim_cfg, None, pack_sequences)


def _scalar_model(model_cfg: ModelConfig, groups: TrainGroups):
    """(model with a ScalarHead, its ModelConfig)."""
    if model_cfg.hf_path:
        return _from_hf(model_cfg, groups, value_head=True)
    return build_gpt_model(model_cfg, groups, value_head=True), model_cfg
