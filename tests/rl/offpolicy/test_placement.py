"""Async placement (hpcrl.rl.offpolicy.driver): a training rank and a rollout rank, real gloo groups.

- max_off_policy_steps 0 reproduces the colocated run bitwise: every metric (wall-clock and placement
  figures aside) and the final checkpoint (parameters and AdamW state).
- Every sample's version lag is at most max_off_policy_steps (1 and 2 here; the driver raises beyond it),
  logged per step, and the final checkpoint holds the in-flight batches and the weight version.
- The rollout's double buffer: a completely received version is not used until `swap`.
- The config rules of the new keys name them (at `hpcrl expand` too: exit 2).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hpcrl.ckpt.manifest import read_manifest
from hpcrl.data.tasks import Example
from hpcrl.distributed.spawn import run_ranks
from hpcrl.errors import ConfigError
from hpcrl.experiment.stage_kinds import config_rules as check_rules
from hpcrl.rl.assemble import placement_problems
from hpcrl.rl.collector import RolloutBatch
from hpcrl.rl.experience import Experience
from hpcrl.rl.offpolicy.channel import (
    RolloutMessage,
    decode_batches,
    decode_message,
    encode_batches,
    encode_message,
)
from hpcrl.rollout.base import GenerationOutput
from tests.recovery._runs import final_tensors
from tests.rl._job_ranks import run_named, tiny_config
from tests.rl.offpolicy._ranks import jobs_then_double_buffer

pytestmark = pytest.mark.dist

REPO = Path(__file__).resolve().parents[3]
STEPS = 4
ASYNC = {"placement.kind": "async", "cluster.tasks_per_node": 2}
VOLATILE = ("time/", "share/", "tps/", "memory/")
"""Wall-clock figures: the only metrics two runs of one config may differ in."""
PLACEMENT = ("reshard/", "async/", "weights/")
"""How the weights moved (the colocated reshard, the async transfer and schedule): not the training."""


def _config(steps: int = STEPS, **overrides):
    return tiny_config(
        **{
            "algorithm.steps": steps,
            "algorithm.eval_every": 2,
            "algorithm.prompts_per_step": 8,
            "checkpoint.every_steps": 0,
            "checkpoint.async_save": False,
            "logging.plot": False,
            **overrides,
        }
    )


def _rows(run_dir: Path, drop: tuple[str, ...] = VOLATILE) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith(drop)} for r in rows]


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> tuple[Path, list[dict]]:
    """One 2-rank world runs the async jobs (m = 0, 1, 2) one after another, then the double-buffer
    check (its results by rank); one rank runs the colocated job. Returns (run root, those results)."""
    root = tmp_path_factory.mktemp("async")
    named = [
        ("m0", _config(**ASYNC, **{"placement.max_off_policy_steps": 0})),
        ("m1", _config(**ASYNC, **{"placement.max_off_policy_steps": 1})),
        ("m2", _config(5, **ASYNC, **{"placement.max_off_policy_steps": 2})),
    ]
    double_buffer = run_ranks(jobs_then_double_buffer, 2, named, str(root), timeout_s=300)
    run_ranks(run_named, 1, [("colocated", _config())], str(root), timeout_s=300)
    return root, double_buffer


@pytest.fixture(scope="module")
def runs(world) -> Path:
    return world[0]


@pytest.mark.slow  # the module's 2-rank world: 3 async jobs + 1 colocated, ~20 s
def test_max_off_policy_steps_0_reproduces_the_colocated_run_bitwise(runs):
    drop = VOLATILE + PLACEMENT
    colocated, synchronous = _rows(runs / "colocated", drop), _rows(runs / "m0", drop)
    assert [r["step"] for r in synchronous] == list(range(STEPS + 1))  # + the final evaluation
    assert synchronous == colocated  # bitwise: JSON floats round-trip exactly
    assert {"actor/loss", "reward/mean", "mismatch/logprob_max", "reward/heldout"} <= set(colocated[0])
    ref, got = final_tensors(runs / "colocated" / "checkpoints"), final_tensors(runs / "m0" / "checkpoints")
    assert set(got) - set(ref) == {"async.inflight"} and set(ref) <= set(got)
    assert any(".optim.exp_avg_sq." in name for name in ref)
    for name in ref:
        assert torch.equal(ref[name], got[name]), name


@pytest.mark.slow
@pytest.mark.parametrize("m, steps", [(1, STEPS), (2, 5)])
def test_every_samples_version_lag_is_at_most_max_off_policy_steps_and_logged(runs, m, steps):
    rows = _rows(runs / f"m{m}", drop=())[:steps]
    lags = [r["async/version_lag_max"] for r in rows]
    assert lags == [float(min(step, m)) for step in range(steps)]  # <= m, and m once the pipeline is full
    assert all(r["async/version_lag_mean"] == r["async/version_lag_max"] for r in rows)  # one version a batch
    assert all(r["async/batch_version"] == max(0, r["step"] - m) for r in rows)
    assert all(r["async/inflight"] == m for r in rows)
    assert all(r["weights/bytes_sent"] > 0 and r["time/rollout_busy_s"] > 0 for r in rows)
    # the checkpoint's exactly-once state: the weight version, and the m batches generated but not trained
    checkpoints = runs / f"m{m}" / "checkpoints"
    state = read_manifest(checkpoints / f"step_{steps:08d}").state["algorithm_state"]["async"]
    assert state == {"weight_version": steps, "next_batch": steps + m, "max_off_policy_steps": m}
    inflight = decode_batches(final_tensors(checkpoints)["async.inflight"])
    assert [(b.index, b.version) for b in inflight] == [(steps + i, steps - m + i) for i in range(m)]


@pytest.mark.slow
def test_two_megatron_engine_replicas_on_the_rollout_pool(tmp_path):
    """3 ranks: the trainer, and a rollout pool of two megatron-engine replicas (d_r = 2; the engine's
    groups sit at rank offset 1, the second replica is not on the batch channel). Each replica receives
    the whole model; at step 0 (lag 0) the rollout's log-probs are the trainer's to rounding, so the
    weights went through the megatron loader intact."""
    changes = {"rollout.engine": "megatron", "placement.rollout_pool_data": 2, "cluster.tasks_per_node": 3}
    cfg = _config(3, **{**ASYNC, **changes})
    run_ranks(run_named, 3, [("megatron", cfg)], str(tmp_path), timeout_s=300)
    rows = _rows(tmp_path / "megatron", drop=())
    model_bytes = _model_bytes(cfg.model)
    assert [r["async/version_lag_max"] for r in rows[:3]] == [0.0, 1.0, 1.0]
    assert all(r["weights/bytes_sent"] == 2 * model_bytes for r in rows[:3])
    assert rows[0]["mismatch/logprob_max"] < 1e-5 < rows[1]["mismatch/logprob_max"]  # then one version old
    assert rows[3]["step"] == 3 and rows[3]["reward/heldout"] >= 0


@pytest.mark.slow
def test_a_received_version_waits_in_the_back_buffer_until_the_swap(world):
    sender, rollout = world[1]
    assert rollout["received_in_time"] and rollout["back_is_v1"]
    assert rollout["front_unchanged_before_swap"]
    assert "swap to version 2, but the receive in flight is 1" in rollout["wrong_swap"]
    assert rollout["front_is_v1"] and rollout["front_is_v2"]
    nbytes = rollout["swap"]["weights/bytes_received"]
    assert nbytes == rollout["swap2"]["weights/bytes_received"] == sender["sent"][0]["weights/bytes_sent"]
    assert nbytes == _model_bytes(_config().model)  # the whole model, each element once


@pytest.mark.slow
def test_each_pool_holds_its_half_of_the_step_and_no_stand_in_of_the_other(world):
    train, rollout = (ranks["sides"] for ranks in world[1])
    assert train["driver"] == "AsyncTrainDriver" and train["learner"] == "Learner"
    assert train["collector"] == "NoneType" and train["trainers"] == ["actor."]
    assert rollout["driver"] == "AsyncRolloutDriver" and rollout["collector"] == "Collector"
    assert rollout["learner"] == "NoneType" and rollout["trainers"] == []
    # the halves are the driver's only workers: no rollout worker on the training pool, no actor on the rollout
    assert not {"core", "workers", "rollout", "actor"} & set(train["attributes"] + rollout["attributes"])


def _model_bytes(model) -> int:
    """fp32 bytes of the whole model (what one rollout replica receives per version)."""
    from hpcrl.reshard.params import gpt_param_metas

    return 4 * sum(meta.numel for meta in gpt_param_metas(model))


def _batch(index: int, version: int, rows: int) -> RolloutBatch:
    gen = GenerationOutput(torch.arange(rows * 3).view(rows, 3), torch.ones(rows, 3), torch.randn(rows, 3))
    exp = Experience(
        [Example(f"{i}=", str(i)) for i in range(rows)],
        torch.arange(rows),
        torch.ones(rows, 2, dtype=torch.int64),
        torch.ones(rows, 2),
        gen,
        [str(i) for i in range(rows)],
        torch.rand(rows),
        {"weight_version_B": torch.full((rows,), version), "baseline_B": torch.rand(rows).double()},
    )
    return RolloutBatch(index, version, exp, torch.rand(rows + 1), {"reward/skipped": 0.0}, {"generate": 1.5})


def test_in_flight_batches_round_trip_bitwise_through_the_checkpoint_codec():
    batches = [_batch(5, 4, 3), _batch(6, 5, 0)]  # dynamic sampling may keep no row
    back = decode_batches(encode_batches(batches))
    for want, got in zip(batches, back, strict=True):
        assert (got.index, got.version, got.metrics, got.seconds) == (
            want.index,
            want.version,
            want.metrics,
            {},
        )
        assert got.exp.examples == want.exp.examples and got.exp.responses == want.exp.responses
        pairs = [(want.sampled_B, got.sampled_B), (want.exp.scores_B, got.exp.scores_B)]
        pairs += [
            (getattr(want.exp.gen, f), getattr(got.exp.gen, f)) for f in ("response_ids_BT", "logprobs_BT")
        ]
        pairs += [(want.exp.tensors[k], got.exp.tensors[k]) for k in want.exp.tensors]
        for a, b in pairs:
            assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    assert decode_batches(encode_batches([])) == []
    heldout = {"reward/heldout": 0.25, "reward/heldout_task": 0.125}
    message = RolloutMessage(batches, {"epoch": 1, "index": 3, "seed": 0}, heldout, 0.5)
    got = decode_message(encode_message(message))  # what crosses the channel keeps the seconds too
    assert (got.cursor, got.heldout, got.busy_s) == (message.cursor, heldout, 0.5)
    assert [b.seconds for b in got.batches] == [{"generate": 1.5}] * 2
    assert torch.equal(got.batches[0].exp.gen.logprobs_BT, batches[0].exp.gen.logprobs_BT)


def test_async_rules_name_their_keys():
    good = _config(**ASYNC)
    assert check_rules(good) == [] and placement_problems(good, world=2) == []
    [world] = placement_problems(good, world=3)
    assert world.key == "placement.kind" and "= 2 ranks, the job has 3" in world.message
    cases = {
        "placement.max_off_policy_steps": ("placement", {"max_off_policy_steps": -1}),
        "placement.rollout_pool_data": ("placement", {"rollout_pool_data": 0}),
        "algorithm.tis_cap": ("algorithm", {"tis_cap": None}),
    }
    for key, (section, changes) in cases.items():
        cfg = _config(**ASYNC)
        for field, value in changes.items():
            setattr(getattr(cfg, section), field, value)
        assert key in {p.key for p in check_rules(cfg)}, key
    synchronous = _config(**ASYNC, **{"placement.max_off_policy_steps": 0})
    synchronous.algorithm.tis_cap = None  # on-policy: nothing to correct
    assert check_rules(synchronous) == []
    with pytest.raises(ConfigError) as one_rank:  # the rank count includes the rollout pool
        _config(**{**ASYNC, "cluster.tasks_per_node": 1})
    [problem] = one_rank.value.problems
    assert problem.key.endswith("cluster.nodes") and "async placement" in problem.message
    assert "1*1*1 + 1*1*1 = 2" in problem.message


def test_hpcrl_expand_refuses_a_bad_async_config_with_exit_2():
    proc = subprocess.run(
        [sys.executable, "-m", "hpcrl", "expand", "templates/grpo_tiny_async.yaml",
         "--placement.max_off_policy_steps", "-1", "--algorithm.tis_cap", "null"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "command line:placement.max_off_policy_steps:" in proc.stderr
