"""A model's architecture from a Hugging Face `config.json`: the one map from HF keys to ModelConfig.

    arch = architecture_from_hf(data)          # ModelConfig field -> value, from config.json's keys
    cfg = with_hf_architecture(model_cfg)      # unset fields filled, set ones checked against the file

Who uses it: the memory planner (hpcrl.plan.memory, on a login node: no torch, no transformers), every
rank before it loads weights (hpcrl.train.trainer) and the transformers route
(hpcrl.train.hf_convert.model_config_from_hf, which passes its config's `to_dict()`), so the planner
and the ranks cannot read the same directory differently.

Why not transformers' AutoConfig here: the planner must stay light, and the file may come from anywhere
(a shared model store, a download), so it is read as untrusted data: a regular file of at most
MAX_CONFIG_BYTES, strict JSON (no NaN/Infinity, no duplicate keys), every value used type-checked.
Anything wrong in it is a ConfigError (exit 2) naming the file and the key. A config.json that cannot be
opened here (a path that exists only on the cluster) is ModelDimsUnavailable, a ConfigError that
`hpcrl submit` may skip past and `hpcrl plan` need not hit when the template spells out the dims.

Keys absent from config.json take the defaults of transformers' LlamaConfig / Qwen2Config (pinned by
tests/train/test_hf_config.py against transformers itself), but for a qwen2 `num_key_value_heads`, which
must be stated (Qwen2Config's default is 32 kv heads whatever the heads: a silent surprise).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

from hpcrl.config.safe_read import UnsafeFile, read_capped
from hpcrl.errors import ConfigError, Problem, short
from hpcrl.train.config import ARCHITECTURE_FIELDS, ModelConfig

MAX_CONFIG_BYTES = 1 << 20
"""An HF config.json is a few KB; anything past 1 MiB is not one (or is an attempt to exhaust memory)."""
MAX_DIM = 2**31 - 1
"""Largest accepted integer dimension (megatron-core and the HF kernels index with int32)."""
FAMILIES = ("llama", "qwen2")
"""config.json `model_type`s hpcrl converts (hpcrl.train.hf_convert)."""
REQUIRED_INTS = MappingProxyType(
    {
        "vocab_size": "vocab_size",
        "hidden_size": "hidden_size",
        "num_hidden_layers": "num_layers",
        "num_attention_heads": "num_attention_heads",
        "intermediate_size": "ffn_hidden_size",
    }
)
"""config.json key -> ModelConfig field, for the integer dims every Llama/Qwen2 config.json states."""
MAX_POSITIONS_DEFAULT = MappingProxyType({"llama": 2048, "qwen2": 32768})
"""`max_position_embeddings` when absent: LlamaConfig's and Qwen2Config's defaults."""
ROPE_THETA_DEFAULT = 10000.0
"""`rope_theta` when absent (both families)."""
RMS_NORM_EPS_DEFAULT = 1e-6
"""`rms_norm_eps` when absent (both families)."""


class ModelDimsUnavailable(ConfigError):
    """`model.hf_path`'s config.json is not readable here (e.g. a path that exists only on the cluster)
    and the template does not spell out what was needed: no plan. `submit` may warn and go on; `hpcrl
    plan` reports it (exit 2)."""


def read_config_json(directory: str | Path) -> dict[str, Any]:
    """The JSON object in `<directory>/config.json`, read as untrusted data (see the module docstring).

    ModelDimsUnavailable when it cannot be opened or read; ConfigError (file named) for anything else."""
    path = Path(directory) / "config.json"
    raw = _read_capped(path)
    file = str(path)
    try:
        data = json.loads(raw.decode("utf-8"), parse_constant=_no_constant, object_pairs_hook=_no_duplicates)
    except (UnicodeDecodeError, ValueError, RecursionError) as err:
        raise ConfigError(Problem(f"not valid JSON: {err}", file)) from err
    if not isinstance(data, dict):
        raise ConfigError(
            Problem(f"must be a JSON object of HF config keys, got {type(data).__name__}", file)
        )
    return data


def _read_capped(path: Path) -> bytes:
    """config.json's bytes through the shared untrusted-file reader (hpcrl.config.safe_read: regular
    file only, O_NONBLOCK so a FIFO cannot hang the open, at most MAX_CONFIG_BYTES)."""
    unreadable = f"cannot read {path}"
    try:
        return read_capped(path, MAX_CONFIG_BYTES)
    except UnsafeFile as err:
        raise ConfigError(Problem(f"{err.strerror}: not an HF config.json", str(path))) from err
    except FileNotFoundError as err:  # may exist only on the cluster: the template's dims stand in
        raise ModelDimsUnavailable(
            Problem(f"{unreadable}: {err.strerror or err}", key="model.hf_path")
        ) from err
    except OSError as err:  # here, and wrong (a file for a directory, a symlink loop, no permission)
        raise ConfigError(Problem(f"{unreadable}: {err.strerror or err}", key="model.hf_path")) from err
    except ValueError as err:  # a NUL byte in the path
        raise ConfigError(Problem(f"not a usable path: {err}", key="model.hf_path")) from err


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {short(key)}: which one holds is ambiguous")
        out[key] = value
    return out


class _Reader:
    """Typed reads of config.json keys that collect every problem (each naming the file and key)."""

    def __init__(self, data: Mapping[str, Any], file: str | None) -> None:
        self.data, self.file, self.problems = data, file, []

    def problem(self, key: str, message: str) -> None:
        self.problems.append(Problem(message, self.file, key))

    def integer(self, key: str, absent: int | None = None) -> int | None:
        """A dimension: an int in [1, MAX_DIM]; `absent` (None: required) when the key is absent or null."""
        value = self.data.get(key)
        if value is None and absent is not None:
            return absent
        if value is None:
            self.problem(key, "missing (every Llama/Qwen2 config.json states it)")
        elif type(value) is not int or not 1 <= value <= MAX_DIM:
            self.problem(key, f"must be an integer in [1, {MAX_DIM}], got {short(value)}")
        else:
            return value
        return None

    def number(self, key: str, absent: float, within: Mapping[str, Any] | None = None) -> float | None:
        """A finite float > 0 (JSON ints accepted); `within`: the object holding the dotted `key`'s last part."""
        value = (self.data if within is None else within).get(key.rpartition(".")[2])
        if value is None:
            return absent
        if type(value) not in (int, float) or not math.isfinite(value) or value <= 0:
            self.problem(key, f"must be a finite number > 0, got {short(value)}")
            return None
        return float(value)

    def flag(self, key: str) -> bool:
        """A JSON boolean; false when absent or null."""
        value = self.data.get(key)
        if value is not None and type(value) is not bool:
            self.problem(key, f"must be true or false, got {short(value)}")
        return value is True


