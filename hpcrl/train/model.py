"""Build a megatron-core GPTModel (Llama/Qwen2 family) under a training layout p-t-d, from a ModelConfig
or from an HF directory, with process groups passed explicitly.

Parallel state: hpcrl does NOT call megatron's `parallel_state.initialize_model_parallel` (58 module
globals). It builds its own groups (`build_train_groups`) with the training rank order of
hpcrl.distributed.layout.ParallelLayout, rank = offset + tp + t*(pp + p*dp) (tp fastest, then pp, then dp), and
passes them to megatron-core 0.16.1 through `ProcessGroupCollection` (`GPTModel(pg_collection=...)`),
which its GPT path honours (tensor-parallel layers, transformer block layer offsets, rotary, embedding).
Two process-wide megatron prerequisites remain and are set here: the scratch `GlobalMemoryBuffer` (used by
the local attention) and the RNG tracker seeds (`model_parallel_cuda_manual_seed` with an explicit
tp_rank). Because groups are explicit, a model may live on a sub-block of the world (`rank_offset`), e.g.
a critic pool beside an actor pool.

Tied embeddings with p > 1: megatron keeps a copy of the embedding on the last stage and syncs it over
an "embedding group" with `weight.data.cuda()`; hpcrl passes `embd=None` to megatron and does that sync
itself (`sync_tied_embedding`), and the trainer all-reduces the two copies' grads over `groups.embd`.

Public: `TrainGroups`, `build_train_groups`, `transformer_config`, `build_gpt_model`, `build_model_from_hf`,
`load_full_state_dict`, `gather_full_state_dict`, `global_param_name`, `named_global_params`,
`is_tied`, `attention_mask_for_megatron`,
`forward_logits`, `forward_masked`, `ScalarHead`.

Shapes: B batch, T tokens, V vocabulary (V/t per TP rank), H hidden.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn.functional as F

from hpcrl.distributed.groups import new_group
from hpcrl.distributed.layout import ParallelLayout
from hpcrl.errors import ConfigError, Problem
from hpcrl.train import hf_convert, megatron_compat
from hpcrl.train.config import ModelConfig
from hpcrl.train.dtypes import DTYPES, cast_to_model_dtype

# TE spec fuses the norms into the following linear layer; the local spec keeps them separate.
_TE_NORM_ALIASES = {
    "self_attention.linear_qkv.layer_norm_weight": "input_layernorm.weight",
    "mlp.linear_fc1.layer_norm_weight": "pre_mlp_layernorm.weight",
}


@dataclass(frozen=True)
class TrainGroups:
    """One rank's training process groups for layout p-t-d; rank = offset + tp + t*(pp + p*dp)."""

    tensor: int
    pipeline: int
    data: int
    rank_offset: int
    tp_rank: int
    pp_rank: int
    dp_rank: int
    tp: dist.ProcessGroup
    pp: dist.ProcessGroup
    dp: dist.ProcessGroup
    mp: dist.ProcessGroup
    """tensor x pipeline block of this rank (the grad-norm reduction group)."""
    embd: dist.ProcessGroup | None
    """First and last pipeline stage of this (tp, dp) slot when p > 1, else None."""
    cp: dist.ProcessGroup = field(repr=False)
    """This rank alone (megatron wants a context-parallel group; hpcrl uses cp = 1)."""
    block: dist.ProcessGroup | None = field(default=None, repr=False)
    """All t*p*d ranks of this layout (megatron's distributed optimizer reduces grad norms over it)."""
    coords_to_rank: Callable[[int, int, int], int] | None = field(default=None, repr=False, compare=False)
    """(tp, pp, dp) -> global rank when the grid is not the training order (a generation model's strided
    groups, see `build_generation_groups`); None: offset + tp + t*(pp + p*dp)."""

    @property
    def is_first_stage(self) -> bool:
        return self.pp_rank == 0

    @property
    def is_last_stage(self) -> bool:
        return self.pp_rank == self.pipeline - 1

    def rank_of(self, tp: int, pp: int, dp: int) -> int:
        """Global rank of grid point (tp, pp, dp) of this layout."""
        if self.coords_to_rank is not None:
            return self.coords_to_rank(tp, pp, dp)
        layout = ParallelLayout(tensor=self.tensor, pipeline=self.pipeline, data=self.data)
        return self.rank_offset + layout.train_rank(tp, pp, dp)

    def pg_collection(self):
        """The megatron ProcessGroupCollection for GPTModel (embd deliberately None, see module doc)."""
        from megatron.core.process_groups_config import ProcessGroupCollection

        return ProcessGroupCollection(
            tp=self.tp,
            pp=self.pp,
            mp=self.mp,
            cp=self.cp,
            tp_cp=self.tp,
            dp=self.dp,
            dp_cp=self.dp,
            embd=None,
            pos_embd=None,
        )


