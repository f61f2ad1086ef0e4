"""The layout-vs-model rules with `model.hf_path`: dims come from its config.json at expand time (the
template's own where the file is not on this machine), and a config.json that is not one is exit 2 at
expand, under model.hf_path with the file named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcrl import cli

REPO = Path(__file__).resolve().parents[2]
QWEN = {
    "model_type": "qwen2",
    "vocab_size": 256,
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
    "max_position_embeddings": 128,
    "tie_word_embeddings": True,
}
NO_DIMS = "".join(
    f"  {key}: null\n"
    for key in (
        "family",
        "vocab_size",
        "hidden_size",
        "num_layers",
        "num_attention_heads",
        "num_query_groups",
        "ffn_hidden_size",
        "max_position_embeddings",
    )
)


def template(tmp_path: Path, hf_path: Path, extra: str = "") -> Path:
    path = tmp_path / "t.yaml"
    path.write_text(
        f"extends: {REPO / 'templates/grpo_tiny.yaml'}\nmodel:\n  hf_path: {hf_path}\n{NO_DIMS}{extra}"
    )
    return path


def expand(capsys, path: Path, *overrides: str) -> tuple[int, str]:
    capsys.readouterr()
    code = cli.main(["expand", str(path), *overrides])
    return code, capsys.readouterr().err


def test_kv_heads_from_config_json_are_checked_against_the_layout_at_expand(tmp_path, capsys):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps(QWEN))
    path = template(tmp_path, tmp_path / "m")
    assert expand(capsys, path)[0] == 0
    code, err = expand(capsys, path, "--parallel.tensor", "4", "--parallel.rollout_tensor", "4")
    assert code == 2
    assert "rule kv_heads % t == 0: num_query_groups=2 not divisible by tensor=4" in err
    assert "rule kv_heads % t_g == 0" in err


def test_template_dims_stand_in_when_the_directory_is_only_on_the_cluster(tmp_path, capsys):
    path = tmp_path / "t.yaml"
    path.write_text(f"extends: {REPO / 'templates/grpo_tiny.yaml'}\nmodel:\n  hf_path: /nonexistent/qwen\n")
    assert expand(capsys, path)[0] == 0
    code, err = expand(capsys, path, "--model.num_query_groups", "1", "--parallel.tensor", "2")
    assert code == 2 and "num_query_groups=1 not divisible by tensor=2" in err


@pytest.mark.parametrize(
    ("make", "said"),
    [
        (lambda d: (d / "config.json").write_text("[1]"), "must be a JSON object"),
        (lambda d: (d / "config.json").write_text('{"vocab_size": NaN}'), "NaN is not JSON"),
        (lambda d: (d / "config.json").mkdir(), "not a regular file"),
        (lambda d: (d / "config.json").symlink_to(d / "config.json"), "Too many levels of symbolic links"),
    ],
    ids=["list", "nan", "directory", "symlink-loop"],
)
def test_a_config_json_that_is_not_one_is_exit_2_at_expand_under_hf_path(tmp_path, capsys, make, said):
    (tmp_path / "m").mkdir()
    make(tmp_path / "m")
    code, err = expand(capsys, template(tmp_path, tmp_path / "m"))
    assert code == 2 and said in err, err
    assert "t.yaml:model.hf_path:" in err and "Traceback" not in err


def test_a_file_where_the_model_directory_should_be_is_an_error_here(tmp_path, capsys):
    (tmp_path / "file").write_text("not a directory")
    code, err = expand(capsys, template(tmp_path, tmp_path / "file"))
    assert code == 2 and "Not a directory" in err, err
