"""Crash consistency: SIGKILL a saving process inside its saves, many times, on one checkpoint root.

Each trial forks a child from a fork server (torch and h5py already imported there, so a trial costs
milliseconds; see `_crashloop.zygote` for why not from pytest itself) that resumes from `latest` and
saves every step until it is killed at a named moment of a save (`_crashloop.PAUSE_POINTS`: the child
freezes itself there and is killed, so the kill lands inside a save however busy the machine is; each
moment is hit at its 1st-3rd call, so at several steps). After every kill: `latest` fully
verifies and loads, holds exactly the state of its step, and that step is at least the last one the
child was told was committed (no trial loses more than the steps since the previous commit).
A damaged `latest` (not a crash: a flipped bit) is set aside by the rerun that falls back past it, so
that rerun and every later one commits and resumes (no crash loop).
"""

from __future__ import annotations

import json
import logging
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hpcrl.ckpt.commit import REJECTED, committed, read_latest
from hpcrl.ckpt.load import load_checkpoint
from hpcrl.ckpt.manifest import read_manifest
from hpcrl.ckpt.verify import dataset_ranges, verify_directory
from tests.ckpt._crashloop import PAUSE_POINTS, content, inside_save, rerun, specs

TRIALS = 54


@pytest.fixture
def zygote():
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.ckpt._crashloop"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).parents[2],
    )
    yield proc
    proc.stdin.close()
    proc.wait(timeout=30)


def _one_trial(zygote, root, async_save: bool, label: str, occurrence: int) -> int | None:
    """Kill a saving child at the `occurrence`-th call of `label`; what it promised was committed."""
    ask = {"root": str(root), "async_save": async_save, "label": label, "occurrence": occurrence}
    zygote.stdin.write(json.dumps(ask) + "\n")
    zygote.stdin.flush()
    result = json.loads(zygote.stdout.readline())
    assert result["killed"], "the child died before the kill"
    pause = result["pause"]
    assert pause is not None and pause["paused"] == label, f"never reached {label!r} (call {occurrence})"
    assert inside_save(label, pause["listing"], pause["latest"], pause.get("deleting")), (
        f"{label}: no save in {pause}"
    )
    return result["promised"]


@pytest.mark.heavy
@pytest.mark.slow
@pytest.mark.parametrize("async_save", [False, True], ids=["sync", "async"])
def test_sigkill_during_saves_never_breaks_latest(tmp_path, zygote, async_save):
    rng = random.Random(20261129 + async_save)
    labels = list(PAUSE_POINTS) * (TRIALS // len(PAUSE_POINTS))
    rng.shuffle(labels)
    last_good = 0
    for trial, label in enumerate(labels):
        promised = _one_trial(zygote, tmp_path, async_save, label, occurrence=rng.randint(1, 3))
        latest = read_latest(tmp_path)
        if latest is None:
            assert promised is None and last_good == 0, f"trial {trial}: a commit was reported but no latest"
            continue
        verify_directory(latest)
        loaded = load_checkpoint(tmp_path, specs())
        step = loaded.state.step
        assert step >= max(promised or 0, last_good), (
            f"trial {trial} ({label}): latest {step}, promised {promised}"
        )
        for name, expected in content(step).items():
            assert torch.equal(loaded.tensors[name], expected), f"trial {trial}: {name} of step {step}"
        assert len(committed(tmp_path)) <= 3  # keep_last=2 (+1 if killed between commit and prune)
        assert not [p for p in tmp_path.iterdir() if REJECTED in p.name], f"trial {trial}: a resume fell back"
        last_good = step
    assert len(labels) == TRIALS and set(labels) == set(PAUSE_POINTS)  # every moment killed 6 times
    assert last_good >= 5, "the children made too little progress"


def test_a_damaged_latest_is_set_aside_so_every_rerun_resumes_and_commits(tmp_path, caplog):
    assert rerun(tmp_path, 4) == 0
    step4 = tmp_path / "step_00000004"
    manifest = read_manifest(step4)
    start, stop, _ = dataset_ranges(manifest, "rank_00000.h5")[manifest.tensors["w"].shards[0].dataset]
    data = bytearray((step4 / "rank_00000.h5").read_bytes())
    data[(start + stop) // 2] ^= 0x01  # a flipped bit in `latest`'s checkpoint
    (step4 / "rank_00000.h5").write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="hpcrl.ckpt.load"):
        assert rerun(tmp_path, 6) == 3  # falls back, then commits step 4 again (refused before: a crash loop)
    [aside] = [p.name for p in tmp_path.iterdir() if REJECTED in p.name]
    assert aside.startswith("step_00000004.rejected-")
    assert f"step_00000004 rejected and set aside as {aside}" in caplog.text
    assert "rank_00000.h5: checksum mismatch" in caplog.text and "tensor w[" in caplog.text
    assert rerun(tmp_path, 7) == 6
    assert rerun(tmp_path, 7) == 7
    assert [s for s, _ in committed(tmp_path)] == [7, 6]
    assert read_latest(tmp_path) == tmp_path / "step_00000007"
