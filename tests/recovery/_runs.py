"""Helpers of the recovery tests: start real `hpcrl` runs, read their metrics and final checkpoints."""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from hpcrl.ckpt.commit import committed, read_latest
from hpcrl.ckpt.load import load_checkpoint
from hpcrl.ckpt.manifest import read_manifest
from hpcrl.ckpt.shards import ShardSpec
from tests.processes import live_with_environ
from tests.waiting import wait_until

REPO = Path(__file__).resolve().parents[2]
TEMPLATES = REPO / "templates" / "recovery"
RUN_TAG_ENV = "HPCRL_TEST_RUN_ROOT"
"""Set by `start_run` to the run root: every process of that run inherits it (`processes_of`)."""
VOLATILE_PREFIXES = ("time/", "share/", "tps/")
"""Wall-clock metrics: the only ones allowed to differ between two runs of the same config."""


def start_run(template: Path, run_root: Path, *overrides: str, log: Path) -> subprocess.Popen:
    """`hpcrl run TEMPLATE --run_root ROOT [--key value ...]` as a child process (1 rank: in-process), in
    a session of its own, its processes tagged with the run root (`processes_of`)."""
    cmd = [sys.executable, "-m", "hpcrl", "run", str(template), "--run_root", str(run_root), *overrides]
    env = {**os.environ, RUN_TAG_ENV: str(run_root)}
    with log.open("ab") as out:
        return subprocess.Popen(
            cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=env
        )


def processes_of(run_root: Path) -> list[int]:
    """Live processes of the runs `start_run` started under `run_root`: the launcher and its rank server
    and ranks, which lead a process group of their own (hpcrl.launcher.ranks), so a wait on the launcher's
    group would miss them."""
    return live_with_environ(RUN_TAG_ENV, str(run_root))


def run_dir_of(run_root: Path) -> Path:
    """The one run directory under `run_root` (<root>/<name>/<config id>)."""
    [run_dir] = [p.parent for p in run_root.glob("*/*/config.yaml")]
    return run_dir


def metric_rows(run_dir: Path) -> list[dict]:
    """metrics.jsonl without the wall-clock metrics (complete lines only)."""
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]
    return [{k: v for k, v in r.items() if not k.startswith(VOLATILE_PREFIXES)} for r in rows]


def steps_logged(run_dir: Path) -> int:
    path = run_dir / "metrics.jsonl"
    return path.read_bytes().count(b"\n") if path.exists() else 0


def latest_step(ckpt_root: Path) -> int | None:
    latest = read_latest(ckpt_root)
    return None if latest is None else read_manifest(latest).state["step"]


def committed_steps(ckpt_root: Path) -> list[int]:
    return [step for step, _ in committed(ckpt_root)]


def final_tensors(ckpt_root: Path) -> dict[str, torch.Tensor]:
    """Every tensor (parameters and AdamW state) of the newest checkpoint, whole."""
    latest = read_latest(ckpt_root)
    manifest = read_manifest(latest)
    specs = [
        ShardSpec(n, t.global_shape, (0,) * len(t.global_shape), t.global_shape, t.dtype)
        for n, t in manifest.tensors.items()
    ]
    return load_checkpoint(latest, specs).tensors