def build_train_groups(
    tensor: int, pipeline: int, data: int, *, rank_offset: int = 0, timeout_s: float | None = None
) -> TrainGroups | None:
    """Create the training groups of layout p-t-d on ranks [offset, offset + p*t*d).

    Sizes are those of hpcrl.distributed.layout.ParallelLayout (tensor, pipeline, data). Collective over the
    WHOLE default group (torch's new_group rule): every rank calls it with the same arguments. Returns
    the calling rank's groups, or None when the rank is outside the block. `timeout_s` bounds every
    collective on these groups (a dead peer becomes an error, not a hang).
    """
    world = dist.get_world_size()
    size = tensor * pipeline * data
    if rank_offset < 0 or rank_offset + size > world:
        raise ConfigError(
            f"training layout p{pipeline}-t{tensor}-d{data} at offset {rank_offset} needs ranks up to "
            f"{rank_offset + size - 1}, world has {world}"
        )

    layout = ParallelLayout(tensor=tensor, pipeline=pipeline, data=data)
    me = dist.get_rank()
    mine: dict[str, dist.ProcessGroup | None] = {"embd": None}

    def make(name: str, block_ranks: list[int]) -> None:
        ranks = [rank_offset + r for r in block_ranks]
        group = new_group(ranks, timeout_s)  # every rank must take part in every new_group call
        if me in ranks:
            mine[name] = group

    # The rank lists come from ParallelLayout, the one owner of the rank order (tp, then pp, then dp).
    for ranks in layout.train_tensor_groups():
        make("tp", ranks)
    for ranks in layout.train_pipeline_groups():
        make("pp", ranks)
        if pipeline > 1:  # tied embedding copies live on the first and the last stage
            make("embd", [ranks[0], ranks[-1]])
    for ranks in layout.train_data_groups():
        make("dp", ranks)
    for ranks in layout.model_parallel_groups():
        make("mp", ranks)
    for r in range(size):
        make("cp", [r])
    make("block", list(range(size)))
    if not rank_offset <= me < rank_offset + size:
        return None
    tp_rank, pp_rank, dp_rank = layout.train_coords(me - rank_offset)
    return TrainGroups(
        tensor=tensor,
        pipeline=pipeline,
        data=data,
        rank_offset=rank_offset,
        tp_rank=tp_rank,
        pp_rank=pp_rank,
        dp_rank=dp_rank,
        tp=mine["tp"],
        pp=mine["pp"],
        dp=mine["dp"],
        mp=mine["mp"],
        embd=mine["embd"],
        cp=mine["cp"],
        block=mine["block"],
    )


