"""The update through megatron-core's DDP and distributed optimizer: the GPU training path.

    update = MegatronUpdate(model, model_cfg, groups, optim_cfg, lr)   # wraps `model` in megatron DDP

What megatron gives here (what a Megatron user expects from `--use-distributed-optimizer`):
- DDP (`megatron.core.distributed.DistributedDataParallel`): one contiguous fp32 grad buffer per dtype
  (`param.main_grad`, `grad_reduce_in_fp32`), grads accumulated there by backward hooks over all
  micro-batches; with `overlap_grad_reduce` the bucketed reduce-scatters start during the last
  micro-batch's backward (`no_sync()` around the others).
- DistributedOptimizer (ZeRO-1; Rajbhandari et al. 2020 "ZeRO", §5.1 P_os; megatron-core
  `optimizer/distrib_optimizer.py`): the fp32 master weights and both Adam moments are sharded over
  DP, each rank steps only its 1/d slice of the flat buffer, then the updated 16-bit params are
  all-gathered. Per parameter, optimizer memory drops from 12 bytes (fp32 master + m + v) to 12/d.
- fp16: megatron's dynamic grad scaler (loss x scale before backward, unscale + inf check, skip and
  back off on overflow; Micikevicius et al. 2018 §3.2).

On CPU: megatron-core's optimizer allocates with the string literal `device='cuda'` and checks
`param.type() == 'torch.cuda.FloatTensor'` (optimizer.py, distrib_optimizer.py, clip_grads.py; see
docs/FACTS.md). `hpcrl.train.megatron_compat.enable_optimizer()` (called here, inert with CUDA) maps
exactly those to CPU, so the same DDP + distributed optimizer code runs over gloo: what
`hpcrl rehearse` runs for a GPU recipe, and what the CPU tests compare with the torch backend.
`resolve_backend` picks this path for "auto" on CUDA; `backend: megatron` picks it anywhere.

Parameter storage: megatron's DDP makes each parameter a view of its contiguous param buffer; the
optimizer steps its fp32 masters and all-gathers the rounded values into that buffer. `written_view`
reads a parameter's weights back through the buffer (`param_index_map`), not through `param.data`, so
a check can tell when something repointed `.data` away from what the optimizer updates.

Implements hpcrl.train.update.UpdateStep, with the same contract as hpcrl.train.optimizer.TorchUpdate: grads are SUMMED over micro-batches and DP (the
trainer's loss is normalised with global counts; `calculate_per_token_loss=True` in the
TransformerConfig makes megatron DDP's scaling factor 1), the grad norm counts each parameter once, a
non-finite norm skips the step on every rank. Weight decay follows megatron (no decay on norms and
biases), unlike the torch path which decays every parameter.

Checkpoint state (`param_state` / `load_param_state`, per parameter, whole over DP) goes through
megatron-core's public `DistributedOptimizer.sharded_state_dict` ("fully_sharded_model_space": each
owned piece of a parameter's master and moments with the flattened range it covers); the DP gather is
hpcrl's own all-reduce. Whole per parameter, a checkpoint loads under any DP size (hpcrl.ckpt.megatron
maps it to global TP offsets). See `MegatronUpdate.owned_shards` for what megatron-core 0.16.1 forces.

Public: `MegatronUpdate`, `OwnedShard`.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from dataclasses import dataclass
from types import MappingProxyType

import torch
import torch.distributed as dist

from hpcrl.errors import ConfigError, Problem
from hpcrl.train import megatron_compat
from hpcrl.train.config import ModelConfig, OptimizerConfig
from hpcrl.train.loss_scale import DynamicLossScale
from hpcrl.train.model import TrainGroups, is_tied

_ADAM_KEYS = ("exp_avg", "exp_avg_sq")
_STATE_NAMES = (("fp32_param", "master"),)  # megatron's sharded-state key -> hpcrl's
_MODEL_SPACE = MappingProxyType({"distrib_optim_sharding_type": "fully_sharded_model_space"})


def megatron_process_groups(groups: TrainGroups):
    """The ProcessGroupCollection megatron's DDP and optimizer read: hpcrl's groups, with the expert
    groups of a dense model set to this rank alone and the optimizer's norm group = the whole block."""
    pgc = groups.pg_collection()
    pgc.ep = pgc.expt_dp = groups.cp  # dense model: no expert parallelism (size-1 groups)
    pgc.tp_ep_pp = groups.mp
    pgc.intra_dist_opt = groups.block
    return pgc


