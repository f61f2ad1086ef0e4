"""Rank functions for tests/train/test_megatron_ddp.py: megatron-core DDP grad sync on CPU (gloo), and the
megatron update backend on CUDA (gpu-marked) or on CPU with its CUDA device strings faked, including an
hpcrl checkpoint of its sharded optimizer state saved at one DP size and loaded at another."""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch
import torch.distributed as dist

from hpcrl.ckpt.checkpointer import Checkpointer
from hpcrl.ckpt.commit import read_latest
from hpcrl.ckpt.load import load_checkpoint
from hpcrl.ckpt.manifest import read_manifest
from hpcrl.ckpt.megatron import load_into_trainer, trainer_shards, trainer_specs
from hpcrl.ckpt.state import RunState
from hpcrl.train.config import OptimizerConfig
from hpcrl.train.megatron_optimizer import wrap_ddp
from hpcrl.train.model import build_gpt_model, build_train_groups, load_full_state_dict
from hpcrl.train.optimizer import TorchUpdate
from hpcrl.train.trainer import build_policy_trainer
from tests.train._rank_fns import policy_loss, random_full_state_dict, tiny_batch, tiny_config

MICRO_BATCH = 2


def _model(groups, cfg):
    model = build_gpt_model(cfg, groups)
    load_full_state_dict(model, random_full_state_dict(cfg, seed=3), cfg, groups)
    return model


def _backward_micro_batches(trainer, model, batch, accumulating) -> None:
    """The trainer's micro-batch loop (forward + backward of each), with `accumulating(last)` around each."""
    trainer._set_global_counts(batch)
    micro_batches = list(batch.micro_batches(MICRO_BATCH))
    for index, mb in enumerate(micro_batches):
        with accumulating(index == len(micro_batches) - 1):
            trainer._run_micro_batch(mb, policy_loss)


def ddp_grads_vs_torch_update(
    rank: int, world_size: int, tensor: int, overlap: bool, distributed: bool
) -> dict:
    """Each DP rank backprops its own half of a batch through (a) megatron DDP and (b) hpcrl's TorchUpdate
    path; after the grad sync, compare megatron's fp32 main_grad with TorchUpdate's all-reduced grad:
    everywhere (all-reduce), or on the elements this DP rank owns (reduce-scatter for the distributed
    optimizer). Returns the max |diff| and how many elements were compared."""
    data = world_size // tensor
    groups = build_train_groups(tensor, 1, data)
    cfg = tiny_config()
    optim_cfg = OptimizerConfig(
        lr=1e-2, micro_batch_size=MICRO_BATCH, overlap_grad_reduce=overlap, backend="torch"
    )
    batch = tiny_batch(cfg, seed=groups.dp_rank)

    reference = build_policy_trainer(cfg, optim_cfg, groups)
    load_full_state_dict(reference.model, random_full_state_dict(cfg, seed=3), cfg, groups)
    update: TorchUpdate = reference.update_step
    update.zero_grads()
    _backward_micro_batches(reference, reference.model, batch, update.accumulating)
    expected = update._step_grads()
    update._allreduce_dp_grads(expected)

    trainer = build_policy_trainer(cfg, None, groups)  # forward/backward only; megatron DDP owns the grads
    model = _model(groups, cfg)
    trainer.model = model
    ddp = wrap_ddp(model, groups, optim_cfg, distributed_optimizer=distributed)
    ddp.zero_grad_buffer()
    _backward_micro_batches(
        trainer, model, batch, lambda last: ddp.no_sync() if not last else contextlib.nullcontext()
    )
    ddp.finish_grad_sync()

    by_name = dict(reference.model.named_parameters())
    max_diff, compared = 0.0, 0
    for name, param in model.named_parameters():
        want = expected[by_name[name]].reshape(-1)
        for start, end in (
            _owned_ranges(ddp, param, groups.dp_rank, data) if distributed else [(0, param.numel())]
        ):
            got = param.main_grad.reshape(-1)[start:end]
            max_diff = max(max_diff, float((got - want[start:end]).abs().max()) if end > start else 0.0)
            compared += end - start
    total = sum(p.numel() for p in model.parameters())
    return {
        "max_diff": max_diff,
        "compared": compared,
        "total": total,
        "grad_norm": float(torch.cat([g.reshape(-1) for g in expected.values()]).norm()),
    }


