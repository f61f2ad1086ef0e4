"""The rl stage: online RL by the single-controller driver (trainer: hpcrl.rl.job). Its sections are
owned by their components (placement: hpcrl.distributed.placement, rollout: hpcrl.rollout.config,
algorithm: hpcrl.algorithm.config, reward: hpcrl.rewards.config); this module holds the rules that tie
them to each other and to the shared sections, and the kind."""

from __future__ import annotations

import keyword
import math
from typing import TYPE_CHECKING

from hpcrl.algorithm.registry import algorithm_problems
from hpcrl.distributed.layout import ParallelLayout, model_problems
from hpcrl.distributed.placement import placement_of
from hpcrl.env.spec import environment_problems
from hpcrl.errors import Problem, short
from hpcrl.experiment.frozen_models import frozen_models
from hpcrl.experiment.kinds.kind import StageKind
from hpcrl.experiment.rules import data_rules, gpus_per_node, model_dims, token_budget_rules
from hpcrl.metrics.headline import Headline
from hpcrl.rewards.function import function_problems
from hpcrl.rewards.terms import hf_reward_model_problems, reward_problems
from hpcrl.rollout.config import RolloutConfig
from hpcrl.rollout.engine_rule import EngineFacts, resolve_engine
from hpcrl.train.config import ModelConfig

if TYPE_CHECKING:
    from hpcrl.experiment.config import ExperimentConfig


def rl_rules(cfg: ExperimentConfig) -> list[Problem]:
    """The RL stage's sections: the algorithm, whether an engine runs the generation layout, the reward,
    the frozen models and the token budget (which must hold a prompt and its response). Each number's
    own range is its field's (hpcrl.config.ranges)."""
    return (
        _engine_rules(cfg)
        + _algorithm_rules(cfg)
        + _reward_rules(cfg)
        + _environment_rules(cfg)
        + _frozen_model_rules(cfg)
        + _rl_token_budget_rules(cfg)
        + context_problems(cfg)
        + data_rules(cfg, preference=None)
    )


def _frozen_model_rules(cfg: ExperimentConfig) -> list[Problem]:
    """The frozen models a job loads from a directory of their own (hpcrl.experiment.frozen_models: the
    distillation teacher, a megatron reward model): their layout keys are read only where the model is
    there, and t_F * p_F divides the pool's t * p * d ranks; where config.json is readable here (else
    the ranks check it before loading a weight, hpcrl.rl.roles), a model that layout divides and that
    reads the policy's token ids with the same vocabulary."""
    out = _unread_layout_keys(cfg)
    student, _ = model_dims(cfg.model)
    ranks = cfg.parallel.world_size
    for frozen in frozen_models(cfg):
        t_key = frozen.layout_keys[0]
        if ranks % (frozen.tensor * frozen.pipeline):
            message = (
                f"the {frozen.who}'s t*p = {frozen.tensor}*{frozen.pipeline} does not divide the "
                f"{ranks} ranks of its pool (parallel.tensor * pipeline * data)"
            )
            out.append(Problem(message, key=t_key))
            continue
        layout = ParallelLayout(tensor=frozen.tensor, pipeline=frozen.pipeline, data=frozen.data(ranks))
        out += [
            Problem(m, key=frozen.path_key)
            for m in _frozen_model_problems(frozen.model, frozen.who, student, layout)
        ]
    return out


def _unread_layout_keys(cfg: ExperimentConfig) -> list[Problem]:
    """A frozen model's layout key set where that model is not in the job (it would be ignored)."""
    present = {f.role for f in frozen_models(cfg)}
    algo, reward = cfg.algorithm, cfg.reward
    keys = (
        ("teacher", "algorithm.teacher_tensor", algo.teacher_tensor, "algorithm.name: distill"),
        ("teacher", "algorithm.teacher_pipeline", algo.teacher_pipeline, "algorithm.name: distill"),
        ("reward", "reward.model_tensor", reward.model_tensor, "reward.model_backend: megatron"),
        ("reward", "reward.model_pipeline", reward.model_pipeline, "reward.model_backend: megatron"),
    )
    return [
        Problem(f"only {who} reads it (this job has no such model)", key=key)
        for role, key, value, who in keys
        if value is not None and role not in present
    ]


def _frozen_model_problems(model: ModelConfig, who: str, student, layout) -> list[str]:
    resolved, file_problems = model_dims(model)
    problems = [_prefixed(p, who) for p in file_problems]
    if resolved is not None and layout is not None:
        problems += [_prefixed(p, who) for p in model_problems(layout, resolved)]
    if resolved is not None and student is not None and resolved.vocab_size != student.vocab_size:
        problems.append(
            f"the {who}'s vocab_size {resolved.vocab_size} is not the policy's {student.vocab_size}"
        )
    return problems


def _prefixed(problem: Problem, who: str) -> str:
    """A problem of a frozen model's own config.json, said as that model's (its keys and file are not
    the template's)."""
    where = ":".join(part for part in (problem.file, problem.key) if part and part != "model.hf_path")
    return f"the {who}'s {where}: {problem.message}" if where else f"the {who}: {problem.message}"


