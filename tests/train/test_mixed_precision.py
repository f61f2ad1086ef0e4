"""bf16 training keeps fp32 master weights and fp32 AdamW states (hpcrl.train.optimizer), and a bf16
checkpoint carries the masters so that a resume is exact.

One 2-rank gloo run (module fixture) computes everything; the rank functions live here (spawned ranks
import them as tests.train.test_mixed_precision).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from hpcrl.ckpt.checkpointer import Checkpointer
from hpcrl.ckpt.commit import read_latest
from hpcrl.ckpt.load import load_checkpoint
from hpcrl.ckpt.manifest import read_manifest
from hpcrl.ckpt.megatron import load_into_trainer, model_extra, trainer_shards, trainer_specs
from hpcrl.ckpt.state import RunState
from hpcrl.distributed.spawn import run_ranks
from hpcrl.train.config import OptimizerConfig
from hpcrl.train.model import build_train_groups, load_full_state_dict
from hpcrl.train.trainer import build_policy_trainer
from tests.train._rank_fns import policy_loss, random_full_state_dict, tiny_batch, tiny_config

pytestmark = [pytest.mark.dist]

# lr 1.5e-4: one Adam step moves a weight by ~lr (at most a few lr), under half the bf16 spacing
# (2^-10 ~ 9.8e-4) of every bf16 weight with |w| >= 0.25, so AdamW on the bf16 weights never moves those;
# 10 steps of a consistent gradient add up to ~1.5e-3 in the fp32 master, enough to cross.
SMALL_LR, SMALL_STEPS, BIG_W = 1.5e-4, 10, 0.25
# t=2 vs t=1 in bf16: TP changes the summation order of bf16 matmuls/all-reduces, so grads differ at the
# bf16 rounding level (~2^-8 relative); after 3 Adam steps (lr 1e-2) the masters' movement from the start
# agrees to TP_REL_TOL in relative L2 norm (measured 0.0085 on this CPU; the test prints it).
TP_REL_TOL = 0.03
TP_LR, TP_STEPS = 1e-2, 3


def _trainer(groups, lr: float):
    cfg = tiny_config("qwen2", dtype="bfloat16")
    trainer = build_policy_trainer(cfg, OptimizerConfig(lr=lr, grad_clip=1e9, micro_batch_size=2), groups)
    load_full_state_dict(trainer.model, random_full_state_dict(cfg, seed=11), cfg, groups)
    return trainer, cfg


def _params(trainer) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in trainer.model.named_parameters()}


def _stepped(trainer, param: torch.Tensor) -> torch.Tensor:
    """What AdamW steps for `param`: its fp32 master, or itself when it is fp32 (megatron's CPU norms)."""
    master = trainer.masters.master_of(param)
    return master if master is not None else param


def _masters(trainer) -> dict[str, torch.Tensor]:
    return {n: _stepped(trainer, p).detach().clone() for n, p in trainer.model.named_parameters()}


def _adam_states(trainer) -> dict[str, torch.Tensor]:
    out = {}
    for n, p in trainer.model.named_parameters():
        for key, value in trainer.optimizer.state[_stepped(trainer, p)].items():
            out[f"{key}.{n}"] = value.clone()
    return out


def _small_lr_runs(groups) -> dict:
    """The same batch SMALL_STEPS times at SMALL_LR: with fp32 masters, and with AdamW straight on the bf16
    parameters (the trainer as it was before masters: the naive baseline)."""
    out: dict = {}
    for kind in ("masters", "naive"):
        trainer, cfg = _trainer(groups, SMALL_LR)
        if kind == "naive":
            trainer.update_step.masters = None
            trainer.update_step.optimizer = torch.optim.AdamW(list(trainer.model.parameters()), lr=SMALL_LR)
        batch = tiny_batch(cfg)
        start = _params(trainer)
        checks = []
        for step in range(SMALL_STEPS):
            trainer.update(batch, policy_loss)
            if kind == "masters":
                checks.append(_invariants(trainer))
                if step == 0:
                    out["masters_after_1"] = _masters(trainer)
                    out["params_after_1"] = _params(trainer)
        out[kind] = {"start": start, "end": _params(trainer), "checks": checks}
        if kind == "masters":
            out[kind]["end_masters"] = _masters(trainer)
    return out


def _invariants(trainer) -> dict:
    """(b): dtypes of parameters, masters, master grads and Adam states; params == round(masters)."""
    params = [p for p in trainer.model.parameters() if p.dtype == torch.bfloat16]
    fp32_params = [p for p in trainer.model.parameters() if p.dtype == torch.float32]
    masters = [trainer.masters.master_of(p) for p in params]
    states = [trainer.optimizer.state[_stepped(trainer, p)] for p in trainer.model.parameters()]
    return {
        "most_params_bf16": len(params) > len(fp32_params),  # fp32: megatron's norm weights on CPU
        "only_bf16_params_have_masters": all(trainer.masters.master_of(p) is None for p in fp32_params),
        "masters_fp32": all(m.dtype == torch.float32 and m.grad.dtype == torch.float32 for m in masters),
        "adam_fp32": all(s[k].dtype == torch.float32 for s in states for k in ("exp_avg", "exp_avg_sq")),
        "params_are_rounded_masters": all(
            torch.equal(p, m.to(torch.bfloat16)) for p, m in zip(params, masters, strict=True)
        ),
    }


def _save(trainer, root: str, step: int, group, layout: dict) -> None:
    ck = Checkpointer(root, group=group, async_save=False)
    ck.save(
        step,
        trainer_shards(trainer),
        RunState(step=step),
        layout=layout,
        extra=model_extra(trainer, "actor."),
    )
    ck.close()


def _load_fresh(groups, root: str):
    trainer, _ = _trainer(groups, TP_LR)
    specs = trainer_specs(trainer, read_manifest(read_latest(Path(root))))
    load_into_trainer(trainer, load_checkpoint(root, specs).tensors)
    return trainer


def bf16_run(rank: int, world_size: int, root: str) -> dict:
    """t=2: TP_STEPS bf16 updates, checkpoint (its masters are the full t=2 masters). Then rank 0 alone:
    the same updates at t=1; the t=2 checkpoint loaded at t=1; a t=1 save -> load round trip and one more
    update on both; and the small-lr runs."""
    t2 = build_train_groups(2, 1, 1)
    solo = build_train_groups(1, 1, 1)  # collective; rank 0's own layout
    trainer, cfg = _trainer(t2, TP_LR)
    batches = [tiny_batch(cfg, seed=s) for s in range(TP_STEPS + 1)]
    for batch in batches[:TP_STEPS]:
        trainer.update(batch, policy_loss)
    _save(trainer, f"{root}/t2", TP_STEPS, dist.group.WORLD, {"t": 2, "p": 1, "d": 1})
    if solo is None:
        return {}
    ref, _ = _trainer(solo, TP_LR)
    start = _masters(ref)
    for batch in batches[:TP_STEPS]:
        ref.update(batch, policy_loss)
    out = {"start": start, "t1": _masters(ref), "t2": _masters(_load_fresh(solo, f"{root}/t2"))}

    _save(ref, f"{root}/t1", TP_STEPS, None, {"t": 1, "p": 1, "d": 1})
    resumed = _load_fresh(solo, f"{root}/t1")
    out["round_trip"] = {
        "masters": (_masters(ref), _masters(resumed)),
        "adam": (_adam_states(ref), _adam_states(resumed)),
        "params": (_params(ref), _params(resumed)),
    }
    for t in (ref, resumed):
        t.update(batches[TP_STEPS], policy_loss)
    out["next_step"] = {
        "masters": (_masters(ref), _masters(resumed)),
        "params": (_params(ref), _params(resumed)),
    }
    out["small_lr"] = _small_lr_runs(solo)
    return out


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("bf16")
    return run_ranks(bf16_run, 2, str(root), timeout_s=300)[0]


def _big(start: dict) -> dict[str, torch.Tensor]:
    """bf16 weights with |w| >= BIG_W (the fp32 norm weights step exactly either way)."""
    return {n: (w.float().abs() >= BIG_W) & (w.dtype == torch.bfloat16) for n, w in start.items()}


def _num_changed(a: dict, b: dict, where: dict | None = None) -> int:
    return sum(int(((a[n] != b[n]) & (where[n] if where else True)).sum()) for n in a)


def test_a_small_update_moves_the_fp32_master_where_naive_bf16_adamw_stays_put(run):
    small = run["small_lr"]
    start, big = small["masters"]["start"], _big(small["masters"]["start"])
    num_big = sum(int(m.sum()) for m in big.values())
    assert num_big > 1000  # enough weights where a step is below half the bf16 spacing
    # naive: AdamW on the bf16 params never moves a big weight, even after SMALL_STEPS steps
    assert _num_changed(small["naive"]["start"], small["naive"]["end"], big) == 0
    # masters: one step moves (nearly) every fp32 master, yet leaves the big bf16 weights as they were ...
    start_fp32 = {n: w.float() for n, w in start.items()}
    num_total = sum(w.numel() for w in start.values())
    assert _num_changed(start_fp32, small["masters_after_1"]) > 0.9 * num_total
    assert _num_changed(start, small["params_after_1"], big) == 0
    # ... and the accumulated fp32 updates reach the bf16 weights later
    assert _num_changed(start, small["masters"]["end"], big) > 0.1 * num_big


def test_b_masters_and_adam_states_are_fp32_and_params_are_the_rounded_masters(run):
    checks = run["small_lr"]["masters"]["checks"]
    assert len(checks) == SMALL_STEPS
    for step, check in enumerate(checks):
        assert all(check.values()), (step, check)


def test_c_tensor_parallel_2_bf16_masters_agree_with_one_rank(run):
    start, t1, t2 = run["start"], run["t1"], run["t2"]
    moved = torch.cat([(t1[n] - start[n]).flatten() for n in start])
    diff = torch.cat([(t2[n] - t1[n]).flatten() for n in start])
    rel = float(diff.norm() / moved.norm())
    print(f"t=2 vs t=1 bf16 masters: |diff|/|moved| = {rel:.3g}")
    assert moved.norm() > 0.1  # the steps really moved the weights (lr 1e-2, ~23k weights)
    assert rel <= TP_REL_TOL


def test_a_bf16_checkpoint_round_trip_is_bitwise_and_the_resume_is_exact(run):
    for what in ("masters", "adam", "params"):
        saved, loaded = run["round_trip"][what]
        assert saved.keys() == loaded.keys()
        assert all(torch.equal(saved[k], loaded[k]) for k in saved), what
    assert all(v.dtype == torch.float32 for v in run["round_trip"]["masters"][1].values())
    for what in ("masters", "params"):
        uninterrupted, resumed = run["next_step"][what]
        assert all(torch.equal(uninterrupted[k], resumed[k]) for k in uninterrupted), what


def test_fp16_loss_scaling_keeps_gradients_that_underflow_without_it():
    """Micikevicius et al. 2018 §3.2: the same tiny loss gives an all-zero fp16 gradient unscaled and a
    non-zero fp32 master gradient with hpcrl's dynamic loss scale (2^16 at the start)."""
    from tests.train import _ddp_rank_fns as ddp_fns

    [scaled] = run_ranks(ddp_fns.fp16_tiny_loss_update, 1, True)
    [unscaled] = run_ranks(ddp_fns.fp16_tiny_loss_update, 1, False)
    assert unscaled["grad_norm"] == 0.0 and unscaled["scale"] == 1.0
    assert scaled["grad_norm"] > 0.0 and scaled["skipped"] == 0.0 and scaled["scale"] == 2.0**16


def test_dynamic_loss_scale_halves_on_overflow_and_doubles_after_clean_steps():
    from hpcrl.train.loss_scale import DynamicLossScale

    scale = DynamicLossScale(initial=1024.0, growth_interval=3)
    scale.update(finite=False)
    assert scale.scale == 512.0
    for _ in range(3):
        scale.update(finite=True)
    assert scale.scale == 1024.0
    scale.update(finite=True)
    scale.update(finite=False)  # an overflow resets the count of clean steps
    for _ in range(2):
        scale.update(finite=True)
    assert scale.scale == 512.0


def test_fp16_loss_scale_is_saved_with_the_run_state_and_restored_on_resume(tmp_path):
    from tests.train import _ddp_rank_fns as ddp_fns

    [result] = run_ranks(ddp_fns.fp16_loss_scale_survives_a_checkpoint, 1, str(tmp_path))
    assert result["skipped"] == 1.0  # the overflow skipped the step and halved the scale
    assert result["saved"] == {"scale": 2.0**15, "clean_steps": 0}
    assert result["fresh_scale"] == 2.0**16
    assert result["resumed"] == result["saved"]
