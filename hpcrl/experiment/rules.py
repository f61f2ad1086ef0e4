"""Rules that tie fields of different components together (checked on every resolved config): those of
the shared sections, run for every stage, and the helpers the stages' own rules share (each stage's rules
live in its module of hpcrl.experiment.kinds).

Each rule returns Problems whose key names the fields involved, so a user sees e.g.
`cluster.nodes: cluster.nodes*cluster.tasks_per_node = 2 ranks, but parallel.tensor*pipeline*data = 4`.
"""

from __future__ import annotations

import functools
import re
from typing import TYPE_CHECKING

from hpcrl.algorithm.registry import ALGORITHMS
from hpcrl.cluster.rules import check_cluster
from hpcrl.config.schema import range_problems
from hpcrl.data.validate import PreferenceReader, data_file_problems
from hpcrl.distributed.layout import ModelDims, ParallelLayout, model_problems
from hpcrl.distributed.placement import placement_of
from hpcrl.errors import ConfigError, Problem, short
from hpcrl.metrics.rules import logging_problems
from hpcrl.rewards.terms import megatron_reward_model
from hpcrl.train.config import ModelConfig
from hpcrl.train.hf_config import ModelDimsUnavailable, with_hf_architecture

if TYPE_CHECKING:
    from hpcrl.experiment.config import ExperimentConfig
    from hpcrl.experiment.kinds.kind import StageRules

_ENTRYPOINT = re.compile(r"[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_]\w*")
_PATH_PART = re.compile(r"[\w.+-]+")
_GRES_GPUS = re.compile(r"(?:^|,)gpu(?::[^:,]+)?:(\d+)")
MAX_NAME_CHARS = 128
"""Longest experiment name in characters; it must also fit a directory name (255 bytes of UTF-8)."""


def gpus_per_node(cfg: ExperimentConfig) -> int:
    """GPUs one node of an element gets: from `gres` (gpu[:type]:N) when set, else `gpus_per_node`."""
    if cfg.cluster.gres:
        match = _GRES_GPUS.search(cfg.cluster.gres)
        return int(match.group(1)) if match else 0
    return cfg.cluster.gpus_per_node


def check_rules(cfg: ExperimentConfig, stage_rules: StageRules) -> list[Problem]:
    """All problems of one config, each naming its dotted key (the caller names the file that set it): the
    numbers outside their fields' ranges (hpcrl.config.ranges; a template's are refused before this, by
    the schema) alone when there are any, else the shared sections' rules and `stage_rules` (those of
    the sections only its stage reads)."""
    ranges = range_problems(cfg)
    if ranges:
        return ranges  # the rules below compute with these numbers
    par, cl = cfg.parallel, cfg.cluster
    out = placement_rules(cfg)
    ranks = cl.nodes * cl.tasks_per_node
    if ranks != cfg.ranks_per_element:
        keys, sizes = placement_of(cfg.placement).ranks_formula(par, cfg.placement)
        out.append(
            Problem(
                f"layout mismatch: cluster.nodes*cluster.tasks_per_node = {cl.nodes}*{cl.tasks_per_node} = {ranks} "
                f"ranks, but {keys} = {sizes} = {cfg.ranks_per_element}",
                key="cluster.nodes",
            )
        )
    if par.tensor % par.rollout_tensor:
        out.append(
            Problem(
                f"rollout_tensor={par.rollout_tensor} must divide parallel.tensor={par.tensor}",
                key="parallel.rollout_tensor",
            )
        )
    if par.pipeline % par.rollout_pipeline:
        out.append(
            Problem(
                f"rollout_pipeline={par.rollout_pipeline} must divide parallel.pipeline={par.pipeline}",
                key="parallel.rollout_pipeline",
            )
        )
    gpus = gpus_per_node(cfg)
    if gpus > 0:
        total = gpus * cl.nodes
        if cl.tasks_per_node != gpus:
            out.append(
                Problem(
                    f"one rank per GPU: tasks_per_node={cl.tasks_per_node} but each node has {gpus} GPUs",
                    key="cluster.tasks_per_node",
                )
            )
        if total % (par.tensor * par.pipeline):
            out.append(
                Problem(
                    f"layout does not divide the GPU count: parallel.tensor*parallel.pipeline = "
                    f"{par.tensor * par.pipeline} does not divide {total} GPUs "
                    f"(cluster.nodes={cl.nodes} x {gpus} per node)",
                    key="parallel.tensor",
                )
            )
    out += _model_rules(cfg) + stage_rules(cfg)
    if cfg.entrypoint is not None and not _ENTRYPOINT.fullmatch(cfg.entrypoint):
        out.append(
            Problem(f"expected 'package.module:function', got {short(cfg.entrypoint)}", key="entrypoint")
        )
    out += _name_rules(cfg.name) + _required_rules(cfg)
    return out + check_cluster(cfg.cluster) + logging_problems(cfg.logging)


