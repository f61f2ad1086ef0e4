"""Exactly-once resume with real processes and SIGKILL: a run killed at a random step and resumed ends
bitwise equal to the uninterrupted run (parameters, AdamW state) and logs every step exactly once with
bitwise equal losses — across epoch boundaries (the batches straddle them).

The workload is a tiny policy-gradient loop (tests/ckpt/_exactly_once.py), standing in for the GRPO
driver, which does not exist yet."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hpcrl.ckpt.load import load_checkpoint
from hpcrl.ckpt.manifest import read_manifest
from hpcrl.ckpt.shards import ShardSpec
from tests.waiting import wait_until

STEPS, EVERY = 40, 4
REPO = Path(__file__).parents[2]


def _run(root: Path, metrics: Path, *hold: int) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.ckpt._exactly_once", str(root), str(metrics), str(STEPS), str(EVERY)]
        + [str(step) for step in hold],
        cwd=REPO,
    )


def _final(root: Path) -> dict[str, torch.Tensor]:
    step = root / f"step_{STEPS:08d}"
    manifest = read_manifest(step)
    specs = [
        ShardSpec(n, t.global_shape, (0,) * len(t.global_shape), t.global_shape, t.dtype)
        for n, t in manifest.tensors.items()
    ]
    return load_checkpoint(step, specs).tensors


def _lines_seen(metrics: Path) -> int:
    return len(metrics.read_text().splitlines()) if metrics.exists() else 0


@pytest.mark.heavy
@pytest.mark.slow
def test_sigkill_at_a_random_step_then_resume_is_bitwise_identical(tmp_path):
    reference_root, reference_log = tmp_path / "ref", tmp_path / "ref.jsonl"
    assert _run(reference_root, reference_log).wait(timeout=300) == 0

    kill_after = random.Random(7).randint(EVERY + 1, STEPS - EVERY)
    root, log = tmp_path / "run", tmp_path / "run.jsonl"
    # the victim freezes itself before its last step: however late the kill, the run has not ended
    proc = _run(root, log, STEPS)
    wait_until(
        lambda: _lines_seen(log) >= kill_after or proc.poll() is not None, 120, f"{kill_after} steps", 0.002
    )
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=120) == -signal.SIGKILL, "the run ended before it could be killed"
    killed_at = _lines_seen(log)
    assert killed_at < STEPS
    assert _run(root, log).wait(timeout=300) == 0

    assert log.read_text() == reference_log.read_text()  # every step once, losses bitwise (float.hex)
    expected, got = _final(reference_root), _final(root)
    assert expected.keys() == got.keys() and any(k.startswith("optim.exp_avg_sq.") for k in got)
    for name in expected:
        assert torch.equal(expected[name], got[name]), name