def build_generation_groups(layout: ParallelLayout, *, timeout_s: float | None = None) -> TrainGroups | None:
    """The megatron groups of this rank's *generation* model: TP = t_g over ParallelLayout's strided
    generation TP groups, PP = p_g over its generation PP groups (HybridFlow §5.3: micro-DP groups are
    consecutive ranks, generation TP/PP groups take ranks at strides t/t_g and p/p_g).

    Collective over the whole default group (every rank calls it, same layout); None on ranks outside
    the layout (a second resource pool). `dp` is the generation data-parallel group (d_g·d replicas);
    `mp` the t_g·p_g ranks of one generation replica.
    """
    me = dist.get_rank()
    families = {
        "tp": layout.rollout_tensor_groups(),
        "pp": layout.rollout_pipeline_groups(),
        "dp": layout.rollout_data_groups(),
        "mp": layout.rollout_model_parallel_groups(),
        "cp": [[r] for r in range(layout.world_size)],
    }
    mine: dict[str, dist.ProcessGroup] = {}
    for name, groups in families.items():
        for ranks in groups:
            group = new_group(ranks, timeout_s)  # every rank takes part in every new_group call
            if me in ranks:
                mine[name] = group
    if me >= layout.world_size:
        return None
    coords = layout.rollout_coords(me)
    return TrainGroups(
        tensor=layout.rollout_tensor,
        pipeline=layout.rollout_pipeline,
        data=layout.rollout_data,
        rank_offset=0,
        tp_rank=coords.tensor,
        pp_rank=coords.pipeline,
        dp_rank=coords.data,
        tp=mine["tp"],
        pp=mine["pp"],
        dp=mine["dp"],
        mp=mine["mp"],
        embd=None,  # tied embeddings need p_g = 1 (hpcrl.reshard.build's rule)
        cp=mine["cp"],
        coords_to_rank=layout.rollout_rank,
    )


def validate_layout(cfg: ModelConfig, tensor: int, pipeline: int, key: str = "model") -> list[Problem]:
    """Rules a layout must meet for this model (checked before any rank builds anything)."""
    problems = hf_convert.validate_model_config(cfg, key)
    for size, what, name in (
        (cfg.vocab_size, "vocab_size", "tensor"),
        (cfg.num_attention_heads, "num_attention_heads", "tensor"),
        (cfg.num_query_groups, "num_query_groups", "tensor"),
        (cfg.ffn_hidden_size, "ffn_hidden_size", "tensor"),
        (cfg.num_layers, "num_layers", "pipeline"),
    ):
        parallel = tensor if name == "tensor" else pipeline
        if size % parallel:
            problems.append(
                Problem(f"{what}={size} must divide by parallel.{name}={parallel}", key=f"{key}.{what}")
            )
    return problems


def _prepare_megatron(groups: TrainGroups, seed: int) -> None:
    """Process-wide megatron prerequisites: CPU compat, scratch buffer, RNG tracker seeds."""
    from megatron.core import parallel_state, tensor_parallel

    megatron_compat.enable()  # no-op with CUDA
    if parallel_state._GLOBAL_MEMORY_BUFFER is None:
        parallel_state._set_global_memory_buffer()
    tensor_parallel.model_parallel_cuda_manual_seed(
        seed, tp_rank=groups.tp_rank, ep_rank=0, etp_rank=0, force_reset_rng=True
    )


def transformer_config(cfg: ModelConfig, groups: TrainGroups, *, initialize: bool = True):
    """megatron TransformerConfig of a Llama/Qwen2 decoder (docs/FACTS.md: parity settings). `initialize=False`
    skips the random init (weights that are overwritten before use, e.g. a generation model's)."""
    from megatron.core.transformer import TransformerConfig

    dtype = DTYPES[cfg.dtype]
    return TransformerConfig(
        num_layers=cfg.num_layers,
        hidden_size=cfg.hidden_size,
        num_attention_heads=cfg.num_attention_heads,
        num_query_groups=cfg.num_query_groups,
        kv_channels=hf_convert.head_dim(cfg),
        ffn_hidden_size=cfg.ffn_hidden_size,
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        add_qkv_bias=cfg.qkv_bias,
        normalization="RMSNorm",
        layernorm_epsilon=cfg.rms_norm_eps,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        tensor_model_parallel_size=groups.tensor,
        pipeline_model_parallel_size=groups.pipeline,
        use_cpu_initialization=not torch.cuda.is_available(),
        perform_initialization=initialize,
        params_dtype=dtype,
        pipeline_dtype=dtype,
        bf16=dtype == torch.bfloat16,
        fp16=dtype == torch.float16,
        bias_activation_fusion=False,
        masked_softmax_fusion=False,
        persist_layer_norm=False,
        gradient_accumulation_fusion=False,
        apply_rope_fusion=False,
        # hpcrl's losses are already normalised by global token/sequence counts (hpcrl.train.trainer's
        # loss contract), so megatron DDP must SUM grads over DP, not average them: this flag sets its
        # gradient scaling factor to 1 (it otherwise only affects MoE/MTP losses, not used here).
        calculate_per_token_loss=True,
    )


