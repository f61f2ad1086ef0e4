"""Memory preflight: predicted per-rank accelerator memory and host RAM of one resolved experiment.

    plan = predict(cfg)          # cfg: hpcrl.experiment.config.ExperimentConfig
    if not plan.fits: ...        # plan.problems() says what exceeds which capacity

Pure (no torch). Formulas and their sources: hpcrl.plan.formulas. What is resident when:
- persistent (all phases): actor params, grads (hpcrl's trainer keeps .grad between steps), AdamW states
  (+ fp32 master for 16-bit params), the critic's same three (ppo), the reference params (kl_coef > 0),
  the distillation teacher's and a megatron reward model's params (their own dims, from their config.json),
  and the rollout engine's own copy of its generation shard.
- train: activations of ONE micro-batch over the stage's L/p layers (hpcrl's pipeline runs one micro-batch
  forward+backward at a time, so Korthikanti §4.2's "p micro-batches in flight" of 1F1B does not apply)
  plus the logits buffer. The critic's update is a separate phase of at most the same size.
- grad-sync (d > 1): the trainer all-reduces grads in one flat copy (grad bytes).
- generate: KV cache of this generation rank's sequences + the reshard staging (HybridFlow Table 2's
  received part + one bucket).
Peak = persistent + the largest other phase, per pool of ranks: colocated = one pool; split placement
(hpcrl.rl.assemble: actor + rollout on ranks [0, n), critic + reference on [n, 2n)) = two pools; async
placement = a training pool (actor, critic, reference) and a rollout pool (the engine, the back buffer of
the next weights, the KV cache); the worst pool counts. On a CPU job the device IS host RAM, so host RAM adds the
device total to the host-only parts (async checkpoint snapshot, prompt dataset).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from hpcrl.algorithm.registry import ALGORITHMS
from hpcrl.distributed.placement import placement_of
from hpcrl.errors import ConfigError, Problem
from hpcrl.experiment.frozen_models import FrozenModel, frozen_models
from hpcrl.experiment.rules import gpus_per_node
from hpcrl.plan import formulas as fm
from hpcrl.plan.capacity import Capacity, device_capacity
from hpcrl.rollout.engine_rule import ENGINES, EngineFacts, resolve_engine, sleeps_between_steps
from hpcrl.train.config import ModelConfig
from hpcrl.train.hf_config import ModelDimsUnavailable as ModelDimsUnavailable  # submit's name
from hpcrl.train.hf_config import with_hf_architecture

if TYPE_CHECKING:
    from hpcrl.experiment.config import ExperimentConfig

GIB = 1024**3
PERSISTENT = "persistent"


@dataclass(frozen=True)
class Component:
    """One line of the plan."""

    name: str
    phase: str
    """persistent, train, grad-sync, generate (device) or host."""
    bytes: float
    formula: str
    """How the number was computed, with the values filled in."""
    pool: str = "all"
    """Ranks that hold it: all (colocated), or actor / models (split placement's two pools)."""


@dataclass
class MemoryPlan:
    """Prediction for the worst rank of one experiment."""

    layout: str
    device: Capacity
    host: Capacity
    components: list[Component] = field(default_factory=list)
    trained: str = "actor"
    """The model whose update the plan's `update_peak` sizes (the actor; an offline stage's own)."""

    def device_components(self) -> list[Component]:
        return [c for c in self.components if c.phase != "host"]

    def phase_bytes(self, pool: str | None = None) -> dict[str, float]:
        """Device bytes per phase (of one pool's ranks, or all components)."""
        out: dict[str, float] = {}
        for c in self.device_components():
            if pool is None or c.pool == pool:
                out[c.phase] = out.get(c.phase, 0.0) + c.bytes
        return out

    @property
    def device_peak(self) -> float:
        """persistent + the largest transient phase, on the worst pool's ranks."""
        peaks = []
        for pool in {c.pool for c in self.device_components()} or {"all"}:
            phases = self.phase_bytes(pool)
            persistent = phases.pop(PERSISTENT, 0.0)
            peaks.append(persistent + max(phases.values(), default=0.0))
        return max(peaks)

    @property
    def update_peak(self) -> float:
        """The trained model's params/grads/optimizer + the train phase: what measuring its update steps
        alone (hpcrl.plan.measure) sees, without critic, reference, teacher or rollout engine."""
        own = [c for c in self.components if c.name.startswith(f"{self.trained} ")]
        pool = own[0].pool
        return sum(c.bytes for c in own if c.phase == PERSISTENT) + self.phase_bytes(pool).get("train", 0.0)

    @property
    def host_peak(self) -> float:
        host_only = sum(c.bytes for c in self.components if c.phase == "host")
        return host_only + (self.device_peak if self.device.kind == "cpu" else 0.0)

    @property
    def fits(self) -> bool:
        return not self.problems()

    def problems(self) -> list[str]:
        out = []
        if self.device.kind != "cpu" and self.device_peak > self.device.bytes:
            out.append(
                f"{self.layout}: predicted {self.device_peak / GIB:.1f} GiB per rank > {self.device.name} "
                f"{self.device.bytes / GIB:.1f} GiB"
            )
        if self.host_peak > self.host.bytes:
            out.append(
                f"{self.layout}: predicted host RAM {self.host_peak / GIB:.1f} GiB per rank > "
                f"{self.host.name} {self.host.bytes / GIB:.1f} GiB"
            )
        return out


PLANNED_FIELDS = (
    "family",
    "vocab_size",
    "hidden_size",
    "num_layers",
    "num_attention_heads",
    "num_query_groups",
    "ffn_hidden_size",
    "tie_word_embeddings",
)
"""The ModelConfig fields the plan needs: a template with `hf_path` that sets these is planned from them
alone where config.json is not readable."""


def dims_of(cfg: ExperimentConfig) -> fm.Dims:
    """Model dims from `<hf_path>/config.json` when it is readable here (the template's own values
    checked against it), else from the `model` fields (hpcrl.train.hf_config.with_hf_architecture)."""
    return model_dims(cfg.model)


def frozen_dims(frozen: FrozenModel) -> fm.Dims:
    """A frozen model's dims from its own config.json, which must be readable here (it has no template
    fields to plan from): the distillation teacher, a megatron reward model."""
    try:
        return model_dims(frozen.model)
    except ConfigError as err:
        problems = [Problem(f"the {frozen.who}: {p.message}", p.file, frozen.path_key) for p in err.problems]
        raise type(err)(problems) from err


def model_dims(model: ModelConfig) -> fm.Dims:
    m = with_hf_architecture(model, need=PLANNED_FIELDS)
    return fm.Dims(
        vocab=m.vocab_size,
        hidden=m.hidden_size,
        layers=m.num_layers,
        heads=m.num_attention_heads,
        kv_heads=m.num_query_groups,
        ffn=m.ffn_hidden_size,
        tied=m.tie_word_embeddings,
        # unset only with hf_path and no config.json here; qwen2 always has the biases, llama never
        qkv_bias=m.qkv_bias if m.qkv_bias is not None else m.family == "qwen2",
    )


def sequence_tokens(cfg: ExperimentConfig) -> int:
    """s = longest prompt + response (the padded training length)."""
    return cfg.data.max_prompt_length + cfg.rollout.response_tokens()


def micro_batch(cfg: ExperimentConfig) -> int:
    """b = sequences per forward/backward on one DP rank (the micro-batch, at most the DP share). With a
    token budget B (optim.max_tokens_per_micro_batch) a micro-batch is R rows of width w <= s (trimmed,
    or packed: hpcrl.train.packing) with R w <= B, so its tokens are <= B and its attention scores
    R w^2 <= B s: b = ceil(B / s) rows of width s bound both (B // s would not: B = 1.5 s allows two rows
    of 0.75 s, 1.125 s^2 of scores)."""
    per_dp = max(1, cfg.algorithm.prompts_per_step * cfg.rollout.samples_per_prompt // cfg.parallel.data)
    budget = cfg.optim.max_tokens_per_micro_batch
    rows = cfg.optim.micro_batch_size if budget is None else max(1, -(-budget // sequence_tokens(cfg)))
    return min(rows, per_dp)


def predict(cfg: ExperimentConfig, *, host_bytes: float | None = None) -> MemoryPlan:
    """The memory plan of `cfg`'s worst rank. `cfg` is a resolved config (hpcrl.experiment.resolve checked its
    layout against the model); `host_bytes` overrides this machine's RAM (tests)."""
    par, dims = cfg.parallel, dims_of(cfg)
    e = fm.DTYPE_BYTES[cfg.model.dtype]
    device, host = device_capacity(cfg, host_bytes=host_bytes)
    layout = (
        f"t={par.tensor},p={par.pipeline},d={par.data}->t_g={par.rollout_tensor},p_g={par.rollout_pipeline}"
    )
    plan = MemoryPlan(layout=layout, device=device, host=host)
    add = plan.components.append
    actor = fm.rank_params(dims, par.tensor, par.pipeline)
    placement = placement_of(cfg.placement)
    split = placement.models_pool
    actor_pool = "actor" if split else "train" if placement.rollout_pool else "all"
    models_pool = "models" if split else actor_pool
    gen_pool = "rollout" if placement.rollout_pool else actor_pool
    for c in trainable_components("actor", actor.total, cfg):
        add(replace(c, pool=actor_pool))
    if ALGORITHMS[cfg.algorithm.name].needs_critic:
        critic = fm.rank_params(dims, par.tensor, par.pipeline, value_head=True)
        for c in trainable_components("critic", critic.total, cfg):
            add(replace(c, pool=models_pool))
    if cfg.algorithm.kl_coef > 0:
        ref = Component("reference params", PERSISTENT, actor.total * e, f"{actor.total:,} params × {e} B")
        add(replace(ref, pool=models_pool))
    for f in frozen_models(cfg):  # in the policy's dtype, at their layout (hpcrl.experiment.frozen_models)
        params = fm.rank_params(frozen_dims(f), f.tensor, f.pipeline, value_head=f.scalar_head).total
        formula = f"{params:,} params × {e} B at t={f.tensor}, p={f.pipeline}"
        add(Component(f"{f.who} params", PERSISTENT, params * e, formula, models_pool))
    train = _train_phase(cfg, dims, e)
    for c in train:
        add(replace(c, pool=actor_pool))
    if split and ALGORITHMS[cfg.algorithm.name].needs_critic:
        # the critic's update runs on its own pool (its value head has no logits buffer)
        add(replace(train[0], name="critic activations (1 micro-batch)", pool=models_pool))
    generate = _own_pool_generate_phase if placement.rollout_pool else _generate_phase
    for c in generate(cfg, dims, e, device.bytes):
        add(replace(c, pool=gen_pool))
    for c in _host_parts(cfg, actor.total, e):
        add(c)
    return plan


def uses_megatron_optimizer(cfg: ExperimentConfig) -> bool:
    """backend megatron, or auto on a GPU job (hpcrl.train.update.resolve_backend picks it with CUDA)."""
    return cfg.optim.backend == "megatron" or (cfg.optim.backend == "auto" and gpus_per_node(cfg) > 0)


def trainable_components(role: str, params: int, cfg: ExperimentConfig) -> list[Component]:
    """A trained model's params, grads and optimizer state on one rank (the update backend's layout)."""
    if uses_megatron_optimizer(cfg):
        return _trainable_megatron(role, params, cfg.model.dtype, cfg.parallel.data)
    e = fm.DTYPE_BYTES[cfg.model.dtype]
    state, master = fm.optimizer_bytes_per_param(cfg.model.dtype)
    out = [
        Component(f"{role} params", PERSISTENT, params * e, f"{params:,} params × {e} B"),
        Component(f"{role} grads", PERSISTENT, params * e, f"{params:,} × {e} B (param dtype)"),
        Component(f"{role} AdamW states", PERSISTENT, params * state, f"{params:,} × 2 fp32 moments"),
    ]
    if master:  # hpcrl.train.optimizer.MasterWeights: an fp32 master and its fp32 grad per 16-bit param
        out.append(Component(f"{role} fp32 master", PERSISTENT, params * master, f"{params:,} × 4 B"))
        out.append(Component(f"{role} fp32 master grads", PERSISTENT, params * 4, f"{params:,} × 4 B"))
    return out


def _trainable_megatron(role: str, params: int, dtype: str, data: int) -> list[Component]:
    """megatron DDP + distributed optimizer (hpcrl.train.megatron_optimizer; ZeRO-1, Rajbhandari et al.
    2020 §5.1): params in their dtype, one fp32 main_grad buffer (grads reduce-scatter in place), and
    the fp32 masters (16-bit params only) and both Adam moments sharded over d."""
    e = fm.DTYPE_BYTES[dtype]
    state, master = fm.optimizer_bytes_per_param(dtype)
    out = [
        Component(f"{role} params", PERSISTENT, params * e, f"{params:,} params × {e} B"),
        Component(f"{role} main grads", PERSISTENT, params * 4, f"{params:,} × 4 B (fp32 DDP buffer)"),
        Component(
            f"{role} AdamW states (1/d)", PERSISTENT, params * state / data, f"{params:,} × 8 B / d={data}"
        ),
    ]
    if master:
        out.append(
            Component(
                f"{role} fp32 master (1/d)",
                PERSISTENT,
                params * master / data,
                f"{params:,} × 4 B / d={data}",
            )
        )
    return out


def _train_phase(cfg: ExperimentConfig, dims: fm.Dims, e: int) -> list[Component]:
    return train_phase(cfg, dims, e, s=sequence_tokens(cfg), b=micro_batch(cfg))


def train_phase(
    cfg: ExperimentConfig, dims: fm.Dims, e: int, *, s: int, b: int, logits: bool = True
) -> list[Component]:
    """One micro-batch of b rows of s tokens forward and backward (+ the logits buffer of an LM head,
    `logits`), and the DP gradient all-reduce's flat buffer."""
    par = cfg.parallel
    layers = dims.layers // par.pipeline
    per_layer = fm.llama_layer_bytes(dims, s, b, e, par.tensor)
    # embedding output (first stage) and final-norm input + output (last stage): 3 s·b·h, replicated
    edges = 3 * s * b * dims.hidden * e
    out = [
        Component(
            "activations (1 micro-batch)",
            "train",
            layers * per_layer + edges,
            f"L/p={layers} × llama_layer(s={s}, b={b}, t={par.tensor}) + 3sbh",
        )
    ]
    if logits:
        out.append(
            Component(
                "logits buffer",
                "train",
                fm.logits_bytes(dims, s, b, e, par.tensor),
                f"s·b·V/t × ({e} + 20) B, V={dims.vocab}",
            )
        )
    if par.data > 1 and not uses_megatron_optimizer(cfg):
        # 16-bit models all-reduce their fp32 master grads (hpcrl.train.optimizer), fp32 models their grads
        grad_bytes = 4 if fm.optimizer_bytes_per_param(cfg.model.dtype)[1] else e
        grads = fm.rank_params(dims, par.tensor, par.pipeline).total * grad_bytes
        out.append(
            Component(
                "DP flat grad buffer", "grad-sync", grads, f"one flat copy of the grads ({grad_bytes} B)"
            )
        )
    return out


def _rollout_engine(cfg: ExperimentConfig) -> tuple[str, bool]:
    """(engine the element runs, whether it sleeps between steps): hpcrl.rollout.engine_rule's decision
    for this element's GPUs; a GPU job whose vLLM is not installed here is planned as vLLM when it asks
    for it (the compute nodes may have it)."""
    gpus = gpus_per_node(cfg)
    facts = EngineFacts(cuda=gpus > 0, vllm=gpus > 0 or EngineFacts.for_element(0).vllm)
    par = cfg.parallel
    name, _ = resolve_engine(cfg.rollout, par.rollout_tensor, par.rollout_pipeline, cfg.model, facts)
    return name, sleeps_between_steps(cfg.rollout, cuda=gpus > 0)


def _generate_phase(cfg: ExperimentConfig, dims: fm.Dims, e: int, device_bytes: float) -> list[Component]:
    par = cfg.parallel
    rt, rp = par.rollout_tensor, par.rollout_pipeline
    micro_dp = (par.tensor * par.pipeline) // (rt * rp)
    prompts = cfg.algorithm.prompts_per_step * cfg.rollout.samples_per_prompt
    sequences = max(1, prompts // (par.data * micro_dp))
    s = sequence_tokens(cfg)
    split_bytes = fm.rank_params(dims, 1, 1).split * e
    gen_bytes = fm.rank_params(dims, rt, rp).total * e
    bucket = par.reshard_bucket_mb * 1024**2
    receive = fm.reshard_receive_bytes(split_bytes, par.tensor, par.pipeline, rt, rp)
    engine, sleeps = _rollout_engine(cfg)
    wave = min(sequences, cfg.rollout.max_num_seqs or sequences)  # rollout.max_num_seqs: decoded at once
    kv = fm.kv_cache_bytes(dims, sequences=wave, tokens=s, e=e, rollout_tensor=rt, rollout_pipeline=rp)
    kv_text = f"2·L/p_g·max(1,g/t_g)·d·{e} B × {wave} seqs at once (of {sequences}) × {s} tokens"
    if ENGINES[engine].preallocates_memory:
        # vLLM pre-allocates utilisation·capacity (weights + KV blocks) and runs the sequences in waves
        # inside it, so what it allocates is its budget, not the all-at-once demand
        util = cfg.rollout.gpu_memory_utilization
        kv_text = f"vLLM budget {util:g}·capacity − weights (all at once would be {kv / GIB:.3g} GiB)"
        kv = max(0.0, util * device_bytes - gen_bytes)
    weights_phase = "generate" if sleeps else PERSISTENT  # asleep during training (store / vLLM sleep)
    return [
        Component(
            "rollout engine weights",
            weights_phase,
            gen_bytes,
            f"{engine} engine, generation shard t_g={rt}, p_g={rp}" + (", freed to train" if sleeps else ""),
        ),
        Component("KV cache", "generate", kv, kv_text),
        Component(
            "reshard staging",
            "generate",
            receive + min(bucket, split_bytes),
            "M/(t_g p_g) − M/(t p) + one bucket (HybridFlow Table 2)",
        ),
    ]


def _own_pool_generate_phase(
    cfg: ExperimentConfig, dims: fm.Dims, e: int, device_bytes: float
) -> list[Component]:
    """A rollout pool of its own (async placement, hpcrl.rl.offpolicy.placement): the engine generates during
    the update, so its weights never sleep, and the next version lands in a back buffer of the same size
    (hpcrl.rl.offpolicy.weights.DoubleBufferedWeights); each of the d_r replicas decodes its share of the
    batch; no reshard staging (the cross-pool transfer writes into the back buffer)."""
    par = cfg.parallel
    rt, rp = par.rollout_tensor, par.rollout_pipeline
    replicas = cfg.placement.rollout_pool_data
    sequences = max(1, cfg.algorithm.prompts_per_step * cfg.rollout.samples_per_prompt // replicas)
    s = sequence_tokens(cfg)
    gen_bytes = fm.rank_params(dims, rt, rp).total * e
    engine, _ = _rollout_engine(cfg)
    wave = min(sequences, cfg.rollout.max_num_seqs or sequences)
    kv = fm.kv_cache_bytes(dims, sequences=wave, tokens=s, e=e, rollout_tensor=rt, rollout_pipeline=rp)
    kv_text = (
        f"2·L/p_g·max(1,g/t_g)·d·{e} B × {wave} seqs at once (of {sequences}, d_r={replicas}) × {s} tokens"
    )
    if ENGINES[engine].preallocates_memory:
        util = cfg.rollout.gpu_memory_utilization
        kv_text = f"vLLM budget {util:g}·capacity − weights (all at once would be {kv / GIB:.3g} GiB)"
        kv = max(0.0, util * device_bytes - gen_bytes)
    shard = f"generation shard t_g={rt}, p_g={rp}"
    return [
        Component("rollout engine weights", PERSISTENT, gen_bytes, f"{engine} engine, {shard}, never asleep"),
        Component("next weights (back buffer)", PERSISTENT, gen_bytes, f"a second {shard}"),
        Component("KV cache", "generate", kv, kv_text),
    ]


def _host_parts(cfg: ExperimentConfig, params: int, e: int) -> list[Component]:
    prompts = cfg.data.train_size + cfg.data.heldout_size
    dataset = Component(
        "prompt dataset",
        "host",
        prompts * cfg.data.max_prompt_length * 8,
        f"{prompts:,} prompts × {cfg.data.max_prompt_length} int64 tokens",
    )
    return [*snapshot_components(cfg, params, e), dataset]


def snapshot_components(cfg: ExperimentConfig, params: int, e: int) -> list[Component]:
    """The async checkpoint's host copy of a trained model's params and optimizer state (none when
    checkpoints are written synchronously)."""
    if not cfg.checkpoint.async_save:
        return []
    state, master = fm.optimizer_bytes_per_param(cfg.model.dtype)
    per = e + state + master
    return [Component("async ckpt snapshot", "host", params * per, f"{params:,} × {per} B (params+optim)")]
