"""A task RL from scratch cannot start, and SFT then RL on it (issue 23's must-show), through `hpcrl run`
as a user runs the three jobs: reverse 4 digits rewarded only for the whole answer (reverse_exact)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcrl.metrics.sinks import read_jsonl
from tests.cli_runs import run_cli

REPO = Path(__file__).resolve().parents[2]
SFT = REPO / "templates" / "sft_reverse_exact.yaml"
GRPO = REPO / "templates" / "grpo_tiny.yaml"
QUIET = ["--logging.tensorboard=false", "--logging.progress=false", "--logging.plot=false"]
TASK = ["--data.task=reverse_exact", "--data.num_digits=4", "--rollout.max_new_tokens=4"]


def _metrics(root: Path) -> list[dict]:
    [metrics] = list(root.glob("*/*/metrics.jsonl"))
    return read_jsonl(metrics)


@pytest.mark.heavy
@pytest.mark.slow
def test_rl_from_scratch_cannot_start_and_sft_then_rl_solves_the_task(tmp_path, capsys):
    """GRPO from random init: every sample of 40 steps scores exactly 0 (so every group advantage is 0:
    no update has a signal). SFT: held-out exact match from 0 to >= 0.9. GRPO from the SFT export (without
    grpo_tiny's entropy bonus, which at 0.1 pulls a solved policy down to ~0.875): held-out reward >= 0.9
    at every evaluation."""
    scratch = tmp_path / "scratch"
    steps = ["--algorithm.steps=40", "--algorithm.eval_every=20"]
    code, _, err = run_cli(capsys, "run", GRPO, *TASK, *steps, f"--run_root={scratch}", *QUIET)
    assert code == 0, err
    rows = _metrics(scratch)
    assert all(r["reward/mean"] == 0.0 for r in rows if "reward/mean" in r)
    assert [r["reward/heldout"] for r in rows if "reward/heldout" in r] == [0.0, 0.0, 0.0]

    sft = tmp_path / "sft"
    code, _, err = run_cli(capsys, "run", SFT, f"--run_root={sft}", *QUIET)
    assert code == 0, err
    held = [r["sft/heldout_exact_match"] for r in _metrics(sft) if "sft/heldout_exact_match" in r]
    assert held[0] < 0.05 and held[-1] >= 0.9, held

    [export] = list(sft.glob("*/*/hf"))
    rl = tmp_path / "rl"
    argv = ["run", GRPO, *TASK, *steps, f"--model.hf_path={export}", f"--run_root={rl}", *QUIET]
    argv.append("--algorithm.entropy_coef=0")  # no exploration bonus on a policy that already solves it
    code, _, err = run_cli(capsys, *argv)
    assert code == 0, err
    held = [r["reward/heldout"] for r in _metrics(rl) if "reward/heldout" in r]
    assert all(h >= 0.9 for h in held), held