def _owned_ranges(ddp, param, dp_rank: int, data: int) -> list[tuple[int, int]]:
    """Element ranges of `param` (flattened) inside this DP rank's shard of its DDP bucket."""
    for buffer in ddp.buffers:
        if param not in buffer.param_index_map:
            continue
        start, end, bucket_id = buffer.param_index_map[param]
        bucket = buffer.buckets[bucket_id]
        shard = bucket.grad_data.numel() // data
        lo = bucket.offset + dp_rank * shard
        hi = lo + shard
        a, b = max(start, lo), min(end, hi)
        return [(a - start, b - start)] if a < b else []
    raise AssertionError("parameter not in any DDP buffer")


def fp16_tiny_loss_update(rank: int, world_size: int, scaled: bool) -> dict:
    """fp16 model, a loss so small (x 1e-8) that its fp16 gradients underflow to zero unless scaled."""
    groups = build_train_groups(1, 1, 1)
    cfg = tiny_config(dtype="float16")
    trainer = build_policy_trainer(cfg, OptimizerConfig(lr=1e-3, micro_batch_size=MICRO_BATCH), groups)
    load_full_state_dict(trainer.model, random_full_state_dict(cfg, seed=3), cfg, groups)
    if not scaled:
        trainer.update_step.scaler = None

    def tiny_loss(outputs, mb):
        loss, metrics = policy_loss(outputs, mb)
        return loss * 1e-8, metrics

    result = trainer.update(tiny_batch(cfg), tiny_loss)
    scale = trainer.update_step.loss_scale()
    return {"grad_norm": result["grad_norm"], "skipped": result["update_skipped_nonfinite"], "scale": scale}


def _trainer(cfg, groups, backend: str):
    """A policy trainer of `backend`, weights loaded AFTER the optimizer was built (as a test or an HF
    load would)."""
    optim_cfg = OptimizerConfig(lr=1e-2, micro_batch_size=MICRO_BATCH, backend=backend)
    trainer = build_policy_trainer(cfg, optim_cfg, groups)
    load_full_state_dict(trainer.model, random_full_state_dict(cfg, seed=3), cfg, groups)
    return trainer


def _enter_gpu_boundary(rank: int, fake_cuda: bool) -> None:
    """On CUDA: this rank's device. With `fake_cuda` on CPU: megatron's CUDA device strings mapped to
    CPU by hpcrl.train.megatron_compat.enable_optimizer (the one CPU shim, which MegatronUpdate also
    installs itself; installed here first so the test names the boundary)."""
    from hpcrl.train import megatron_compat

    if fake_cuda:
        assert megatron_compat.enable_optimizer()
    else:
        torch.cuda.set_device(rank)


