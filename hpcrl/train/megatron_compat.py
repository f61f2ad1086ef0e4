"""The one place where megatron-core 0.16.1 is made to run on a CPU-only torch (gloo).

megatron-core calls CUDA APIs directly on code paths that have nothing GPU-specific about them
(docs/FACTS.md, "megatron-core on a CPU-only torch"). Without CUDA those calls raise. `enable()` maps exactly
those calls to CPU equivalents. It is:

- explicit: nothing is patched at import time; callers (hpcrl.train.model) call `enable()`;
- idempotent: a second call does nothing;
- inactive with CUDA: when `torch.cuda.is_available()` it patches nothing and returns False,
  so on GPU megatron runs unmodified.

Patches (each one is listed in `applied_patches()` once active):

1. `torch.cuda.current_device` -> returns `torch.device("cpu")`.
   Why: megatron allocates buffers with `device=torch.cuda.current_device()` in the rotary embedding
   (`RotaryEmbedding.forward`), the global memory buffer (`GlobalMemoryBuffer.get_tensor`, used by the
   local DotProductAttention), tensor-parallel gathers (`mappings._gather_along_*`) and p2p shape
   exchange. A CPU-only torch raises "Torch not compiled with CUDA" there; returning the CPU device
   puts those buffers where every other tensor of the run lives. Only installed when CUDA is absent,
   so the call could not have succeeded anyway.
2. `torch.cuda.synchronize` -> no-op.
   Why: megatron synchronises streams around p2p communication and timers; CPU ops are synchronous.
3. megatron's CUDA RNG tracker -> `CpuRNGStatesTracker` (same interface, CPU generator states).
   Why: `tensor_parallel.model_parallel_cuda_manual_seed` and `get_cuda_rng_tracker().fork()` (entered
   by every attention forward and by weight init) save/restore `torch.cuda` RNG states. On CPU the
   named states ("model-parallel-rng", "data-parallel-rng", "expert-parallel-rng") are kept as CPU
   generator states instead, so dropout inside the fork is still seeded per TP rank as megatron intends.
   Installed by replacing `megatron.core.tensor_parallel.random.CudaRNGStatesTracker` (the class
   `initialize_rng_tracker` instantiates) and resetting an already-built tracker.

Not patched here (hpcrl avoids these paths on CPU instead of patching them, see hpcrl.train.trainer):
megatron's DDP, `get_megatron_optimizer`, `clip_grads` and the pipeline schedules (`device="cuda"`
string literals); the tied-embedding init sync across pipeline stages (`weight.data.cuda()`), which
hpcrl.train.model performs itself over the embedding group.

Public: `enable() -> bool`, `is_active() -> bool`, `applied_patches() -> tuple[str, ...]`,
`CpuRNGStatesTracker`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

_APPLIED: list[str] = []  # names of the patches in force in this process (empty with CUDA)


def _cpu_current_device() -> torch.device:
    return torch.device("cpu")


def _cpu_synchronize(device: object = None) -> None:
    return None


def _make_cpu_tracker_class() -> type:
    from megatron.core.tensor_parallel import random as mrandom

    class CpuRNGStatesTracker(mrandom.CudaRNGStatesTracker):
        """megatron's RNG states tracker keeping named CPU generator states instead of CUDA ones."""

        def __init__(self, *args, **kwargs) -> None:
            kwargs["use_cudagraphable_rng"] = False  # CUDA graphs do not exist on CPU
            super().__init__(*args, **kwargs)

        def add(self, name: str, seed: int) -> None:
            self._is_initialized = True
            if seed in self.seeds_:
                raise Exception(f"seed {seed} already exists")
            self.seeds_.add(seed)
            if name in self.states_:
                raise Exception(f"rng state {name} already exists")
            saved = torch.get_rng_state()
            torch.manual_seed(seed)
            self.states_[name] = torch.get_rng_state()
            torch.set_rng_state(saved)

        @contextlib.contextmanager
        def fork(self, name: str = mrandom._MODEL_PARALLEL_RNG_TRACKER_NAME) -> Iterator[None]:
            if name not in self.states_:
                raise Exception(f"rng state {name} is not added")
            saved = torch.get_rng_state()
            torch.set_rng_state(self.states_[name])
            try:
                yield
            finally:
                self.states_[name] = torch.get_rng_state()
                torch.set_rng_state(saved)

    return CpuRNGStatesTracker


CpuRNGStatesTracker: type | None = None
"""The CPU tracker class; set by `enable()` (it subclasses a megatron class, imported lazily)."""


def enable() -> bool:
    """Install the CPU patches when CUDA is absent; return True when they are (now) active.

    Safe to call any number of times; with CUDA it patches nothing and returns False.
    """
    global CpuRNGStatesTracker
    if torch.cuda.is_available():
        return False
    if _APPLIED:
        return True
    from megatron.core.tensor_parallel import random as mrandom

    torch.cuda.current_device = _cpu_current_device
    _APPLIED.append("torch.cuda.current_device->cpu")
    torch.cuda.synchronize = _cpu_synchronize
    _APPLIED.append("torch.cuda.synchronize->noop")

    CpuRNGStatesTracker = _make_cpu_tracker_class()
    mrandom.CudaRNGStatesTracker = CpuRNGStatesTracker
    if mrandom._CUDA_RNG_STATE_TRACKER is not None:  # built before enable(): rebuild as CPU tracker
        mrandom._CUDA_RNG_STATE_TRACKER = CpuRNGStatesTracker()
    _APPLIED.append("megatron.tensor_parallel.random.CudaRNGStatesTracker->CpuRNGStatesTracker")
    return True


def is_active() -> bool:
    """True when `enable()` has installed the CPU patches in this process."""
    return bool(_APPLIED)


def applied_patches() -> tuple[str, ...]:
    """Names of the patches in force (empty when inactive)."""
    return tuple(_APPLIED)