def _layer_spec():
    """TE spec when Transformer Engine imports with CUDA, else megatron's local (torch) spec."""
    from megatron.core.models.gpt import gpt_layer_specs as specs

    if torch.cuda.is_available():
        try:
            import transformer_engine  # noqa: F401

            return specs.get_gpt_layer_with_transformer_engine_spec()
        except ImportError:
            pass
    return specs.get_gpt_layer_local_spec(normalization="RMSNorm")


class ScalarHead(torch.nn.Linear):
    """Critic value head replacing GPTModel.output_layer: hidden [T, B, H] -> value [T, B, 1].

    Replicated across TP (its input, the final-norm output, is full on every TP rank), so no vocab
    split is needed, a size-1 "vocab" could not be split anyway. Same call signature as megatron's
    output layer, which returns (output, bias).
    """

    def forward(self, input_, weight=None, runtime_gather_output=None):  # noqa: ARG002
        return super().forward(input_), None


def build_gpt_model(
    cfg: ModelConfig, groups: TrainGroups, *, value_head: bool = False, initialize: bool = True
):
    """A GPTModel for this rank's pipeline stage and TP shard, randomly initialised from `cfg.init_seed`
    (`initialize=False`: memory only, for weights that arrive before first use).

    With `value_head` the output layer is a `ScalarHead` (critic); tied embeddings are then not used.
    Weights of TP shards agree with a t=1 model of the same seed (megatron initialises the full master
    weight on CPU and slices it); under p > 1 stages draw different random numbers than p = 1.
    """
    from megatron.core.models.gpt import GPTModel

    problems = validate_layout(cfg, groups.tensor, groups.pipeline)
    if problems:
        raise ConfigError(problems)
    _prepare_megatron(groups, cfg.init_seed)
    torch.manual_seed(cfg.init_seed)
    tie = cfg.tie_word_embeddings and not value_head
    model = GPTModel(
        config=transformer_config(cfg, groups, initialize=initialize),
        transformer_layer_spec=_layer_spec(),
        vocab_size=cfg.vocab_size,
        max_sequence_length=cfg.max_position_embeddings,
        pre_process=groups.is_first_stage,
        post_process=groups.is_last_stage,
        parallel_output=True,
        share_embeddings_and_output_weights=tie,
        position_embedding_type="rope",
        rotary_base=int(cfg.rope_theta) if float(cfg.rope_theta).is_integer() else cfg.rope_theta,
        pg_collection=groups.pg_collection(),
    )
    if value_head and groups.is_last_stage:
        model.output_layer = ScalarHead(cfg.hidden_size, 1, bias=False, dtype=DTYPES[cfg.dtype])
    cast_to_model_dtype(model, DTYPES[cfg.dtype])
    if torch.cuda.is_available():
        model = model.cuda()
    if value_head and groups.is_last_stage and groups.tensor > 1:  # replicated: one init for all TP ranks
        src = groups.rank_of(0, groups.pp_rank, groups.dp_rank)
        with torch.no_grad():
            dist.broadcast(model.output_layer.weight.data, src=src, group=groups.tp)
    if tie:
        sync_tied_embedding(model, groups)
    return model


def sync_tied_embedding(model, groups: TrainGroups) -> None:
    """With p > 1 copy the first stage's embedding into the last stage's output copy (megatron's init
    sync, done here over gloo/nccl without `.cuda()`)."""
    if groups.embd is None:
        return
    weight = model.shared_embedding_or_output_weight()
    src = groups.rank_of(groups.tp_rank, 0, groups.dp_rank)
    with torch.no_grad():
        dist.broadcast(weight.data, src=src, group=groups.embd)


