"""`hpcrl plan` exits 0 on every experiment template under templates/, through the CLI as a user runs it.

The GPU recipes name an `hf_path` that exists only on the cluster: they are planned from the dims they
spell out. What is not planned, and why, is said per file (pytest -rs lists it)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from hpcrl.cli import main as cli_main

REPO = Path(__file__).resolve().parents[2]
TEMPLATES = REPO / "templates"
ALL = sorted(TEMPLATES.rglob("*.yaml"))
SMOLLM2_CONFIG = {  # HuggingFaceTB/SmolLM2-135M-Instruct's config.json (the architecture keys)
    "model_type": "llama",
    "vocab_size": 49152,
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-05,
    "rope_scaling": None,
    "rope_theta": 100000,
    "tie_word_embeddings": True,
}


TINY_TEACHER_CONFIG = {"model_type": "llama", "vocab_size": 16, "hidden_size": 64, "intermediate_size": 128,
                       "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2}  # fmt: skip


def _data(path: Path) -> dict:
    return yaml.safe_load(path.read_text()) or {}


def _extends(path: Path) -> Path | None:
    parent = _data(path).get("extends")
    return (path.parent / parent).resolve() if parent else None


def not_planned(path: Path) -> str | None:
    """Why `path` is not an experiment template that `hpcrl plan` takes on its own, or None."""
    if "programs" in _data(path):
        return "a benchmark suite for `hpcrl bench run` (`programs:`), not an experiment template"
    if path.stem.endswith("-base"):
        return "a base that model templates extend (no model or layout of its own); planned through them"
    if ((_data(path).get("rollout") or {}).get("engine")) == "vllm":
        return "needs vLLM (rollout.engine: vllm; not in this venv): run in the vLLM tier, tests/rollout/test_vllm_rl_job.py"
    return None


def caller_overrides(path: Path, tmp_path: Path) -> list[str]:
    """What a template's caller fills in: benchmarks/smollm2_model.py gives smollm2_grpo.yaml its
    converted HF directory (here one holding SmolLM2-135M-Instruct's config.json) and its prompts;
    distill_tiny.yaml's user its teacher."""
    if path.name == "distill_tiny.yaml":  # its user names the teacher: here one of the tiny model's dims
        (tmp_path / "config.json").write_text(json.dumps(TINY_TEACHER_CONFIG))
        return ["--algorithm.teacher_path", str(tmp_path)]
    if path.name != "smollm2_grpo.yaml":
        return []
    (tmp_path / "config.json").write_text(json.dumps(SMOLLM2_CONFIG))
    return ["--model.hf_path", str(tmp_path), "--data.path", str(tmp_path / "addition.jsonl")]


@pytest.mark.parametrize("path", ALL, ids=[str(p.relative_to(TEMPLATES)) for p in ALL])
def test_hpcrl_plan_exits_0(path, tmp_path, capsys):
    reason = not_planned(path)
    if reason:
        pytest.skip(reason)
    code = cli_main(["plan", str(path), "--json", *caller_overrides(path, tmp_path)])
    out, err = capsys.readouterr()
    assert code == 0, err
    plans = [json.loads(line) for line in out.splitlines()]
    assert plans and all(p["fits"] and p["device"]["peak"] > 0 for p in plans)


def test_every_base_is_planned_through_a_template_that_extends_it():
    planned = [p for p in ALL if not_planned(p) is None]
    for base in (p for p in ALL if p.stem.endswith("-base")):
        assert any(_extends(p) == base.resolve() for p in planned), base


def test_gpu_recipes_are_planned_without_their_model_directory():
    for path in sorted((TEMPLATES / "gpu").glob("*.yaml")):
        hf_path = Path(_data(path)["model"]["hf_path"])
        assert not (hf_path / "config.json").exists()  # the planner worked from the template's values