def _model_rules(cfg: ExperimentConfig) -> list[Problem]:
    """The layout's divisibility rules for the model (ParallelLayout owns them: heads, kv heads vs t and
    t_g, vocab, ffn, layers)."""

    par = cfg.parallel
    ranges = heads_problems(cfg.model)
    problems = list(ranges)
    try:
        layout = ParallelLayout.from_config(par)
    except ConfigError:
        layout = None  # t_g | t and p_g | p: reported by check_rules above
    model, model_file_problems = model_dims(cfg.model)
    problems += model_file_problems
    if layout is not None and model is not None and not ranges:  # they divide by these dims
        problems += model_problems(layout, model)
    return [Problem(p.message, key=p.key or "parallel") for p in problems]


def data_rules(
    cfg: ExperimentConfig, *, preference: PreferenceReader | None, needs_answers: bool = False
) -> list[Problem]:
    """The data file's rows, when the file is here (hpcrl.data.validate)."""
    m = cfg.model
    problems = data_file_problems(
        cfg.data,
        preference=preference,
        hf_path=m.hf_path,
        vocab_size=m.vocab_size,
        needs_answers=needs_answers,
    )
    return [
        Problem(f"{p.file}: {p.message}" if p.file else p.message, key=p.key or "data.path") for p in problems
    ]


def row_batch_rules(cfg: ExperimentConfig, key: str, units: int, paired: bool, why: str) -> list[Problem]:
    """A batch dispatched by rows (whole pairs when `paired`): no token balancing or budget, an even
    micro-batch for pairs, and at least one of the step's `units` per DP rank."""
    optim, ranks = cfg.optim, cfg.parallel.data
    out = []
    if optim.balance_dp_tokens:
        out.append(Problem(f"{why} dispatches rows to DP ranks by count", key="optim.balance_dp_tokens"))
    if optim.max_tokens_per_micro_batch is not None:
        message = f"{why} cuts micro-batches by rows: use optim.micro_batch_size"
        out.append(Problem(message, key="optim.max_tokens_per_micro_batch"))
    if paired and optim.micro_batch_size % 2:
        message = (
            f"must be even for {why} (a micro-batch holds whole chosen/rejected pairs), "
            f"got {optim.micro_batch_size}"
        )
        out.append(Problem(message, key="optim.micro_batch_size"))
    if 1 <= units < ranks:
        unit = "pairs" if paired else "rows"
        out.append(Problem(f"{units} {unit} per step leave some of the {ranks} DP ranks empty", key=key))
    return out


def token_budget_rules(cfg: ExperimentConfig, longest: int, formula: str) -> list[Problem]:
    """optim.max_tokens_per_micro_batch (when set) holds a row of `longest` tokens (`formula` says how
    the stage bounds its rows): a smaller budget would give every row a micro-batch of its own."""
    budget = cfg.optim.max_tokens_per_micro_batch
    if budget is None or budget >= longest:
        return []
    message = f"{budget} tokens cannot hold the longest sequence: {formula} = {longest}"
    return [Problem(message, key="optim.max_tokens_per_micro_batch")]


def heads_problems(model: ModelConfig) -> list[Problem]:
    """The width splits evenly into heads (each size's own range is its field's). Before the ranges,
    `--model.num_attention_heads 0` was a ZeroDivisionError in `plan` and on the ranks, and a negative
    hidden size passed `expand`."""
    heads, hidden = model.num_attention_heads, model.hidden_size
    if heads is not None and hidden is not None and hidden % heads:
        message = f"hidden_size={hidden} does not split into num_attention_heads={heads} heads"
        return [Problem(message, key="model.hidden_size")]
    return []


LAYOUT_FIELDS = tuple(ModelDims.__annotations__)
"""The dims ParallelLayout's model rules read (the ModelDims protocol's fields)."""


