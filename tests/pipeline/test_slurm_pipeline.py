"""A three-stage pipeline on the dev Slurm cluster (hpcrl.pipeline): one sbatch per stage, each waiting for
its upstream's array with `afterok` (seen in `scontrol show job`) and starting after it ended (sacct).
The middle stage's data file is taken away after submit: it fails, Slurm removes the last stage
(`--kill-on-invalid-dep`), `hpcrl status` names the failed stage; with the file back, `hpcrl resume`
completes the chain without rerunning the first stage (its run dir untouched), and the last stage's
export loads in transformers as its final checkpoint's model."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from hpcrl import cli
from hpcrl.ckpt.export_manifest import export_problem
from hpcrl.launcher.inputs import last_value
from hpcrl.launcher.sweep_manifest import load_manifest
from hpcrl.pipeline.manifest import load_pipeline_manifest
from tests.waiting import wait_until

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.after_background]
"""After the one-minute requeue element's check: this test's training jobs (six now), run beside that element,
took the CPU it needs to finish an attempt within its minute (a full run saw it end TIMEOUT on its 8th)."""
REPO = Path(__file__).resolve().parents[2]
QUIET = "logging.tensorboard: false, logging.plot: false, logging.progress: false"
PIPELINE = """
stages:
  a:
    template: {sweep}
    set: {{sft.steps: 2, sft.eval_every: 2, checkpoint.every_steps: 2, {quiet}}}
  b:
    template: {repo}/templates/sft_tiny.yaml
    set:
      model.hf_path: "${{stages.a.best(sft/token_accuracy).hf}}"
      data: {{source: jsonl, path: {data}, heldout_size: 4, max_prompt_length: 8}}
      sft: {{steps: 2, eval_every: 2, examples_per_step: 8}}
      checkpoint.every_steps: 2
      logging: {{tensorboard: false, plot: false, progress: false}}
  c:
    template: {repo}/templates/grpo_tiny.yaml
    set:
      model.hf_path: "${{stages.b.hf}}"
      algorithm: {{steps: 2, prompts_per_step: 4, eval_every: 2}}
      checkpoint.every_steps: 2
      logging: {{tensorboard: false, plot: false, progress: false}}
