"""`hpcrl plan` for the offline stages (sft, dpo, rm): the trained model, DPO's reference, one micro-batch
of rows as long as the context; checked against a real megatron-core update of each stage's trainer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcrl.experiment.resolve import resolve
from hpcrl.plan.capacity import GIB
from hpcrl.plan.measure import measure_update_peak
from hpcrl.plan.stages import plan_of
from tests.cli_runs import run_cli

TEMPLATES = Path(__file__).resolve().parents[2] / "templates"
OFFLINE = ["sft_tiny.yaml", "dpo_tiny.yaml", "rm_tiny.yaml"]


def _plan(template: str, **overrides):
    cfg = resolve(TEMPLATES / template, overrides).elements[0].config
    return cfg, plan_of(cfg, host_bytes=24 * GIB)


def _by_name(plan) -> dict:
    return {c.name: c for c in plan.components}


def test_each_offline_stage_plans_its_own_model():
    """SFT: a policy and its logits; DPO: the same + a frozen reference of the same size; RM: the
    critic's trunk and scalar head (no output layer, no logits buffer). Tiny model by hand: 2 layers of
    36,992 params + embedding 16·64 (+ output 16·64 + final norm 64 for a policy; + final norm 64 + head 64
    for the reward model)."""
    _, sft = _plan("sft_tiny.yaml")
    _, dpo = _plan("dpo_tiny.yaml")
    _, rm = _plan("rm_tiny.yaml")
    assert _by_name(sft)["policy params"].bytes == 4 * (2 * 36_992 + 2 * 1024 + 64)
    assert _by_name(rm)["reward model params"].bytes == 4 * (2 * 36_992 + 1024 + 64 + 64)
    assert _by_name(dpo)["reference params"].bytes == _by_name(dpo)["policy params"].bytes
    assert "reference params" not in _by_name(sft) and "logits buffer" not in _by_name(rm)
    assert (sft.trained, dpo.trained, rm.trained) == ("policy", "policy", "reward model")
    for plan in (sft, dpo, rm):
        assert "s=32" in _by_name(plan)["activations (1 micro-batch)"].formula  # the tiny model's context


def test_the_micro_batch_is_the_dp_share_at_most():
    """b = min(optim.micro_batch_size, rows of a step / d): RM's 32 pairs are 64 rows; at d = 2 and a
    micro-batch of 64 each rank runs 32 rows (half the activations), at micro-batch 8 it runs 8."""
    _, one = _plan("rm_tiny.yaml")
    _, two = _plan("rm_tiny.yaml", **{"parallel.data": 2, "cluster.tasks_per_node": 2})
    _, small = _plan("rm_tiny.yaml", **{"optim.micro_batch_size": 8})
    act = [_by_name(p)["activations (1 micro-batch)"] for p in (one, two, small)]
    assert "b=64" in act[0].formula and "b=32" in act[1].formula and "b=8" in act[2].formula
    assert act[1].bytes == pytest.approx(act[0].bytes / 2) and act[2].bytes == pytest.approx(act[0].bytes / 8)


@pytest.mark.parametrize("template", OFFLINE)
def test_hpcrl_plan_of_an_offline_template_exits_0(template, capsys):
    code, out, err = run_cli(capsys, "plan", TEMPLATES / template, "--json")
    assert code == 0, err
    plan = json.loads(out)
    assert plan["fits"] and plan["device"]["peak"] > 0 and plan["layout"] == "t=1,p=1,d=1"


@pytest.mark.dist
@pytest.mark.parametrize("template", OFFLINE)
def test_the_offline_plan_is_within_25_percent_of_a_measured_update(template):
    """The stage's trainer (policy, or reward model) on a batch of the planned shape: its parameter count
    is the planner's, and the measured tensor peak of its update steps is the plan's within 25%."""
    cfg, plan = _plan(template)
    [rank] = measure_update_peak(cfg, steps=1)
    params = next(c.bytes for c in plan.components if c.name == f"{plan.trained} params") / 4
    assert rank["params_on_rank"] == params
    error = rank["tensor_peak_bytes"] / plan.update_peak - 1
    assert abs(error) < 0.25, (
        f"measured {rank['tensor_peak_bytes']:.0f} B vs predicted {plan.update_peak:.0f} B"
    )