def architecture_from_hf(data: Mapping[str, Any], file: str | None = None) -> dict[str, Any]:
    """ModelConfig's architecture fields (ARCHITECTURE_FIELDS) from an HF Llama/Qwen2 config's keys.

    ConfigError listing every key that is missing, of the wrong type, or names a feature hpcrl does not
    convert (another model_type, a head_dim other than hidden/heads, llama biases, sliding window,
    scaled RoPE); `file` is named in each problem."""
    read = _Reader(data, file)
    family = data.get("model_type")
    if family not in FAMILIES:
        read.problem("model_type", f"unsupported {short(family)}: hpcrl converts {' and '.join(FAMILIES)}")
        family = None
    out: dict[str, Any] = {"family": family, "qkv_bias": family == "qwen2"}
    out.update({field: read.integer(key) for key, field in REQUIRED_INTS.items()})
    out["num_query_groups"] = _kv_heads(read, family, out["num_attention_heads"])
    out["max_position_embeddings"] = read.integer(
        "max_position_embeddings", absent=MAX_POSITIONS_DEFAULT.get(family or "", 1)
    )
    out["rope_theta"] = _rope_theta(read)
    out["rms_norm_eps"] = read.number("rms_norm_eps", RMS_NORM_EPS_DEFAULT)
    out["tie_word_embeddings"] = read.flag("tie_word_embeddings")
    _unsupported(read, family, out)
    if read.problems:
        raise ConfigError(read.problems)
    return {name: out[name] for name in ARCHITECTURE_FIELDS}