def digest(tensors: dict[str, torch.Tensor]) -> str:
    """SHA-256 over names and raw bytes, in name order (two equal digests = bitwise equal state)."""
    sha = hashlib.sha256()
    for name in sorted(tensors):
        sha.update(name.encode())
        sha.update(tensors[name].contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return sha.hexdigest()


@dataclass(frozen=True)
class KilledAndResumed:
    reference: Path
    """Run dir of the uninterrupted run."""
    resumed: Path
    """Run dir of the run SIGKILLed after a checkpoint and rerun."""
    killed_at: int
    """Steps logged when the kill came."""
    resume_from: int
    """The step the rerun resumed at (`latest` after the kill)."""
    context: str
    """The random kill point and its seed, for failure messages."""


def kill_after_a_checkpoint_and_rerun(
    template: Path, tmp_path: Path, steps: int, every: int, timeout_s: float = 300
) -> KilledAndResumed:
    """Start `template` twice side by side; SIGKILL the second at a random step after a committed
    checkpoint (> `every` steps logged, before the last checkpoint); rerun it (resume=auto) to the end."""
    seed = int.from_bytes(os.urandom(4), "little")
    kill_after = random.Random(seed).randint(every + 1, steps - every - 1)  # steps logged before the kill
    context = f"(kill after {kill_after} logged steps; seed {seed})"
    reference = start_run(template, tmp_path / "ref", log=tmp_path / "ref.log")
    victim = start_run(template, tmp_path / "run", log=tmp_path / "run.log")

    # kill after a committed checkpoint (or once it ended: the assert below says so)
    def killable() -> bool:
        if victim.poll() is not None:
            return True
        if not any((tmp_path / "run").glob("*/*/metrics.jsonl")):
            return False
        run_dir = run_dir_of(tmp_path / "run")
        return steps_logged(run_dir) >= kill_after and bool(latest_step(run_dir / "checkpoints"))

    wait_until(killable, timeout_s, f"{kill_after} logged steps and a checkpoint {context}", poll_s=0.01)
    # the tag finds the run's processes (unless it ended: the next assert says so)
    assert victim.poll() is not None or victim.pid in processes_of(tmp_path / "run"), context
    victim.send_signal(signal.SIGKILL)
    assert victim.wait(timeout=120) == -signal.SIGKILL, f"the run ended before the kill {context}"
    # the ranks die with the launcher through PDEATHSIG, i.e. later: until they are gone one may still
    # commit a checkpoint and move `latest` (the rerun's writer lock waits for them the same way)
    wait_until(lambda: not processes_of(tmp_path / "run"), 120, f"the killed run's ranks to die {context}")
    run_dir = run_dir_of(tmp_path / "run")
    killed_at = steps_logged(run_dir)
    resume_from = latest_step(run_dir / "checkpoints")
    assert resume_from is not None and 0 < resume_from <= killed_at < steps, (resume_from, killed_at, context)
    resumed = start_run(template, tmp_path / "run", log=tmp_path / "run.log")
    assert resumed.wait(timeout=timeout_s) == 0, (tmp_path / "run.log").read_text()[-3000:]
    assert reference.wait(timeout=timeout_s) == 0, (tmp_path / "ref.log").read_text()[-3000:]
    run_log, ref_log = (tmp_path / "run.log").read_text(), (tmp_path / "ref.log").read_text()
    assert f"at step {resume_from}" in run_log, (resume_from, killed_at, context)  # it resumed there
    assert "written in place" not in run_log + ref_log  # every async save was fenced before its writes
    return KilledAndResumed(run_dir_of(tmp_path / "ref"), run_dir, killed_at, resume_from, context)


def assert_kill_and_rerun_is_exactly_once(
    template: Path, tmp_path: Path, steps: int, every: int, train_size: int, batch: int
) -> None:
    """`kill_after_a_checkpoint_and_rerun` ends exactly as the uninterrupted run (`assert_exactly_once`),
    with an epoch boundary (`train_size` rows, `batch` per step) crossed after the resume point."""
    runs = kill_after_a_checkpoint_and_rerun(template, tmp_path, steps, every)
    assert_exactly_once(runs, steps)
    assert (runs.resume_from * batch) // train_size < (steps * batch) // train_size, runs.context


def assert_exactly_once(runs: KilledAndResumed, steps: int) -> None:
    """Every step logged once with bitwise equal metrics (wall-clock ones aside; + the final evaluation as
    step `steps`), and the final checkpoints (parameters, AdamW state) bitwise equal."""
    rows, expected = metric_rows(runs.resumed), metric_rows(runs.reference)
    assert [r["step"] for r in rows] == list(range(steps + 1)), runs.context
    assert rows == expected, runs.context  # bitwise: JSON floats round-trip exactly
    ref_state = final_tensors(runs.reference / "checkpoints")
    got_state = final_tensors(runs.resumed / "checkpoints")
    assert latest_step(runs.resumed / "checkpoints") == steps
    assert ref_state.keys() == got_state.keys()
    assert any(".optim.exp_avg_sq." in k for k in got_state) and any(".optim.step." in k for k in got_state)
    for name in ref_state:
        assert torch.equal(ref_state[name], got_state[name]), f"{name} differs {runs.context}"
    assert digest(ref_state) == digest(got_state)
    export = "hf/model.safetensors"  # the completed run's HF export, written from that final checkpoint
    assert (runs.resumed / export).read_bytes() == (runs.reference / export).read_bytes(), runs.context
    print(
        f"killed after {runs.killed_at} steps, resumed at {runs.resume_from}, "
        f"final sha256={digest(got_state)}"
    )