def megatron_vs_torch_backend(rank: int, world_size: int, tensor: int, dtype: str, fake_cuda: bool) -> dict:
    """The megatron backend (DDP + DistributedOptimizer) against the torch backend: 3 updates from the same
    weights; then the sharded optimizer state is read back whole through the checkpoint interface and
    loaded into a fresh megatron trainer, which must then hold the same state and take the same next two
    updates (the second depends on the loaded moments and step)."""
    _enter_gpu_boundary(rank, fake_cuda)
    groups = build_train_groups(tensor, 1, world_size // tensor)
    cfg = tiny_config(dtype=dtype)
    batch = tiny_batch(cfg, seed=groups.dp_rank)
    reference, megatron = (
        _trainer(cfg, groups, "torch"),
        _trainer(cfg, groups, "megatron"),
    )
    losses = {
        name: [t.update(batch, policy_loss)["loss"] for _ in range(3)]
        for name, t in (("torch", reference), ("megatron", megatron))
    }
    pairs = list(zip(reference.model.parameters(), megatron.model.parameters(), strict=True))
    param_diff = max(float((a.detach().float() - b.detach().float()).abs().max()) for a, b in pairs)
    param_ulps = max(_ulps(a.detach(), b.detach()) for a, b in pairs)
    state_diff = 0.0
    for a, b in pairs:
        sa, sb = reference.param_state(a), megatron.param_state(b)
        for key in ("exp_avg", "exp_avg_sq", "master"):
            if key in sa and key in sb:
                state_diff = max(state_diff, float((sa[key].float() - sb[key].float()).abs().max()))
    fresh = _trainer(cfg, groups, "megatron")
    for src, dst in zip(megatron.model.parameters(), fresh.model.parameters(), strict=True):
        state = megatron.param_state(src)
        fresh.load_param_state(dst, state.get("master", src.detach()), state)
    return {
        "losses": losses,
        "param_diff": param_diff,
        "param_ulps": param_ulps,
        "param_dtype": str(reference.model_cfg.dtype),
        "state_diff": state_diff,
        "restored_diff": _state_diff(megatron, fresh),
        "next_losses": [[t.update(batch, policy_loss)["loss"] for _ in range(2)] for t in (megatron, fresh)],
        "update_type": type(megatron.update_step).__name__,
        "owned_fraction": _owned_fraction(megatron),
    }


def _ulps(a: torch.Tensor, b: torch.Tensor) -> float:
    """The largest |a - b| in units of the parameters' own dtype spacing at their magnitude (eps * max(|a|,
    |b|): within a factor 2 of one ulp)."""
    eps, tiny = torch.finfo(a.dtype).eps, torch.finfo(a.dtype).tiny
    a32, b32 = a.float(), b.float()
    scale = torch.maximum(a32.abs(), b32.abs()).clamp(min=tiny)
    return float(((a32 - b32).abs() / (eps * scale)).max())


def _state_diff(a, b) -> float:
    """Max |difference| over every parameter's value and checkpoint state (keys must match)."""
    diff = 0.0
    for pa, pb in zip(a.model.parameters(), b.model.parameters(), strict=True):
        sa, sb = a.param_state(pa), b.param_state(pb)
        assert sa.keys() == sb.keys(), (sa.keys(), sb.keys())
        for x, y in [(pa.detach(), pb.detach()), *((sa[k], sb[k]) for k in sa)]:
            diff = max(diff, float((x.float() - y.float()).abs().max()))
    return diff


def _owned_fraction(trainer) -> float:
    """Share of this rank's parameter elements whose master and moments it holds (1/d under ZeRO-1)."""
    owned = sum(shard.end - shard.start for shard in trainer.update_step.owned_shards().values())
    return owned / sum(p.numel() for p in trainer.model.parameters())


def megatron_save(rank: int, world_size: int, root: str, dtype: str) -> dict:
    """Megatron backend (CUDA strings mapped to CPU) at d=world_size: 2 updates, then an hpcrl checkpoint of its
    weights, masters and sharded Adam state. Returns that state (whole per parameter, by name)."""
    _enter_gpu_boundary(rank, True)
    groups = build_train_groups(1, 1, world_size)
    cfg = tiny_config(dtype=dtype)
    trainer = _trainer(cfg, groups, "megatron")
    for _ in range(2):
        trainer.update(tiny_batch(cfg, seed=groups.dp_rank), policy_loss)
    Checkpointer(root, group=dist.group.WORLD, async_save=False).save(
        2, trainer_shards(trainer), RunState(step=2), layout={"t": 1, "p": 1, "d": world_size}
    )
    return _named_state(trainer)


def megatron_load(rank: int, world_size: int, root: str, dtype: str) -> dict:
    """A fresh megatron trainer (CUDA strings mapped to CPU) at d=world_size loads that checkpoint. Returns its
    state whole per parameter (gathered over this DP size), by name, and how much of it this rank holds."""
    _enter_gpu_boundary(rank, True)
    groups = build_train_groups(1, 1, world_size)
    trainer = _trainer(tiny_config(dtype=dtype), groups, "megatron")
    manifest = read_manifest(read_latest(Path(root)))
    load_into_trainer(
        trainer, load_checkpoint(root, trainer_specs(trainer, manifest), group=dist.group.WORLD).tensors
    )
    return {"state": _named_state(trainer), "owned_fraction": _owned_fraction(trainer)}


def _named_state(trainer) -> dict[str, dict[str, torch.Tensor]]:
    return {
        name: {"value": param.detach().float().clone(), **trainer.param_state(param)}
        for name, param in trainer.model.named_parameters()
    }


def fp16_loss_scale_survives_a_checkpoint(rank: int, world_size: int, run_dir: str) -> dict:
    """fp16 actor whose first update overflows at 2^16 (the scale halves); the RL checkpointing saves it
    in the run state and a fresh trainer resumed through it continues at the halved scale."""
    from types import SimpleNamespace

    from hpcrl.data.cursor import DataCursor, PromptSampler
    from hpcrl.experiment.config import ExperimentConfig
    from hpcrl.stages.checkpointing import StageCheckpointing
    from hpcrl.stages.stateful import DataCursorState

    groups = build_train_groups(1, 1, 1)
    cfg = tiny_config(dtype="float16")

    def trainer():
        t = build_policy_trainer(cfg, OptimizerConfig(lr=1e-3, micro_batch_size=MICRO_BATCH), groups)
        load_full_state_dict(t.model, random_full_state_dict(cfg, seed=3), cfg, groups)
        return t

    def huge_loss(outputs, mb):  # x 1e4 at scale 2^16 overflows fp16 (max 65504)
        loss, metrics = policy_loss(outputs, mb)
        return loss * 1e4, metrics

    exp = ExperimentConfig()
    exp.checkpoint.async_save = False
    data = SimpleNamespace(sampler=PromptSampler(list(range(8)), DataCursor(seed=0)))
    saved = trainer()
    skipped = saved.update(tiny_batch(cfg), huge_loss)["update_skipped_nonfinite"]
    ckpt = StageCheckpointing(exp, run_dir, {"actor.": saved}, [DataCursorState(data)])
    ckpt.save(1)
    ckpt.close(1)
    resumed = trainer()
    fresh_scale = resumed.update_step.loss_scale()
    StageCheckpointing(exp, run_dir, {"actor.": resumed}, [DataCursorState(data)]).resume()
    return {
        "skipped": skipped,
        "saved": saved.scaler_state(),
        "fresh_scale": fresh_scale,
        "resumed": resumed.scaler_state(),
    }


def mixed_dtype_probe(rank: int, world_size: int) -> dict:
    """A bf16 model is built in bf16 throughout (norms too, as megatron's Float16Module casts it); a
    model with an fp32 norm beside bf16 weights is refused by the megatron backend, naming why."""
    from hpcrl.errors import ConfigError
    from hpcrl.train.megatron_optimizer import MegatronUpdate
    from hpcrl.train.model import build_gpt_model

    groups = build_train_groups(1, 1, 1)
    cfg = tiny_config(dtype="bfloat16")
    model = build_gpt_model(cfg, groups)
    dtypes = sorted({str(p.dtype) for p in model.parameters()})
    norm = model.decoder.final_layernorm.weight
    norm.data = norm.data.float()
    try:
        MegatronUpdate(model, cfg, groups, OptimizerConfig(backend="megatron"), lr=1e-3)
    except ConfigError as err:
        return {"dtypes": dtypes, "error": str(err)}
    return {"dtypes": dtypes, "error": None}
