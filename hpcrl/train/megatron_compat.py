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

`enable_optimizer()` adds, for the megatron update backend (`optim.backend: megatron`) on CPU, which
`hpcrl rehearse` and the CPU tests use to run a GPU recipe's training path as it is:

4. `torch.tensor` / `torch.zeros` as megatron's optimizer modules see them -> the `device=` argument
   dropped. Why: `optimizer.py`, `distrib_optimizer.py`, `grad_scaler.py`, `clip_grads.py` and
   `megatron/core/utils.py` allocate their bookkeeping scalars (found-inf flag, loss scale, grad norm)
   with the string literal `device='cuda'`; on CPU those scalars belong where the parameters are. Only
   those modules' name `torch` is rebound, to a proxy that forwards everything else to torch.
5. `torch.Tensor.type()` (no arguments) -> the CUDA type name, for calls made from
   `megatron.core.optimizer` only. Why: the optimizer sorts parameters into fp16/bf16/fp32 groups by
   `param.type() == 'torch.cuda.BFloat16Tensor'` and asserts `'torch.cuda.FloatTensor'`; the dtype is what
   it means. Every other caller (the caller's module is read off its frame) gets torch's own answer.
Everything else in that path is megatron's real code: DDP's contiguous param and grad buffers, the
bucketed reduce-scatter / all-gather over gloo, the sharded Adam step, the fp16 grad scaler.

`fusions_off_without_cuda()`, called by each process's entry point before megatron-core is imported
(the CLI, the rank server, the test ranks' fork server):

6. megatron's `jit_fuser` -> a no-op decorator (megatron's own `disable_jit_fuser()`, run right after
   `megatron.core.jit` executes, before any module decorates a function with it). Why: megatron-core
   sets `jit_fuser = torch.compile` at import, and decorating its fusion functions with it imports
   torch._dynamo (~2.5 s of CPU per process on 2 cores) for fusions that only pay off on a GPU; hpcrl's
   CPU paths never call them compiled. Too late once megatron is imported (the decorators ran):
   then it does nothing and returns False.

Not patched (hpcrl avoids these paths instead): the pipeline schedules (`device="cuda"` in the token
counter); the tied-embedding init sync across pipeline stages (`weight.data.cuda()`), which
hpcrl.train.model performs itself over the embedding group.

Public: `enable() -> bool`, `enable_optimizer() -> bool`, `fusions_off_without_cuda() -> bool`, `is_active() -> bool`,
`applied_patches() -> tuple[str, ...]`, `CpuRNGStatesTracker`.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import sys
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


class _TorchWithoutDevice:
    """`torch` as megatron's optimizer modules see it on CPU: tensor()/zeros() ignore `device=`."""

    def __getattr__(self, name: str):
        return getattr(torch, name)

    @staticmethod
    def tensor(*args, device=None, **kwargs):  # noqa: ARG004 - megatron passes 'cuda' literally
        return torch.tensor(*args, **kwargs)

    @staticmethod
    def zeros(*args, device=None, **kwargs):  # noqa: ARG004
        return torch.zeros(*args, **kwargs)


_OPTIMIZER_MODULES = (
    "megatron.core.optimizer.clip_grads",
    "megatron.core.optimizer.distrib_optimizer",
    "megatron.core.optimizer.grad_scaler",
    "megatron.core.optimizer.optimizer",
    "megatron.core.utils",
)


def _type_for_megatron_optimizer(real_type):
    def tensor_type(self, *args, **kwargs):
        name = real_type(self, *args, **kwargs)
        if args or kwargs or self.is_cuda:
            return name
        caller = sys._getframe(1).f_globals.get("__name__", "")
        return (
            name.replace("torch.", "torch.cuda.", 1) if caller.startswith("megatron.core.optimizer") else name
        )

    return tensor_type


def enable_optimizer() -> bool:
    """`enable()` plus patches 4 and 5 (megatron's optimizer on CPU); True when they are (now) active.
    Idempotent; with CUDA it patches nothing and returns False."""
    import importlib

    if not enable():
        return False
    if "megatron.core.optimizer->cpu" in _APPLIED:
        return True
    for name in _OPTIMIZER_MODULES:
        importlib.import_module(name).torch = _TorchWithoutDevice()
    torch.Tensor.type = _type_for_megatron_optimizer(torch.Tensor.type)
    _APPLIED.append("megatron.core.optimizer->cpu")
    return True


def is_active() -> bool:
    """True when `enable()` has installed the CPU patches in this process."""
    return bool(_APPLIED)


def applied_patches() -> tuple[str, ...]:
    """Names of the patches in force (empty when inactive)."""
    return tuple(_APPLIED)


_JIT_MODULE = "megatron.core.jit"


class _JitFuserOff(importlib.abc.MetaPathFinder):
    """Finds `megatron.core.jit` as the path finder would and runs megatron's `disable_jit_fuser()` right
    after the module executes (patch 6); removes itself once used."""

    def find_spec(self, fullname, path, target=None):
        if fullname != _JIT_MODULE:
            return None
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is None or spec.loader is None:
            return spec
        execute = spec.loader.exec_module

        def exec_module(module) -> None:
            execute(module)
            module.disable_jit_fuser()

        spec.loader.exec_module = exec_module
        return spec


def fusions_off_without_cuda() -> bool:
    """Patch 6: megatron's fusion decorators become no-ops in this process when CUDA is absent. Call
    before megatron-core is imported; True when it will take effect."""
    if torch.cuda.is_available() or _JIT_MODULE in sys.modules:
        return False
    if not any(isinstance(finder, _JitFuserOff) for finder in sys.meta_path):
        sys.meta_path.insert(0, _JitFuserOff())
    return True