def ddp_config(optim_cfg: OptimizerConfig, *, distributed_optimizer: bool = True):
    from megatron.core.distributed import DistributedDataParallelConfig

    return DistributedDataParallelConfig(
        grad_reduce_in_fp32=True,
        overlap_grad_reduce=optim_cfg.overlap_grad_reduce,
        use_distributed_optimizer=distributed_optimizer,
        check_for_nan_in_grad=False,  # hpcrl skips a non-finite step itself (and says so in the metrics)
    )


def wrap_ddp(model: torch.nn.Module, groups: TrainGroups, optim_cfg: OptimizerConfig, **kwargs):
    """megatron DDP around `model` (parameters keep their identity; grads go to `param.main_grad`)."""
    from megatron.core.distributed import DistributedDataParallel

    return DistributedDataParallel(
        model.config, ddp_config(optim_cfg, **kwargs), model, pg_collection=megatron_process_groups(groups)
    )


class MegatronUpdate:
    """megatron DDP + DistributedOptimizer behind the trainer's update-step interface."""

    def __init__(
        self,
        model: torch.nn.Module,
        model_cfg: ModelConfig,
        groups: TrainGroups,
        optim_cfg: OptimizerConfig,
        lr: float,
    ):
        from megatron.core.optimizer import OptimizerConfig as MegatronOptimizerConfig
        from megatron.core.optimizer import get_megatron_optimizer

        megatron_compat.enable_optimizer()  # inert with CUDA
        dtypes = {p.dtype for p in model.parameters()}
        if len(dtypes) > 1:  # see hpcrl.train.dtypes.cast_to_model_dtype: megatron pairs states wrongly then
            raise ConfigError(
                Problem(
                    f"megatron's distributed optimizer needs one parameter dtype, the model has "
                    f"{sorted(map(str, dtypes))} (megatron-core 0.16.1 pairs optimizer state with the wrong "
                    "parameters in a mixed param group)",
                    key="model.dtype",
                )
            )
        self.model, self.groups, self.cfg = model, groups, optim_cfg
        self.ddp = wrap_ddp(model, groups, optim_cfg)
        self._buffer_spans = {  # param -> (its DDP buffer, start, end): where the optimizer writes it
            param: (buffer, start, end)
            for buffer in self.ddp.buffers
            for param, (start, end, _bucket) in buffer.param_index_map.items()
        }
        dtype, fp16_scale = model_cfg.dtype, DynamicLossScale()  # one source for the fp16 scale defaults
        self.optimizer = get_megatron_optimizer(
            MegatronOptimizerConfig(
                optimizer="adam",  # decoupled weight decay (AdamW) in TE/apex FusedAdam and torch's fallback
                lr=lr,
                min_lr=lr,
                weight_decay=optim_cfg.weight_decay,
                adam_beta1=optim_cfg.betas[0],
                adam_beta2=optim_cfg.betas[1],
                adam_eps=optim_cfg.eps,
                clip_grad=optim_cfg.grad_clip,
                bf16=dtype == "bfloat16",
                fp16=dtype == "float16",
                params_dtype=next(model.parameters()).dtype,
                # fp16: the torch path's dynamic scale (halve on every overflow, double after 1000 clean steps)
                initial_loss_scale=fp16_scale.scale,
                loss_scale_window=fp16_scale.growth_interval,
                min_loss_scale=fp16_scale.minimum,
                hysteresis=1,
                use_distributed_optimizer=True,
            ),
            [self.ddp],
            pg_collection=megatron_process_groups(groups),
            use_gloo_process_groups=False,
        )
        for group in self.optimizer.param_groups:  # no LR scheduler: a constant LR, as on the torch path
            group["lr"] = lr
        [self._dist_opt] = self.optimizer.chained_optimizers  # dense model: one DistributedOptimizer
        # Adam moments exist once a step was taken (or loaded): the same on every rank, so a checkpoint
        # knows without a collective which tensors every DP rank contributes
        self._has_moments = False
        self._shards: dict[torch.nn.Parameter, OwnedShard] | None = None  # see owned_shards

    # ---------------------------------------------------------------------- the trainer's update protocol
    def zero_grads(self) -> None:
        self.ddp.zero_grad_buffer()
        self.optimizer.zero_grad()
        self._sync_masters_from_params()

    @torch.no_grad()
    def _sync_masters_from_params(self) -> None:
        """Masters follow writes into the parameters made outside the optimizer (a weight load after the
        optimizer was built): an owned master element that no longer rounds to its parameter takes the
        parameter's value, as hpcrl.train.optimizer.MasterWeights.sync_from_params does. After megatron's
        own steps every master rounds to its parameter, so this changes nothing then."""
        for param, owned in self.owned_shards().items():
            master, shard = owned.tensors["master"], param.detach().reshape(-1)[owned.start : owned.end]
            if master.data_ptr() == shard.data_ptr():  # fp32 param: the master IS the parameter's shard
                continue
            stale = master.to(param.dtype) != shard
            if bool(stale.any()):
                master[stale] = shard[stale].to(master.dtype)

    def accumulating(self, last: bool) -> contextlib.AbstractContextManager:
        """Around one micro-batch's backward: all but the last skip DDP's grad reduction."""
        return contextlib.nullcontext() if last else self.ddp.no_sync()

    def after_micro_batch(self) -> None:
        """Nothing: megatron's backward hooks already accumulated into the fp32 main_grad buffer."""

    def loss_scale(self) -> float:
        return float(self.optimizer.get_loss_scale())

    def scaler_state(self) -> dict:
        """megatron's dynamic grad scaler state, JSON-able ({} without fp16)."""
        scaler = self._dist_opt.grad_scaler
        if scaler is None:
            return {}
        return {k: float(v) if torch.is_tensor(v) else v for k, v in scaler.state_dict().items()}

    def load_scaler_state(self, state: dict) -> None:
        scaler = self._dist_opt.grad_scaler
        if scaler is not None and state:
            scaler.load_state_dict({**state, "scale": torch.tensor([float(state["scale"])])})

    def step(self, before_step: Callable[[], None]) -> tuple[float, bool]:
        """Reduce-scatter grads, norm, clip, step the local shard, all-gather params.
        Returns (pre-clip grad norm, stepped)."""
        from megatron.core.optimizer.clip_grads import clip_grad_by_total_norm_fp32

        self.ddp.finish_grad_sync()
        self._allreduce_tied_embedding_grads()
        if self.optimizer.prepare_grads():  # fp16 overflow: the scaler backed off; skip like megatron
            return math.inf, False
        norm = float(self.optimizer.get_grad_norm())
        if not math.isfinite(norm):
            return norm, False
        if self.cfg.grad_clip > 0:
            clip_grad_by_total_norm_fp32(self._dist_opt.get_parameters(), self.cfg.grad_clip, norm)
        before_step()
        self.optimizer.step_with_ready_grads()
        self._has_moments = True
        return norm, True

    def _allreduce_tied_embedding_grads(self) -> None:
        """p > 1 with tied embeddings: sum the main_grads of the first stage's embedding and the last
        stage's output copy (megatron's finalize_model_grads does this over its embedding group)."""
        if self.groups.embd is None or not is_tied(self.model):
            return
        dist.all_reduce(self.model.shared_embedding_or_output_weight().main_grad, group=self.groups.embd)

    def written_view(self, param: torch.nn.Parameter) -> torch.Tensor:
        """`param`'s weights in DDP's param buffer, where the distributed optimizer all-gathers them."""
        buffer, start, end = self._buffer_spans[param]
        return buffer.param_data[start:end].view(param.shape)

    # ------------------------------------------------------------------------------- checkpoint state
    @torch.no_grad()
    def param_state(self, param: torch.nn.Parameter) -> dict[str, torch.Tensor]:
        """fp32 master, Adam moments and step of `param`, whole (this rank's TP shard of it), gathered
        over DP from the distributed optimizer's flat shards. Collective over DP: every rank calls it
        for every parameter in the same order."""
        shard = self.owned_shards().get(param)
        keys = ("master", *_ADAM_KEYS) if self._has_moments else ("master",)
        full = {}
        for key in keys:
            flat = torch.zeros(param.numel(), dtype=torch.float32, device=param.device)
            if shard is not None:
                flat[shard.start : shard.end] = shard.tensors[key].float()
            dist.all_reduce(flat, group=self.groups.dp)  # each element is owned by exactly one DP rank
            full[key] = flat.view(param.shape)
        if self._has_moments:
            full["step"] = torch.tensor(float(self._step_count()))
        return full

    @torch.no_grad()
    def load_param_state(self, param: torch.nn.Parameter, value: torch.Tensor, state: dict | None) -> None:
        """Set `param` (every DP rank: the checkpoint holds it whole) and this rank's slice of its
        master and Adam moments; `state` None: a fresh optimizer (zero moments, step 0). The values go
        into the optimizer's own tensors that `owned_shards` hands out (see there why not through
        DistributedOptimizer.load_state_dict)."""
        param.copy_(value)
        step = int(state["step"]) if state is not None else 0
        shards = self.owned_shards()
        self._set_step_count(step, shards)
        self._has_moments = state is not None
        shard = shards.get(param)
        if shard is None:
            return
        shard.tensors["master"].copy_(value.reshape(-1)[shard.start : shard.end])
        for key in _ADAM_KEYS:
            if state is None:
                shard.tensors[key].zero_()
            else:
                shard.tensors[key].copy_(state[key].reshape(-1)[shard.start : shard.end])

    def owned_shards(self) -> dict[torch.nn.Parameter, OwnedShard]:
        """For each parameter this DP rank steps a piece of: that piece (elements [start, end) of the
        flattened parameter) and its optimizer tensors, the optimizer's own (no copies).

        Read through megatron-core's public `DistributedOptimizer.sharded_state_dict` in its default
        format "fully_sharded_model_space" (distrib_optimizer.py `sharded_param_state_fs_model_space`):
        one entry per owned parameter, matched to the model by tensor identity, each state tensor with
        the `flattened_range` it covers in the parameter. What megatron-core 0.16.1 forces here:
        - the model-side entries are `ShardedTensorFactory`s, not `ShardedTensor`s: the optimizer copies
          them with `flattened_range=` set, and ShardedTensor rejects any flattened_range
          ("ShardedTensor.flattened_range is not supported.", dist_checkpointing/mapping.py:134), so
          a model `sharded_state_dict()` of plain ShardedTensors fails there (distrib_optimizer.py:1748);
        - it is read with `is_loading=False` and loads write into these tensors: `is_loading=True`
          re-loads the optimizer via load_state_dict(self.state_dict()) (distrib_optimizer.py:1268), which
          on torch's AdamW (the fallback without TE/apex) gives every parameter ONE shared step tensor
          (:821-825), so each step then adds 1 per parameter; and `load_state_dict` of this format fails
          there with KeyError 'step' (it drops "step" at :1819, then copies every key of the torch
          state at :940). Writing in place is what a dist_checkpointing load does to these tensors.
        The Adam state is created first (`_allocate_state`): `state_dict()` needs it (:642)."""
        if self._shards is None:  # built once: the optimizer never reallocates its state once it exists
            self._allocate_state()
            named = dict(self.model.named_parameters())
            sharded = self._dist_opt.sharded_state_dict(
                _model_sharded_state_dict(named), is_loading=False, metadata=dict(_MODEL_SPACE)
            )
            self._shards = _shards_by_param(sharded["param_state"], named)
        return self._shards

    def _allocate_state(self) -> None:
        """Adam moments before the first step, as megatron creates them for a checkpoint load: its
        `init_state_fn` (zeros, what Adam's first step would create; megatron-core optimizer/__init__.py
        `init_state_fn`). torch's Adam/AdamW also keep a per-parameter step, created here as torch does
        (`torch.tensor(0.0)`, torch/optim/adamw.py `_init_group`); TE/apex FusedAdam count per group."""
        opt = self._dist_opt
        if opt.optimizer.state:
            return
        opt.init_state_fn(opt.optimizer, opt.config)
        if isinstance(opt.optimizer, torch.optim.Adam | torch.optim.AdamW):
            for state in opt.optimizer.state.values():
                state.setdefault("step", torch.tensor(0.0))

    def _set_step_count(self, step: int, shards: dict[torch.nn.Parameter, OwnedShard]) -> None:
        for group in self._dist_opt.optimizer.param_groups:  # TE/apex FusedAdam count steps per group
            group["step"] = step
        for shard in shards.values():  # torch's Adam/AdamW count steps per parameter
            if "step" in shard.tensors:
                shard.tensors["step"].fill_(float(step))

    def _step_count(self) -> int:
        """The optimizer's step, as megatron saves it (DistributedOptimizer.state_dict: from the torch
        state or from TE/apex's param groups)."""
        groups = self._dist_opt.state_dict()["optimizer"]["param_groups"]
        return int(groups[0].get("step") or 0)