def _engine_rules(cfg: ExperimentConfig) -> list[Problem]:
    """Whether the rollout engine can run the generation layout (hpcrl.rollout.engine_rule decides)."""
    par = cfg.parallel
    model, _ = model_dims(cfg.model)
    facts = EngineFacts.for_element(gpus_per_node(cfg))
    split = not placement_of(cfg.placement).rollout_spans_element
    problems = resolve_engine(
        cfg.rollout,
        par.rollout_tensor,
        par.rollout_pipeline,
        model or cfg.model,
        facts,
        split_placement=split,
    )[1]
    return [Problem(p.message, key=p.key or "parallel") for p in problems]


def _algorithm_rules(cfg: ExperimentConfig) -> list[Problem]:
    """The algorithm's own rules (hpcrl.algorithm.registry owns them; the RL job checks them again)."""
    r = cfg.rollout
    return [
        Problem(p.message, key=p.key or "algorithm")
        for p in algorithm_problems(cfg.algorithm, r.samples_per_prompt, r.max_new_tokens)
    ]


def _rl_token_budget_rules(cfg: ExperimentConfig) -> list[Problem]:
    """optim.max_tokens_per_micro_batch holds the longest sequence: a whole prompt and response."""
    longest = cfg.data.max_prompt_length + cfg.rollout.response_tokens()
    what = (
        "rollout.max_new_tokens"
        if cfg.rollout.env is None
        else "an episode's tokens (rollout.response_tokens)"
    )
    return token_budget_rules(cfg, longest, f"data.max_prompt_length + {what}")


def _reward_rules(cfg: ExperimentConfig) -> list[Problem]:
    """The reward section's own rules (hpcrl.rewards.terms owns them; the ranks check them again), the HF
    reward model's config.json where it is readable here, and the reward function's source, read
    without running it."""
    environment = cfg.rollout.env is not None
    out = [
        Problem(p.message, key=p.key or "reward") for p in reward_problems(cfg.reward, cfg.data, environment)
    ]
    out += [] if out else hf_reward_model_problems(cfg.reward)
    if cfg.reward.function is not None:
        for problem in function_problems(cfg.reward.function):
            out.append(
                Problem(
                    f"{problem.file}: {problem.message}" if problem.file else problem.message, key=problem.key
                )
            )
    return out


def context_problems(cfg: ExperimentConfig) -> list[Problem]:
    """A prompt and its response (a whole episode with rollout.env) fit the model's context (known here
    for a model built from its config; an HF model's is read by the ranks)."""
    needed = cfg.data.max_prompt_length + cfg.rollout.response_tokens()
    if cfg.model.hf_path is not None or needed <= cfg.model.max_position_embeddings:
        return []
    what = "max_new_tokens" if cfg.rollout.env is None else "an episode's tokens (rollout.response_tokens)"
    message = f"max_prompt_length + {what} = {needed} exceeds the model's context {cfg.model.max_position_embeddings}"
    return [Problem(message, key="model.max_position_embeddings")]


def _env_args_problems(env_args: dict) -> list[Problem]:
    """Each argument is a keyword the constructor can take and, if a number, finite (the environment's
    own ranges are its own to check)."""
    out = []
    for name, value in env_args.items():
        if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name):
            out.append(Problem(f"{short(name)} is not a keyword argument name", key="rollout.env_args"))
        elif isinstance(value, float) and not math.isfinite(value):
            out.append(Problem(f"{name}: {value} is not a finite number", key="rollout.env_args"))
    return out


def _environment_rules(cfg: ExperimentConfig) -> list[Problem]:
    """The multi-turn environment's class, read without running it (hpcrl.env.spec), and the episode keys
    that only an environment reads."""
    r = cfg.rollout
    if r.env is not None:
        out = [
            Problem(f"{p.file}: {p.message}" if p.file else p.message, key=p.key)
            for p in environment_problems(r.env)
        ] + _env_args_problems(r.env_args)
        if cfg.algorithm.overlong_buffer_len > 0:  # it counts one response against max_new_tokens
            message = "DAPO's length penalty reads one response's length: not with rollout.env's episodes"
            out.append(Problem(message, key="algorithm.overlong_buffer_len"))
        return out
    defaults = RolloutConfig()
    return [
        Problem("only a multi-turn environment reads it (rollout.env is not set)", key=f"rollout.{key}")
        for key in (
            "env_args",
            "max_turns",
            "max_observation_tokens",
            "max_episode_tokens",
            "env_timeout_s",
            "env_interleave",
            "env_workers",
        )
        if getattr(r, key) != getattr(defaults, key)
    ]


KIND = StageKind(
    name="rl",
    entrypoint="hpcrl.rl.job:main",
    sections=("placement", "rollout", "algorithm", "reward"),
    rules=rl_rules,
    steps_key="algorithm.steps",
    headline=Headline(),
    rehearsed=True,
)
