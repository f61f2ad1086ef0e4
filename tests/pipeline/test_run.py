"""`hpcrl run PIPELINE.yaml`: the stages in order on this machine, each element as `hpcrl run` runs one,
the consumer starting from the verified upstream export (inputs.json); a stage that cannot run stops
the chain with its exit code, and the stages after it do not run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli_runs import run_cli

REPO = Path(__file__).resolve().parents[2]
QUIET = "logging: {tensorboard: false, plot: false, progress: false}"
PIPELINE = f"""
stages:
  sft:
    template: {REPO}/templates/sft_tiny.yaml
    set: {{sft: {{steps: 2, eval_every: 2, examples_per_step: 16}}, checkpoint.every_steps: 2, {QUIET}}}
  rl:
    template: {REPO}/templates/grpo_tiny.yaml
    set:
      model.hf_path: "${{stages.sft.hf}}"
      algorithm: {{steps: 1, prompts_per_step: 2, eval_every: 1}}
      checkpoint.every_steps: 1
      {QUIET}
"""


@pytest.mark.heavy
def test_the_stages_run_in_order_here_and_a_failure_stops_the_chain(tmp_path, capsys):
    pipe = tmp_path / "pipe.yaml"
    pipe.write_text(PIPELINE)
    root = tmp_path / "runs"
    code, out, err = run_cli(capsys, "run", pipe, f"--run_root={root}")
    assert code == 0, err[-3000:]
    assert (
        out.index("== stage sft")
        < out.index("stage sft [0] sft/heldout_exact_match:")
        < out.index("== stage rl")
    )
    assert "stage rl [0] reward/heldout:" in out
    [sft_run] = (root / "sft_tiny").iterdir()
    [rl_run] = (root / "grpo_tiny").iterdir()
    assert (sft_run / "hf" / "hpcrl-export.json").is_file()
    assert json.loads((rl_run / "inputs.json").read_text())[0]["outputs"] == [str(sft_run / "hf")]
    assert [json.loads(line)["step"] for line in (rl_run / "metrics.jsonl").read_text().splitlines()] == [
        0,
        1,
    ]

    config = sft_run / "config.yaml"  # the first stage's run dir now holds an edited config: it stops there
    config.write_text(config.read_text().replace("steps: 2", "steps: 3"))
    pipe.write_text(
        PIPELINE.replace("steps: 1, prompts_per_step", "steps: 2, prompts_per_step")
    )  # a new rl run
    code, out, err = run_cli(capsys, "run", pipe, f"--run_root={root}")
    assert code == 2 and f"{config}" in err and "== stage rl" not in out, (out[-2000:], err[-2000:])
    assert [p.name for p in (root / "grpo_tiny").iterdir()] == [rl_run.name]  # the second rl never started


def test_each_stage_prints_its_headline_and_the_figures_logged_beside_it(tmp_path):
    """`hpcrl run PIPELINE`'s summary per element: the stage's held-out headline, first -> last, then each
    Headline.heldout_also figure the run logged (RL: the task rule's score, the reward model's term);
    torn and foreign lines are skipped; a run that logged no evaluation says so."""
    from types import SimpleNamespace

    from hpcrl.cli.pipeline import headline_lines

    def element(index: int, stage: str, rows: list[dict], tail: str = "") -> SimpleNamespace:
        run_dir = tmp_path / f"{stage}{index}"
        run_dir.mkdir()
        text = "".join(json.dumps(r) + "\n" for r in rows) + tail
        (run_dir / "metrics.jsonl").write_text(text)
        return SimpleNamespace(index=index, run_dir=run_dir, config=SimpleNamespace(stage=stage))

    rl_rows = [
        {"step": 0, "reward/heldout": -3.5, "reward/heldout_task": 0.25, "reward/heldout_term/model": -3.5},
        {"step": 1, "reward/mean": 0.1},
        {"step": 2, "reward/heldout": 4.0, "reward/heldout_task": 0.75, "reward/heldout_term/model": 4.0},
    ]
    rl = SimpleNamespace(
        name="rl",
        sweep=SimpleNamespace(
            elements=[
                element(0, "rl", rl_rows, tail='{"step": 3, "reward/held'),  # a torn last line
                element(1, "rl", [{"step": 0, "reward/heldout": 0.5}, {"step": 1, "reward/heldout": 1.0}]),
                element(2, "rl", [{"step": 0, "reward/mean": 0.0}]),
            ]
        ),
    )
    assert headline_lines(rl) == [
        "stage rl [0] reward/heldout: -3.500 -> 4.000, reward/heldout_task: 0.250 -> 0.750, "
        "reward/heldout_term/model: -3.500 -> 4.000",
        "stage rl [1] reward/heldout: 0.500 -> 1.000",
        "stage rl [2] reward/heldout: not logged",
    ]
    sft = SimpleNamespace(
        name="sft",
        sweep=SimpleNamespace(elements=[element(0, "sft", [{"step": 0, "sft/heldout_exact_match": 0.0}])]),
    )
    assert headline_lines(sft) == ["stage sft [0] sft/heldout_exact_match: 0.000 -> 0.000"]