def _kv_heads(read: _Reader, family: str | None, heads: int | None) -> int | None:
    """`num_key_value_heads`; absent, LlamaConfig takes num_attention_heads (no GQA), but Qwen2Config
    takes 32 whatever the heads are, so a qwen2 config.json must state it."""
    if family == "qwen2" and read.data.get("num_key_value_heads") is None:
        read.problem(
            "num_key_value_heads", "missing (transformers would take 32, whatever the heads): state it"
        )
        return None
    return read.integer("num_key_value_heads", absent=heads or 1)


def _rope_theta(read: _Reader) -> float | None:
    """RoPE base from `rope_parameters` (transformers >= 5) or the top-level `rope_theta` + `rope_scaling`
    (older files); any rope type but default is refused (hpcrl's RoPE is the unscaled one)."""
    for key in ("rope_parameters", "rope_scaling"):
        params = read.data.get(key)
        if params is None:
            continue
        if not isinstance(params, dict):
            read.problem(key, f"must be an object or null, got {short(params)}")
            return None
        kind = params.get("rope_type", params.get("type", "default"))
        if kind != "default":
            read.problem(key, f"rope type {short(kind)} is not supported (only the default RoPE)")
        if key == "rope_parameters" and "rope_theta" in params:
            return read.number(f"{key}.rope_theta", ROPE_THETA_DEFAULT, within=params)
    return read.number("rope_theta", ROPE_THETA_DEFAULT)


def _unsupported(read: _Reader, family: str | None, out: dict[str, Any]) -> None:
    head_dim = read.data.get("head_dim")
    heads, hidden = out["num_attention_heads"], out["hidden_size"]
    known = head_dim is not None and heads and hidden
    if known and (type(head_dim) is not int or head_dim * heads != hidden):
        read.problem("head_dim", f"{short(head_dim)} * {heads} heads != hidden_size {hidden} (not supported)")
    if family == "llama":
        for key in ("attention_bias", "mlp_bias"):
            if read.flag(key):
                read.problem(key, "llama attention_bias/mlp_bias is not supported")
    if family == "qwen2" and read.flag("use_sliding_window"):
        read.problem("use_sliding_window", "qwen2 sliding-window attention is not supported")


def with_hf_architecture(cfg: ModelConfig, need: Iterable[str] = ARCHITECTURE_FIELDS) -> ModelConfig:
    """`cfg` with its architecture from `<hf_path>/config.json`; `cfg` itself when hf_path is None.

    Every architecture field the template set must equal config.json's (ConfigError naming each key and
    both values). When config.json cannot be opened here, `cfg` is returned as the template says it,
    provided it sets every field in `need` (ModelDimsUnavailable otherwise)."""
    if cfg.hf_path is None:
        return cfg
    try:
        data = read_config_json(cfg.hf_path)
    except ModelDimsUnavailable as err:
        missing = [f"model.{name}" for name in need if getattr(cfg, name) is None]
        if not missing:
            return cfg
        why = err.problems[0].message
        raise ModelDimsUnavailable(
            Problem(f"{why}, and the template does not set {', '.join(missing)}", key="model.hf_path")
        ) from err
    file = str(Path(cfg.hf_path) / "config.json")
    arch = architecture_from_hf(data, file)
    problems = [
        Problem(f"{getattr(cfg, name)!r} in the template, but {arch[name]!r} in {file}", key=f"model.{name}")
        for name in ARCHITECTURE_FIELDS
        if getattr(cfg, name) is not None and getattr(cfg, name) != arch[name]
    ]
    if problems:
        raise ConfigError(problems)
    return dataclasses.replace(cfg, **arch)
