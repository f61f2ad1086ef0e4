"""Agentic RL through the command a user runs: `hpcrl run templates/tool_tiny.yaml` trains on multi-turn
episodes against the built-in Calculator (metrics of the episodes logged, the trainer's log-probs equal
to the engine's on the model's tokens); an environment that raises is reward.nan_policy's to handle."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcrl.env.pool import EnvironmentBroken
from hpcrl.rl.episodes import EnvironmentFailed
from tests.cli_runs import run_cli

REPO = Path(__file__).resolve().parents[2]
TOOL = REPO / "templates" / "tool_tiny.yaml"
ENVS = REPO / "tests" / "env" / "_envs.py"
QUIET = [
    "--logging.tensorboard", "false", "--logging.progress", "false", "--logging.plot", "false",
    "--checkpoint.every_steps", "0", "--checkpoint.save_on_exit", "false", "--checkpoint.export_hf", "false",
]  # fmt: skip


def _rows(out: str) -> list[dict]:
    run_dir = Path(out.splitlines()[0].removeprefix("run dir: "))
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_the_tool_template_trains_on_episodes_with_the_engines_log_probs(tmp_path, capsys):
    argv = ["run", TOOL, "--run_root", tmp_path, "--algorithm.steps", "6", "--algorithm.eval_every", "3"]
    code, out, err = run_cli(capsys, *argv, *QUIET)
    assert code == 0, err
    rows = _rows(out)
    steps = [r for r in rows if "env/turns" in r]
    assert len(steps) == 6
    for r in steps:
        assert 1.0 <= r["env/turns"] <= 2.0 and r["env/failed"] == 0.0
        assert 0.0 <= r["env/tool_calls"] <= 1.0 and "env/success" in r
        assert r["mismatch/logprob_max"] <= 1e-5  # the trainer attends to the observations too
    heldout = [r for r in rows if "reward/heldout" in r]
    assert len(heldout) >= 2 and all(0.0 <= r["reward/heldout_env/success"] <= 1.0 for r in heldout)
    assert all(r["time/env_wait_s"] >= 0.0 and r["share/env_wait"] < 1.0 for r in steps)


def test_at_tp2_the_replica_decodes_episodes_stepped_once_by_its_leader(tmp_path, capsys):
    """t = t_g = 2 on the megatron engine: both ranks of the generation replica decode the episodes its
    first rank's environments step (tests/rl/test_episodes.py shows the lockstep rank by rank)."""
    argv = ["run", TOOL, "--run_root", tmp_path, "--algorithm.steps", "3", "--algorithm.eval_every", "0"]
    layout = ["--parallel.tensor", "2", "--parallel.rollout_tensor", "2", "--cluster.tasks_per_node", "2"]
    code, out, err = run_cli(capsys, *argv, *layout, "--rollout.engine", "megatron", *QUIET)
    assert code == 0, err
    steps = [r for r in _rows(out) if "env/turns" in r]
    assert len(steps) == 3 and all(r["env/failed"] == 0.0 for r in steps)
    assert all(r["mismatch/logprob_max"] <= 1e-5 for r in steps)


def test_the_split_placement_runs_episodes_with_the_reference_on_its_own_pool(tmp_path, capsys):
    """placement split (HybridFlow §4.1): actor + rollout with its environments on rank 0, the reference
    on rank 1; the episodes' context mask reaches the reference's log-probs too (KL 0 at step 0)."""
    argv = ["run", TOOL, "--run_root", tmp_path, "--algorithm.steps", "3", "--algorithm.eval_every", "0"]
    split = ["--placement.kind", "split", "--cluster.tasks_per_node", "2", "--algorithm.kl_coef", "0.05"]
    code, out, err = run_cli(capsys, *argv, *split, *QUIET)
    assert code == 0, err
    steps = [r for r in _rows(out) if "env/turns" in r]
    assert len(steps) == 3 and all(r["env/failed"] == 0.0 for r in steps)
    assert all(r["mismatch/logprob_max"] <= 1e-5 for r in steps)
    assert abs(steps[0]["kl/ref"]) <= 1e-5  # at step 0 the reference scores the episodes as the actor does


def test_an_environment_that_raises_stops_the_run_naming_it_or_is_skipped_and_counted(tmp_path, capsys):
    env = f"{ENVS}:RaisesOnSevens"
    argv = ["run", TOOL, "--run_root", tmp_path, "--rollout.env", env, "--rollout.env_args", "{}"]
    argv += ["--rollout.max_turns", "1"]
    argv += ["--algorithm.steps", "3", "--algorithm.eval_every", "0", "--algorithm.dynamic_sampling", "false"]
    with pytest.raises(EnvironmentFailed) as failed:  # a one-rank run raises in this process
        run_cli(capsys, *argv, *QUIET)
    message = str(failed.value)
    assert message.startswith(f"{env}: environment step of turn 1 on prompt '7"), message
    assert "raised ValueError: sevens are not allowed" in message and "reward.nan_policy=error" in message
    code, out, err = run_cli(
        capsys, *argv, "--reward.nan_policy", "skip", "--run_root", tmp_path / "skip", *QUIET
    )
    assert code == 0, err
    rows = _rows(out)
    assert sum(r["env/failed"] for r in rows) > 0
    assert all(r["env/failed"] == r["reward/skipped"] for r in rows)


def test_an_environment_that_cannot_be_imported_stops_the_run_even_under_skip(tmp_path, capsys):
    """`expand` checks the file without running it; its imports run first in the workers, and a module
    that raises there would fail every episode: the run stops naming it, skip or not."""
    env = tmp_path / "needs_a_package.py"
    env.write_text(
        "import no_such_package_hpcrl\n\n\nclass Env:\n    def reset(self, example):\n"
        "        return ''\n\n    def step(self, action):\n        return '', 1.0, True, {}\n"
    )
    argv = ["run", TOOL, "--run_root", tmp_path / "runs", "--rollout.env", f"{env}:Env"]
    argv += [
        "--rollout.env_args",
        "{}",
        "--reward.nan_policy",
        "skip",
        "--algorithm.steps",
        "2",
        "--algorithm.eval_every",
        "0",
    ]
    with pytest.raises(EnvironmentBroken) as broken:  # a one-rank run raises in this process
        run_cli(capsys, *argv, *QUIET)
    assert f"{env}:Env: the environment cannot start in a worker" in str(broken.value)
    assert "ModuleNotFoundError: No module named 'no_such_package_hpcrl'" in str(broken.value)