def global_param_name(local_name: str, cfg: ModelConfig, groups: TrainGroups) -> str:
    """A parameter's name in the full (p=1) model: layer numbers shifted by the stage offset; TE fused
    norm names mapped to the local-spec names."""
    offset = groups.pp_rank * (cfg.num_layers // groups.pipeline)
    index = hf_convert.layer_index(local_name)
    if index is None:
        return local_name
    name = hf_convert.with_layer_index(local_name, index + offset)
    prefix, _, rest = name.partition(".layers.")
    number, _, suffix = rest.partition(".")
    return f"{prefix}.layers.{number}.{_TE_NORM_ALIASES.get(suffix, suffix)}"


def is_tied(model) -> bool:
    """True when the model shares embedding and output weights (never for a value-head model)."""
    return bool(getattr(model, "share_embeddings_and_output_weights", False))


def named_global_params(model, cfg: ModelConfig, groups: TrainGroups, *, tied_copy: bool = False):
    """(full-model name, parameter) of this rank. The critic's ScalarHead is named "value_head.weight"
    (replicated, not vocab-parallel). The last stage's copy of a tied embedding (p > 1) is included
    only with `tied_copy` (under the name "output_layer.weight")."""
    value_head = isinstance(getattr(model, "output_layer", None), ScalarHead)
    for local, param in model.named_parameters():
        name = global_param_name(local, cfg, groups)
        if name == "output_layer.weight" and value_head:
            name = "value_head.weight"
        elif name == "output_layer.weight" and is_tied(model) and not tied_copy:
            continue
        yield name, param


def load_full_state_dict(
    model, full_sd: dict[str, torch.Tensor], cfg: ModelConfig, groups: TrainGroups
) -> None:
    """Copy this rank's TP/PP shard of a full Megatron state dict (p=1, t=1 names) into `model`.

    Strict: every parameter must be found; shapes must match. With tied embeddings the last stage's
    output copy takes the embedding. Raises KeyError/ValueError naming the tensor.
    """
    with torch.no_grad():
        for name, param in named_global_params(model, cfg, groups, tied_copy=True):
            source = name
            if name == "output_layer.weight" and is_tied(model):
                source = "embedding.word_embeddings.weight"
            if source not in full_sd:
                raise KeyError(f"full state dict lacks {source!r} (pp stage {groups.pp_rank})")
            shard = hf_convert.shard_for_tp(source, full_sd[source], groups.tp_rank, groups.tensor)
            if shard.shape != param.shape:
                raise ValueError(
                    f"{source}: shard shape {tuple(shard.shape)} != parameter {tuple(param.shape)}"
                )
            param.copy_(shard)


def gather_full_state_dict(model, cfg: ModelConfig, groups: TrainGroups, *, grads: bool = False) -> dict:
    """The full (t=1, p=1) Megatron state dict (or the grads, `grads=True`) on every rank of the TP x PP
    block: TP shards all-gathered, stages exchanged with all_gather_object. For tests and export of
    small models; the reshard engine has the scalable path. Tied copies on the last stage are skipped.
    """
    stage: dict[str, torch.Tensor] = {}
    for name, param in named_global_params(model, cfg, groups):
        tensor = param.grad if grads else param.data
        if tensor is None:
            tensor = torch.zeros_like(param)
        tensor = tensor.detach()
        if hf_convert.tp_split_dim(name) is not None and groups.tensor > 1:
            shards = [torch.empty_like(tensor) for _ in range(groups.tensor)]
            dist.all_gather(shards, tensor.contiguous(), group=groups.tp)  # on the param's device (nccl/gloo)
            tensor = hf_convert.gather_tp_shards(name, shards)
        stage[name] = tensor.to("cpu", copy=True)  # a copy: later steps must not change it
    if groups.pipeline == 1:
        return stage
    stages: list[dict] = [None] * groups.pipeline  # type: ignore[list-item]
    dist.all_gather_object(stages, stage, group=groups.pp)
    full: dict[str, torch.Tensor] = {}
    for part in stages:
        full.update(part)
    return full


def build_model_from_hf(hf_path: str, groups: TrainGroups, *, value_head: bool = False, **overrides):
    """GPTModel for this rank loaded from an HF Llama/Qwen2 directory (config.json + *.safetensors).

    Returns (model, ModelConfig read from the directory). `overrides` set non-architecture ModelConfig
    fields (e.g. dtype). A value-head model loads the trunk, and its ScalarHead from the directory's
    `score.weight` when it is a `*ForSequenceClassification` with one label (a reward model: hpcrl's `rm`
    export), else keeps the head's fresh init.
    """
    from safetensors.torch import load_file
    from transformers import AutoConfig

    hf_config = AutoConfig.from_pretrained(hf_path, local_files_only=True)
    cfg = hf_convert.model_config_from_hf(hf_config, hf_path=hf_path, **overrides)
    files = sorted(glob.glob(os.path.join(hf_path, "*.safetensors")))
    if not files:
        raise ConfigError(f"{hf_path}: no *.safetensors files (hpcrl loads safetensors only, never pickle)")
    hf_sd: dict[str, torch.Tensor] = {}
    for path in files:
        hf_sd.update(load_file(path))
    if cfg.tie_word_embeddings:
        hf_sd.pop("lm_head.weight", None)
    score = hf_sd.pop("score.weight", None)
    full = hf_convert.hf_to_megatron_state_dict(hf_sd, cfg, output_layer=not value_head)
    model = build_gpt_model(cfg, groups, value_head=value_head)
    if value_head and groups.is_last_stage:
        if score is not None and tuple(score.shape) != (1, cfg.hidden_size):
            raise ConfigError(
                f"{hf_path}: score.weight is {list(score.shape)}, not the one label of a reward model "
                f"[1, {cfg.hidden_size}]"
            )
        fresh = model.output_layer.weight.detach().clone()
        full["value_head.weight"] = score if score is not None else fresh  # else: keeps its fresh init
    dtype = DTYPES[cfg.dtype]
    full = {k: v.to(dtype) for k, v in full.items()}
    load_full_state_dict(model, full, cfg, groups)
    return model, cfg


def attention_mask_for_megatron(attention_mask_BT: torch.Tensor) -> torch.Tensor:
    """HF-style padding mask (1/True = real token) -> megatron's boolean [B, 1, T, T], True = masked out.

    Causal and key padding combined: megatron's local attention uses a given mask as-is, and with None
    it builds one on device "cuda" (docs/FACTS.md). Query rows of padding see no key; megatron fills them with
    -10000 (uniform softmax, finite), and their outputs are ignored by every loss.
    """
    keep_BT = attention_mask_BT.bool()
    T = keep_BT.shape[1]
    causal_TT = torch.ones(T, T, dtype=torch.bool, device=keep_BT.device).tril()
    allowed_BTT = causal_TT[None] & keep_BT[:, None, :]
    return ~allowed_BTT[:, None]


def forward_logits(model, input_ids_BT: torch.Tensor, attention_mask_BT: torch.Tensor, hidden_in=None):
    """One GPTModel forward of padded rows. First stage: from token ids; later stages: from `hidden_in`
    [T, B, H] (set as the stage input). Returns logits [B, T, V/t] (vocab shard) on the last stage, the
    hidden states [T, B, H] to send on other stages. Positions are 0..T-1 (megatron's RoPE ignores
    position_ids; left padding keeps relative positions, so it matches HF).
    """
    return forward_masked(model, input_ids_BT, attention_mask_for_megatron(attention_mask_BT), hidden_in)


def forward_masked(model, input_ids_BT: torch.Tensor, mask_B1TT: torch.Tensor, hidden_in=None):
    """`forward_logits` with megatron's own boolean mask [B, 1, T, T] (True = masked out), e.g. the
    block-diagonal one of packed rows (hpcrl.train.packing)."""
    if hidden_in is not None:
        model.set_input_tensor(hidden_in)
    B, T = input_ids_BT.shape
    position_ids_BT = torch.arange(T, device=input_ids_BT.device).expand(B, T)
    return model(input_ids_BT, position_ids_BT, mask_B1TT)
