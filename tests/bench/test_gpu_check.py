"""benchmarks/gpu_check.py (the GPU check's summary): junit outcomes and run metrics parsed as documented.
The runs themselves need the lent GPU machine (launch/gpu_check.sh); here they are fed recorded inputs."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from benchmarks.gpu_check import junit_outcomes, summarize_run  # noqa: E402

JUNIT = """<testsuites><testsuite>
<testcase classname="tests.train.test_gpu" name="test_update"/>
<testcase classname="tests.reshard.test_engine" name="test_nccl"><skipped message="needs 2 GPUs, found 1"/></testcase>
<testcase classname="tests.plan.test_measure" name="test_peak"><failure message="AssertionError: 0.4 &gt; 0.25">tb</failure></testcase>
</testsuite></testsuites>"""


def test_junit_outcomes_name_each_test_and_reason(tmp_path):
    path = tmp_path / "j.xml"
    path.write_text(JUNIT)
    assert junit_outcomes(path) == [
        ("test_gpu::test_update", "passed", ""),
        ("test_engine::test_nccl", "skipped", "needs 2 GPUs, found 1"),
        ("test_measure::test_peak", "failed", "AssertionError: 0.4 > 0.25"),
    ]
    assert junit_outcomes(tmp_path / "missing.xml")[0][1] == "failed"


def test_run_summary_takes_medians_after_the_first_step_and_peak_memory_per_phase():
    rows = [{"step": 0, "reward/heldout": 0.1}]
    rows += [
        {
            "step": i,
            "reward/mean": 0.5,
            "tps/generate": tps,
            "tps/train": 10.0,
            "time/generate_s": 0.01 * i,
            "memory/generate_peak_gib": 0.1 * i,
            "mismatch/logprob_max": 1e-6 * i,
            "reshard/verified_params": 15.0,
            "reshard/read_checksum": 1.5 * i,
        }
        for i, tps in ((1, 1.0), (2, 100.0), (3, 200.0), (4, 300.0))
    ]
    rows.append({"step": 4, "reward/heldout": 0.6})
    s = summarize_run({"rc": 0, "wall_s": 5.0, "rows": rows})
    assert s["ok"] and s["steps"] == 4
    assert s["tok_s_generate"] == 200.0  # step 1 (warm-up) left out
    assert s["phase_s"]["generate"] == 0.03 and s["phase_s"]["train"] is None
    assert s["peak_gib"]["generate"] == 0.4 and s["peak_gib"]["train"] == 0.0
    assert s["mismatch_max"] == 4e-6 and s["heldout"] == (0.1, 0.6)
    assert not summarize_run({"rc": 1, "wall_s": 1.0, "rows": rows})["ok"]


def test_a_run_whose_rollout_weights_never_change_or_whose_syncs_are_unverified_fails():
    """The check megatron's backend needs on CUDA: an update that does not reach the rollout (the same
    read checksum twice) or a sync not verified against the optimizer's param buffer fails the run."""
    rows = [
        {
            "step": i,
            "reward/mean": 0.5,
            "actor/grad_norm": 1.0,
            "reshard/verified_params": 15.0,
            "reshard/read_checksum": c,
        }
        for i, c in enumerate((1.0, 2.0, 2.0))
    ]
    stuck = summarize_run({"rc": 0, "wall_s": 1.0, "rows": rows})
    assert not stuck["ok"] and not stuck["weights_moved"]
    rows[2]["reshard/read_checksum"] = 3.0
    assert summarize_run({"rc": 0, "wall_s": 1.0, "rows": rows})["weights_moved"]
    rows[1]["reshard/verified_params"] = 0.0
    assert not summarize_run({"rc": 0, "wall_s": 1.0, "rows": rows})["ok"]
