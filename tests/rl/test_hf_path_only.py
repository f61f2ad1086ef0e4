"""A template that names only `model.hf_path` (the model's dimensions in its config.json alone).

Before, the ranks checked the layout against the template's model section as written, dims None:
`hpcrl/distributed/layout.py: heads % t == 0 -> TypeError: unsupported operand type(s) for %:
'NoneType' and 'int'`, on every rank, after start-up. Now `hpcrl.stages.rank.enter_rank` resolves the model
from config.json with the function `expand` checks with, before any rule runs.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcrl.cli import app as cli
from hpcrl.data.tasks import ALPHABET
from hpcrl.data.tokenizer import build_char_tokenizer
from hpcrl.train.config import ModelConfig
from hpcrl.train.hf_dir import write_random_model

pytestmark = pytest.mark.dist

TEMPLATE = """\
name: hf_only
run_root: {runs}
model:
  hf_path: {model}
parallel: {{tensor: 2, rollout_tensor: {t_g}}}
rollout: {{engine: {engine}, samples_per_prompt: 4, max_new_tokens: 3}}
algorithm: {{name: grpo, steps: 2, prompts_per_step: 4, eval_every: 0}}
data: {{source: builtin, task: copy_digits, max_prompt_length: 8, heldout_size: 8}}
checkpoint: {{every_steps: 1}}
logging: {{tensorboard: false, progress: false, plot: false}}
cluster: {{env: {{OMP_NUM_THREADS: "1"}}}}
"""


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    cfg = ModelConfig(family="qwen2", qkv_bias=True, vocab_size=16, num_attention_heads=4, num_query_groups=2)
    out = tmp_path_factory.mktemp("hf") / "model"
    return write_random_model(cfg, out, build_char_tokenizer(ALPHABET, cfg.vocab_size))


def _template(tmp_path: Path, model: Path, engine: str = "hf", t_g: int = 1) -> Path:
    path = tmp_path / "t.yaml"
    path.write_text(TEMPLATE.format(runs=tmp_path / "runs", model=model, engine=engine, t_g=t_g))
    return path


@pytest.mark.heavy
@pytest.mark.parametrize(("engine", "t_g"), [("hf", 1), ("megatron", 2)])
def test_run_of_a_template_naming_only_hf_path_trains_at_t2(tmp_path, model_dir, engine, t_g, capsys):
    template = _template(tmp_path, model_dir, engine, t_g)
    assert cli.main(["run", str(template)]) == 0, capsys.readouterr().err
    [run_dir] = (tmp_path / "runs" / "hf_only").iterdir()
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "time/step_s" in r]
    assert [r["step"] for r in steps] == [0, 1]
    assert all(r["mismatch/logprob_max"] <= 1e-4 for r in steps)  # fp32: rollout and trainer agree


def test_expand_plan_and_dry_run_read_the_dims_from_config_json(tmp_path, model_dir, capsys):
    template = _template(tmp_path, model_dir)
    assert cli.main(["expand", str(template)]) == 0
    assert cli.main(["plan", str(template)]) == 0
    sweep = tmp_path / "dry"
    assert cli.main(["submit", str(template), "--dry-run", "--sweep_dir", str(sweep)]) == 0
    capsys.readouterr()


def test_dims_that_contradict_config_json_are_exit_2_naming_the_key_and_both_values(
    tmp_path, model_dir, capsys
):
    template = _template(tmp_path, model_dir)
    assert cli.main(["expand", str(template), "--model.hidden_size", "96"]) == 2
    err = capsys.readouterr().err
    assert "model.hidden_size" in err and "96" in err and "64" in err and "config.json" in err
