"""hpcrl.train.hf_config: config.json read as untrusted data, mapped to ModelConfig in one place, and a
template's own architecture values checked against it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hpcrl.errors import ConfigError
from hpcrl.experiment.resolve import resolve
from hpcrl.train.config import ARCHITECTURE_FIELDS, TINY_MODEL, ModelConfig
from hpcrl.train.hf_config import (
    MAX_CONFIG_BYTES,
    ModelDimsUnavailable,
    architecture_from_hf,
    read_config_json,
    with_hf_architecture,
)

REPO = Path(__file__).resolve().parents[2]
# The published config.json files of the GPU recipes' models (architecture keys; the older format:
# top-level rope_theta / rope_scaling, torch_dtype), to pin the recipes' spelled-out values to them.
QWEN25_7B = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "vocab_size": 152064,
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "num_hidden_layers": 28,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "rope_scaling": None,
    "sliding_window": 131072,
    "use_sliding_window": False,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}
LLAMA2_7B = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 32000,
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-05,
    "rope_scaling": None,
    "tie_word_embeddings": False,
    "torch_dtype": "float16",
}
MINIMAL = {"vocab_size": 16, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4}


def write(directory: Path, data: object) -> Path:
    (directory / "config.json").write_text(json.dumps(data))
    return directory


def test_model_config_fills_the_tiny_model_only_without_hf_path():
    assert {name: getattr(ModelConfig(), name) for name in ARCHITECTURE_FIELDS} == dict(TINY_MODEL)
    assert ModelConfig(hidden_size=128).hidden_size == 128
    with_dir = ModelConfig(hf_path="/models/x", vocab_size=8)
    assert with_dir.unset_architecture() == [n for n in ARCHITECTURE_FIELDS if n != "vocab_size"]


@pytest.mark.parametrize(
    ("template", "published"),
    [("qwen2.5-7b-ppo-8xa100.yaml", QWEN25_7B), ("llama2-7b-grpo-8xa100.yaml", LLAMA2_7B)],
)
def test_gpu_recipes_spell_out_their_models_config_json(tmp_path, template, published):
    cfg = resolve(REPO / "templates" / "gpu" / template).elements[0].config.model
    assert cfg.unset_architecture() == []  # complete: `hpcrl plan` needs no directory
    on_cluster = with_hf_architecture(
        ModelConfig(**{**vars(cfg), "hf_path": str(write(tmp_path, published))})
    )
    assert on_cluster == ModelConfig(
        **{**vars(cfg), "hf_path": str(tmp_path)}
    )  # no mismatch, nothing changed


def test_unset_fields_come_from_config_json_and_set_ones_are_checked(tmp_path):
    write(tmp_path, QWEN25_7B)
    filled = with_hf_architecture(ModelConfig(hf_path=str(tmp_path), dtype="bfloat16"))
    assert filled.unset_architecture() == [] and filled.dtype == "bfloat16"
    assert (filled.family, filled.qkv_bias, filled.num_query_groups, filled.rope_theta) == (
        "qwen2",
        True,
        4,
        1e6,
    )
    wrong = ModelConfig(hf_path=str(tmp_path), hidden_size=4096, family="llama", qkv_bias=True)
    with pytest.raises(ConfigError) as info:
        with_hf_architecture(wrong)
    assert {(p.key, p.message.split(" in ")[0]) for p in info.value.problems} == {
        ("model.hidden_size", "4096"),
        ("model.family", "'llama'"),
    }
    assert "3584 in " in str(info.value) and str(tmp_path / "config.json") in str(info.value)


def test_a_rank_refuses_a_mismatch_before_reading_any_weight(tmp_path):
    from hpcrl.train.trainer import build_policy_trainer

    write(tmp_path, LLAMA2_7B)  # and no *.safetensors: the check must come first
    with pytest.raises(ConfigError, match=r"model\.hidden_size: 64 in the template, but 4096"):
        build_policy_trainer(ModelConfig(hf_path=str(tmp_path), hidden_size=64), None, groups=None)


def test_missing_directory_plans_from_the_template_alone(tmp_path):
    complete = ModelConfig(**{**TINY_MODEL, "hf_path": str(tmp_path / "on-the-cluster")})
    assert with_hf_architecture(complete) is complete
    partial = ModelConfig(hf_path=str(tmp_path / "on-the-cluster"), vocab_size=32)
    assert with_hf_architecture(partial, need=["vocab_size"]) is partial
    with pytest.raises(ModelDimsUnavailable, match=r"model\.hf_path: cannot read .*model\.hidden_size"):
        with_hf_architecture(partial, need=["vocab_size", "hidden_size"])


def test_absent_keys_take_transformers_defaults(tmp_path):
    """The defaults hf_config gives absent keys are the ones transformers' own config classes give."""
    from transformers import AutoConfig

    from hpcrl.train.hf_convert import model_config_from_hf

    for family, kv_heads in (("llama", {}), ("qwen2", {"num_key_value_heads": 2})):
        directory = tmp_path / family
        directory.mkdir()
        write(directory, {**MINIMAL, **kv_heads, "intermediate_size": 128, "model_type": family})
        ours = architecture_from_hf(read_config_json(directory))
        theirs = model_config_from_hf(AutoConfig.from_pretrained(directory, local_files_only=True))
        assert ours == {name: getattr(theirs, name) for name in ARCHITECTURE_FIELDS}
    # Qwen2Config's own default (32 kv heads whatever the heads) would be a silent surprise: refused
    with pytest.raises(ConfigError, match="num_key_value_heads"):
        architecture_from_hf({**MINIMAL, "intermediate_size": 128, "model_type": "qwen2"})