def model_dims(model: ModelConfig) -> tuple[ModelConfig | None, list[Problem]]:
    """The model's dims for the layout rules: from `model.hf_path`'s config.json where it is readable
    here (the template's values checked against it), else the template's own; None when neither gives
    every dim the rules read (a path that exists only on the cluster, dims left to it: the ranks check
    them before loading any weight, hpcrl.train.trainer)."""
    if model.hf_path is None:
        return model, []
    try:
        model = _with_hf_architecture(tuple(vars(model).items()))
    except ModelDimsUnavailable:
        pass
    except ConfigError as err:  # a config.json that is not one, or dims that contradict it
        return None, [_under_hf_path(problem) for problem in err.problems]
    return (None if any(getattr(model, name) is None for name in LAYOUT_FIELDS) else model), []


def _under_hf_path(problem: Problem) -> Problem:
    """A problem found in config.json, reported under `model.hf_path` with the file (and its key) in the
    message: the rules' problems are placed in the template by their key."""
    if problem.key is not None and problem.key.startswith("model.") and problem.file is None:
        return problem  # a template key (dims that contradict config.json: the message names the file)
    where = ":".join(part for part in (problem.file, problem.key) if part and part != "model.hf_path")
    return Problem(f"{where}: {problem.message}" if where else problem.message, key="model.hf_path")


@functools.lru_cache(maxsize=64)
def _with_hf_architecture(fields: tuple[tuple[str, object], ...]) -> ModelConfig:
    # cached by the model's field values: the elements of a sweep name the same few HF directories
    # (100,000 elements, one read each); a ModelConfig itself is not hashable
    return with_hf_architecture(ModelConfig(**dict(fields)), need=())


def placement_rules(cfg: ExperimentConfig) -> list[Problem]:
    """The placement's own keys (hpcrl.distributed.placement) and what it asks of the other sections:
    a second pool needs a role to host (a critic, a distillation teacher, or a reference when
    kl_coef > 0); off-policy samples (async, m >= 1) need the truncated importance
    weight, which corrects the PPO ratio for the stale behaviour policy."""
    placement = placement_of(cfg.placement)
    out = []
    algo = cfg.algorithm
    spec = ALGORITHMS.get(algo.name)
    megatron_rm = megatron_reward_model(cfg.reward, cfg.model) is not None
    hosted = spec is not None and (spec.needs_critic or spec.needs_teacher or algo.kl_coef > 0 or megatron_rm)
    if placement.models_pool and spec is not None and not hosted:
        out.append(
            Problem(
                f"split placement puts the critic, the reference, the teacher and a megatron reward model on "
                f"their own pool, but {algo.name} with kl_coef=0 has none of them (use colocated)",
                key="placement.kind",
            )
        )
    if placement.rollout_pool and megatron_rm:
        message = (
            f"placement {cfg.placement.kind} scores on its rollout pool, where no megatron reward model runs: "
            "use reward.model_backend hf (or the colocated / split placement)"
        )
        out.append(Problem(message, key="reward.model_backend"))
    m = cfg.placement.max_off_policy_steps
    if placement.off_policy and m >= 1 and algo.tis_cap is None:
        out.append(
            Problem(
                f"max_off_policy_steps={m} trains on samples of older weights: the truncated importance weight "
                "min(pi_old / pi_rollout, tis_cap) corrects for them, set tis_cap (e.g. 2.0)",
                key="algorithm.tis_cap",
            )
        )
    return out


def _name_rules(name: str) -> list[Problem]:
    """`name` is one directory name (run and sweep directories live under <run_root>/<name>/), and the
    job name of its array jobs; bounded so that mkdir never fails on its length."""
    if len(name) > MAX_NAME_CHARS or len(name.encode("utf-8", "surrogatepass")) > 255:
        limit = f"the limit is {MAX_NAME_CHARS} characters and 255 bytes of UTF-8"
        return [Problem(f"{short(name)} is {len(name):,} characters long; {limit}", key="name")]
    if not _PATH_PART.fullmatch(name) or name in (".", ".."):
        return [
            Problem(
                f"{short(name)} must be usable as a directory name (letters, digits, _ . + -)", key="name"
            )
        ]
    return []


def _required_rules(cfg: ExperimentConfig) -> list[Problem]:
    out = []
    if cfg.data.source != "builtin" and not cfg.data.path:
        out.append(
            Problem(f"missing required field (data.source={cfg.data.source!r} reads a file)", key="data.path")
        )
    if cfg.data.source == "builtin" and cfg.data.path is not None:
        message = "data.source builtin generates its rows and reads no file (set data.source: jsonl, parquet or hf_disk)"
        out.append(Problem(message, key="data.path"))
    if cfg.cluster.executor == "slurm" and cfg.cluster.profile is None and cfg.cluster.partition is None:
        out.append(
            Problem(
                "missing required field (executor=slurm needs a profile or a partition)",
                key="cluster.profile",
            )
        )
    return out