@dataclass(frozen=True)
class OwnedShard:
    """This DP rank's piece of one parameter: elements [start, end) of the flattened parameter (its TP
    shard), and the optimizer tensors for them ("master", "exp_avg", "exp_avg_sq"; "step" on torch's
    Adam, a scalar)."""

    start: int
    end: int
    tensors: dict[str, torch.Tensor]


def _model_sharded_state_dict(named: dict[str, torch.nn.Parameter]) -> dict:
    """One model-side entry per parameter, keyed by its local name; the optimizer matches its state to
    them by tensor identity (`param_to_sharded_metadata[sh_base.data]`)."""
    # megatron is imported here, as in the rest of this module: only the GPU path needs it
    from megatron.core.dist_checkpointing.mapping import ShardedTensorFactory

    return {
        name: ShardedTensorFactory(name, param, _not_serialised, _not_serialised, replica_id=(0, 0, 0))
        for name, param in named.items()
    }


def _shards_by_param(param_state: dict, named: dict[str, torch.nn.Parameter]) -> dict:
    """The optimizer's "fully_sharded_model_space" param_state (entries keyed "optimizer.state.{state
    key}.{model key}", distrib_optimizer.py `sharded_param_state_fs_model_space`) by model parameter."""
    shards = {}
    for entries in param_state.values():
        tensors, span, name = {}, None, None
        for key, entry in entries.items():
            if key == "step":  # a plain tensor, not sharded
                tensors["step"] = entry
                continue
            name = entry.key.removeprefix(f"optimizer.state.{key}.")
            span = entry.flattened_range
            tensors[dict(_STATE_NAMES).get(key, key)] = entry.data
        shards[named[name]] = OwnedShard(span.start, span.stop, tensors)
    return shards


def _not_serialised(*args) -> None:
    """build_fn/merge_fn of the model-side factories: hpcrl writes its own shards (hpcrl.ckpt.megatron),
    never megatron's dist_checkpointing, so these are never called."""
    raise NotImplementedError("hpcrl checkpoints through hpcrl.ckpt, not megatron dist_checkpointing")
