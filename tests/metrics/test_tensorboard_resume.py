"""After kill + resume, TensorBoard shows every step once, the redone steps with the new attempt's values.

The first attempt is a real process, killed with SIGKILL after it logged steps 0..9 (its event file is
never closed). Later attempts resume at their checkpoint step, as hpcrl.rl.job does: metrics.jsonl is
cut back by checkpointing's `cut_metrics_back`, the TensorBoard event files are read back with
TensorBoard's own reader (EventAccumulator, which applies the purge).
"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpcrl.metrics.config import LoggingConfig
from hpcrl.metrics.logger import MetricsLogger
from hpcrl.metrics.sinks import METRICS_FILE, read_jsonl
from hpcrl.stages.checkpointing import cut_metrics_back

CONFIG = LoggingConfig(progress=False, plot=False)
STEPS = 10

_KILLED_ATTEMPT = """
import sys, time
from hpcrl.metrics.config import LoggingConfig
from hpcrl.metrics.logger import MetricsLogger
logger = MetricsLogger(LoggingConfig(progress=False, plot=False), sys.argv[1], 10)
for step in range(10):
    logger.log({"step": step, "reward/mean": float(step), "time/elapsed_s": 0.1 * step})
print("logged", flush=True)
time.sleep(600)
"""


def _killed_attempt(run_dir: Path) -> None:
    """Steps 0..9 logged with reward/mean = step, then SIGKILL (no close, no flush at exit)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _KILLED_ATTEMPT, str(run_dir)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout.readline().strip() == "logged"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=120)
    assert proc.returncode == -signal.SIGKILL


def _after_newest_event_file(tb_dir: Path) -> None:
    """Wait until the wall-clock second moves past the newest event file's: TensorBoard reads a run's
    files in name order, and the name starts with the writer's start second (a real requeue takes
    far longer than a second)."""
    newest = max(int(p.name.split(".")[3]) for p in tb_dir.glob("events.out.tfevents.*"))
    while time.time() < newest + 1:
        time.sleep(0.05)


def _resumed_attempt(run_dir: Path, resume_step: int, steps: range, offset: float) -> None:
    """The next attempt: resumed at `resume_step`, logs `steps` with reward/mean = offset + step."""
    _after_newest_event_file(run_dir / "tb")
    logger = MetricsLogger(CONFIG, run_dir, STEPS)  # built before the resume step is known, as in the job
    cut_metrics_back(run_dir / METRICS_FILE, resume_step)
    for step in steps:
        logger.log({"step": step, "reward/mean": offset + step, "time/elapsed_s": 0.1 * step})
    logger.close()


def _tensorboard_scalars(run_dir: Path, tag: str) -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tb"))
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def test_resume_replaces_the_redone_steps_in_tensorboard(tmp_path):
    _killed_attempt(tmp_path)
    _resumed_attempt(tmp_path, resume_step=6, steps=range(6, STEPS), offset=100.0)

    expected = [(s, float(s)) for s in range(6)] + [(s, 100.0 + s) for s in range(6, STEPS)]
    assert len(list((tmp_path / "tb").glob("events.out.tfevents.*"))) == 2
    assert _tensorboard_scalars(tmp_path, "reward/mean") == expected
    elapsed = _tensorboard_scalars(tmp_path, "time/elapsed_s")
    assert [s for s, _ in elapsed] == list(range(STEPS))
    assert [v for _, v in elapsed] == pytest.approx([0.1 * s for s in range(STEPS)])
    # TensorBoard and metrics.jsonl tell the same story
    jsonl = [(r["step"], r["reward/mean"]) for r in read_jsonl(tmp_path / METRICS_FILE)]
    assert jsonl == expected


@pytest.mark.heavy
def test_two_resumes_each_replace_what_the_previous_attempt_logged_past_its_checkpoint(tmp_path):
    """Attempt 2 resumes at 6 and dies after logging 6..8 with its checkpoint at 7; attempt 3 resumes
    at 7: step 6 is attempt 2's, 7..9 attempt 3's, nothing of attempt 1 past step 5."""
    _killed_attempt(tmp_path)
    _resumed_attempt(tmp_path, resume_step=6, steps=range(6, 9), offset=100.0)
    _resumed_attempt(tmp_path, resume_step=7, steps=range(7, STEPS), offset=200.0)

    expected = [(s, float(s)) for s in range(6)] + [(6, 106.0)] + [(s, 200.0 + s) for s in range(7, STEPS)]
    assert _tensorboard_scalars(tmp_path, "reward/mean") == expected
    assert [(r["step"], r["reward/mean"]) for r in read_jsonl(tmp_path / METRICS_FILE)] == expected


@pytest.mark.heavy
def test_a_fresh_start_in_a_used_run_dir_replaces_everything(tmp_path):
    """resume=never (or a first attempt that died before its first checkpoint) starts at step 0 again."""
    _killed_attempt(tmp_path)
    _resumed_attempt(tmp_path, resume_step=0, steps=range(3), offset=50.0)
    assert _tensorboard_scalars(tmp_path, "reward/mean") == [(s, 50.0 + s) for s in range(3)]


def test_an_attempt_that_logs_nothing_leaves_no_event_file(tmp_path):
    """The writer opens at the first record: an attempt killed before its first step adds no empty
    event file (and no purge: it never knew which step it would start at)."""
    MetricsLogger(CONFIG, tmp_path, STEPS).close()
    assert not (tmp_path / "tb").exists()