@pytest.mark.parametrize(
    ("change", "key"),
    [
        ({"model_type": "mistral"}, "model_type"),
        ({"hidden_size": True}, "hidden_size"),
        ({"hidden_size": 2**40}, "hidden_size"),
        ({"intermediate_size": None}, "intermediate_size"),
        ({"rms_norm_eps": "1e-6"}, "rms_norm_eps"),
        ({"rms_norm_eps": -1.0}, "rms_norm_eps"),
        ({"tie_word_embeddings": "false"}, "tie_word_embeddings"),
        ({"head_dim": 64}, "head_dim"),
        ({"attention_bias": True}, "attention_bias"),
        ({"rope_scaling": {"type": "linear", "factor": 2.0}}, "rope_scaling"),
        ({"rope_parameters": {"rope_type": "llama3"}}, "rope_parameters"),
        ({"rope_parameters": {"rope_type": "default", "rope_theta": 0}}, "rope_parameters.rope_theta"),
        ({"rope_scaling": [1]}, "rope_scaling"),
    ],
)
def test_bad_values_name_the_file_and_key(tmp_path, change, key):
    data = {**LLAMA2_7B, **change}
    if change.get("intermediate_size", 0) is None:
        del data["intermediate_size"]
    write(tmp_path, data)
    with pytest.raises(ConfigError) as info:
        architecture_from_hf(read_config_json(tmp_path), str(tmp_path / "config.json"))
    assert [(p.file, p.key) for p in info.value.problems] == [(str(tmp_path / "config.json"), key)]


@pytest.mark.parametrize(
    "text",
    [
        '{"vocab_size": NaN}',
        '{"a": Infinity}',
        '{"vocab_size": 1, "vocab_size": 2}',
        "[1, 2]",
        '{"a": ' * 100_000,
        "\xff\xfe",
        "1" * 5000,  # past Python's int-digits limit
    ],
    ids=["nan", "infinity", "duplicate-key", "array", "deep", "not-utf8", "huge-int"],
)
def test_non_json_or_ambiguous_json_is_refused(tmp_path, text):
    (tmp_path / "config.json").write_bytes(text.encode("latin-1"))
    with pytest.raises(ConfigError) as info:
        read_config_json(tmp_path)
    assert not isinstance(info.value, ModelDimsUnavailable)
    assert info.value.problems[0].file == str(tmp_path / "config.json")


def test_size_cap_fifo_and_directory_are_refused_without_reading_them(tmp_path):
    (tmp_path / "big").mkdir()
    (tmp_path / "big" / "config.json").write_bytes(b" " * MAX_CONFIG_BYTES + b"{}")
    (tmp_path / "fifo").mkdir()
    os.mkfifo(tmp_path / "fifo" / "config.json")  # a plain open() would block here forever
    (tmp_path / "dir" / "config.json").mkdir(parents=True)
    for name, message in (
        ("big", "larger than"),
        ("fifo", "not a regular file"),
        ("dir", "not a regular file"),
    ):
        with pytest.raises(ConfigError, match=message):
            read_config_json(tmp_path / name)
    with pytest.raises(ModelDimsUnavailable):
        read_config_json(tmp_path / "absent")


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)
KEYS = [*MINIMAL, "intermediate_size", "model_type", "num_key_value_heads", "max_position_embeddings",
        "rope_theta", "rope_scaling", "rope_parameters", "rms_norm_eps", "tie_word_embeddings", "head_dim",
        "attention_bias", "mlp_bias", "use_sliding_window"]  # fmt: skip
VALUES = st.one_of(JSON, st.integers(-3, 2**33), st.sampled_from(["llama", "qwen2", "default", "linear"]))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    base=st.sampled_from([LLAMA2_7B, QWEN25_7B, {}]),
    changes=st.dictionaries(st.sampled_from(KEYS), VALUES, max_size=5),
    raw=st.one_of(st.none(), st.binary(max_size=64)),
)
def test_any_config_json_maps_to_checked_values_or_a_config_error(tmp_path, base, changes, raw):
    """Whatever the file holds: a ConfigError naming the file, or every field of the declared type."""
    path = tmp_path / "config.json"
    path.write_bytes(raw if raw is not None else json.dumps({**base, **changes}).encode())
    try:
        arch = architecture_from_hf(read_config_json(tmp_path), str(path))
    except ConfigError as err:
        assert err.problems and all(p.file == str(path) for p in err.problems)
        return
    assert arch["family"] in ("llama", "qwen2") and arch["qkv_bias"] == (arch["family"] == "qwen2")
    for name in ("vocab_size", "hidden_size", "num_layers", "num_attention_heads", "num_query_groups"):
        assert type(arch[name]) is int and 1 <= arch[name] < 2**31
    assert type(arch["rope_theta"]) is float and arch["rope_theta"] > 0
    assert type(arch["tie_word_embeddings"]) is bool
    ModelConfig(**arch)  # a valid ModelConfig
