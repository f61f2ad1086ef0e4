import json
import math

import pytest

from hpcrl.metrics.config import LoggingConfig
from hpcrl.metrics.logger import MetricsLogger
from hpcrl.metrics.sinks import read_jsonl


def _records(n):
    return [
        {
            "step": s,
            "reward/mean": s / n,
            "reward/std": 0.1,
            "time/elapsed_s": 0.5 * s,
            **({"reward/heldout": s / n} if s % 2 == 0 else {}),
        }
        for s in range(n)
    ]


def test_all_sinks_write_their_files(tmp_path):
    logger = MetricsLogger(LoggingConfig(), tmp_path, total_steps=4, force_progress=True)
    for rec in _records(4):
        logger.log(rec)
    logger.log({"step": 4, "reward/mean": math.nan})
    png = logger.close()
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1, 2, 3, 4]
    assert rows[2]["reward/heldout"] == 0.5 and "reward/heldout" not in rows[1]
    assert rows[4]["reward/mean"] is None  # NaN is written as null: the file stays strict JSON
    json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0])
    assert png == tmp_path / "reward.png" and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    events = list((tmp_path / "tb").glob("events.out.tfevents.*"))
    assert events and events[0].stat().st_size > 0


def test_tensorboard_scalars_read_back(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logger = MetricsLogger(LoggingConfig(jsonl=False, progress=False, plot=False), tmp_path, 3)
    for rec in _records(3):
        logger.log(rec)
    logger.close()
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    assert [e.value for e in acc.Scalars("reward/mean")] == pytest.approx([0, 1 / 3, 2 / 3])


def test_non_main_rank_writes_nothing_and_records_need_a_step(tmp_path):
    logger = MetricsLogger(LoggingConfig(), tmp_path, 3, is_main=False)
    logger.log({"step": 0, "reward/mean": 1.0})
    assert logger.close() is None and not list(tmp_path.iterdir())
    with pytest.raises(ValueError, match="without 'step'"):
        MetricsLogger(LoggingConfig(progress=False), tmp_path, 1).log({"reward/mean": 1.0})


def test_a_stages_headline_is_what_the_progress_lines_and_the_plot_show(tmp_path, capsys):
    """DPO's headline (preference accuracy): the plain progress lines (no terminal) quote it, not a
    reward, and its curve is accuracy.png drawn from dpo/accuracy and dpo/heldout_accuracy."""
    from hpcrl.experiment.stage_kinds import STAGE_KINDS

    headline = STAGE_KINDS["dpo"].headline
    logger = MetricsLogger(LoggingConfig(tensorboard=False), tmp_path, total_steps=3, headline=headline)
    logger.log({"step": 0, "dpo/accuracy": 0.25, "dpo/heldout_accuracy": 0.5})
    logger.log({"step": 1, "dpo/accuracy": 0.75})
    png = logger.close()
    err = capsys.readouterr().err
    assert "step 1/3  preference accuracy 0.250  held-out 0.500" in err and "reward" not in err
    assert png == tmp_path / "accuracy.png" and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