"""
ENDED = {"COMPLETED", "FAILED", "CANCELLED", "CANCELLED_BY_UPSTREAM", "SUBMIT_FAILED"}


def _status(pipeline_dir: Path, capsys) -> dict:
    capsys.readouterr()
    assert cli.main(["status", str(pipeline_dir), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def _slurm(*argv: str) -> str:
    env = {**os.environ, "SLURM_TIME_FORMAT": "standard"}
    return subprocess.run(argv, capture_output=True, text=True, check=True, env=env).stdout


def _ended(pipeline_dir: Path, capsys):
    def check() -> dict | None:
        state = _status(pipeline_dir, capsys)
        return state if all(s["state"] in ENDED for s in state["stages"]) else None

    return wait_until(check, 420, "every stage of the pipeline ended", poll_s=3)


def _files(run_dir: Path) -> dict[str, tuple[int, int]]:
    return {str(p): (p.stat().st_mtime_ns, p.stat().st_size) for p in run_dir.rglob("*") if p.is_file()}


@pytest.mark.heavy
def test_a_failed_middle_stage_cancels_its_dependents_and_resume_completes_the_chain(
    slurm_cluster, tmp_path, capsys, monkeypatch
):
    monkeypatch.delenv("MASTER_ADDR", raising=False)  # sbatch exports this process's environment
    monkeypatch.delenv("MASTER_PORT", raising=False)
    data = tmp_path / "rows.jsonl"
    data.write_text(
        "".join(json.dumps({"prompt": f"{i:03d}=", "answer": f"{i:03d}"}) + "\n" for i in range(40))
    )
    pipe = tmp_path / "pipe.yaml"
    sweep = tmp_path / "seeds.yaml"  # a: four elements; b starts from the one best() picks
    sweep.write_text(
        f"extends: {REPO}/templates/sft_tiny.yaml\nsweep:\n  grid:\n    model.init_seed: [1, 2, 3, 4]\n"
    )
    pipe.write_text(PIPELINE.format(repo=REPO, quiet=QUIET, data=data, sweep=sweep))
    pipeline_dir, runs = tmp_path / "pipeline", tmp_path / "runs"
    argv = ["submit", str(pipe), "--sweep_dir", str(pipeline_dir), "--run_root", str(runs)]
    assert cli.main([*argv, "--cluster.profile", "local-dev"]) == 0
    data.rename(tmp_path / "away.jsonl")  # b cannot start before a ends (afterok): it will find no data
    record = load_pipeline_manifest(pipeline_dir)
    [a_job], [b_job], [c_job] = (record.stage(name).job_ids for name in "abc")  # a: one array of 4
    shown = _slurm("scontrol", "show", "job", "-o", c_job)
    assert f"Dependency=afterok:{b_job}" in shown, shown  # the edge, as Slurm holds it

    state = _ended(pipeline_dir, capsys)
    by_name = {s["name"]: s for s in state["stages"]}
    assert [by_name[n]["state"] for n in "abc"] == ["COMPLETED", "FAILED", "CANCELLED_BY_UPSTREAM"], state
    assert "upstream stage b did not complete" in by_name["c"]["reason"], state
    capsys.readouterr()
    assert cli.main(["status", str(pipeline_dir)]) == 0
    assert "CANCELLED_BY_UPSTREAM" in capsys.readouterr().out
    times = {}
    for line in _slurm(
        "sacct", "-X", "-P", "-n", "-o", "JobID,Start,End", "-j", f"{a_job},{b_job}"
    ).splitlines():
        job, start, end = line.split("|")
        times[job] = (start, end)
    a_ended = max(end for job, (_, end) in times.items() if job.startswith(f"{a_job}_"))
    assert times[b_job][0] >= a_ended, times  # ISO times: b started after every element of a ended

    a_runs = [Path(e["run_dir"]) for e in by_name["a"]["elements"]]
    before = {run: _files(run) for run in a_runs}
    (tmp_path / "away.jsonl").rename(data)
    assert cli.main(["resume", str(pipeline_dir)]) == 0
    state = _ended(pipeline_dir, capsys)
    assert [s["state"] for s in state["stages"]] == ["COMPLETED"] * 3, state
    assert {run: _files(run) for run in a_runs} == before  # the first stage did not run again
    assert [e.attempts for e in load_manifest(pipeline_dir / "a").entries] == [[]] * 4
    assert len(load_manifest(pipeline_dir / "c").entries[0].attempts) == 1  # cancelled once, then run

    [c_run] = [Path(e["run_dir"]) for e in state["stages"][2]["elements"]]
    [b_run] = [Path(e["run_dir"]) for e in state["stages"][1]["elements"]]
    assert f"hf_path: {b_run / 'hf'}" in (c_run / "config.yaml").read_text()  # c started from b's export
    accuracies = [last_value(run, "sft/token_accuracy") for run in a_runs]
    assert len(set(accuracies)) > 1, accuracies  # else any pick would pass
    picked = accuracies.index(max(accuracies))  # the highest; a tie goes to the lowest index
    [selection] = json.loads((b_run / "inputs.selected.json").read_text()).values()  # b ran on a's pick
    assert (selection["element"], selection["output"]) == (picked, str(a_runs[picked] / "hf")), (
        selection,
        accuracies,
    )
    assert len(load_manifest(pipeline_dir / "b").entries) == 1  # the consumer ran once, not per element
    assert export_problem(c_run / "hf") is None  # its files are the ones its record lists
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from hpcrl.ckpt.export import export_hf

    model = AutoModelForCausalLM.from_pretrained(c_run / "hf", attn_implementation="eager")
    again = export_hf(c_run / "checkpoints" / "step_00000002", tmp_path / "again")
    ours, theirs = load_file(again / "model.safetensors"), model.state_dict()
    assert ours.keys() <= theirs.keys()
    assert all(bool((ours[k] == theirs[k]).all()) for k in ours)  # the export is the final checkpoint's model
