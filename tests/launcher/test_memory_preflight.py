"""`submit` refuses a sweep whose elements the memory planner predicts not to fit (exit 2, nothing
written), and submits it with --ignore_memory_plan."""

from __future__ import annotations

from pathlib import Path

from hpcrl.cli import main

REPO = Path(__file__).resolve().parents[2]

# Llama-2-70B dimensions, unsharded (t=1) on each of 8 A100 80GB ranks: ~140 GB of bf16 weights alone.
TOO_BIG = f"""
extends: {REPO / "templates" / "base.yaml"}
name: too-big
model: {{vocab_size: 32000, hidden_size: 8192, num_layers: 80, num_attention_heads: 64,
        num_query_groups: 8, ffn_hidden_size: 28672, max_position_embeddings: 4096, dtype: bfloat16}}
parallel: {{tensor: 1, pipeline: 1, data: 8}}
cluster: {{profile: a100-ib, executor: slurm, nodes: 1, tasks_per_node: 8}}
"""


def test_a_sweep_predicted_not_to_fit_is_refused_unless_asked(tmp_path, capsys):
    template = tmp_path / "too-big.yaml"
    template.write_text(TOO_BIG)
    sweep_dir = tmp_path / "sweep"
    args = ["submit", str(template), "--dry-run", "--sweep_dir", str(sweep_dir)]

    assert main(args) == 2
    err = capsys.readouterr().err
    assert "memory plan" in err and "element 0" in err and "--ignore_memory_plan" in err
    assert not sweep_dir.exists()

    assert main([*args, "--ignore_memory_plan"]) == 0
    assert (sweep_dir / "sbatch").is_dir()
