"""Phase records from the driver's per-step timings (metrics.jsonl rows as hpcrl.rl.driver logs them)."""

from __future__ import annotations

import pytest

from benchmarks.rl_breakdown import phase_records


def rows() -> list[dict]:
    out = []
    for step in range(6):
        gen, train, reshard = 0.02 + 0.001 * step, 0.03, 0.001
        out.append(
            {
                "step": step,
                "time/generate_s": gen,
                "time/train_s": train,
                "time/reshard_s": reshard,
                "time/step_s": gen + train + reshard,
                "time/elapsed_s": 1.0 + step,
                "tps/generate": 3000.0 + step,
                "reward/mean": 0.5,
            }
        )
    out.append({"step": 6, "reward/heldout": 0.9, "time/elapsed_s": 9.0})  # final evaluation row
    return out


def test_medians_after_warmup_and_shares():
    records = {r.extra["phase"]: r for r in phase_records(rows(), warmup=3, layout="t=1", model_size="76K")}
    assert set(records) == {"generate", "train", "reshard"}
    gen = records["generate"]
    assert gen.samples == pytest.approx([0.023, 0.024, 0.025]) and gen.value == pytest.approx(0.024)
    assert gen.baseline_name == "rl_step_total" and gen.baseline_value == pytest.approx(0.024 + 0.031)
    assert gen.extra["tokens_per_s"] == 3004.0 and gen.extra["steps"] == [3, 4, 5]
    assert sum(r.ratio for r in records.values()) == pytest.approx(1.0, rel=0.02)


def test_no_step_after_warmup_is_an_error():
    with pytest.raises(ValueError, match="warm-up"):
        phase_records(rows(), warmup=10, layout="t=1", model_size="76K")
