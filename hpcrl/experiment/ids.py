"""Config ids: what names an element's run directory (`<run_root>/<name>/<id>`) and its place in a sweep.

An id hashes only what the user set: the values of its stage's sections (hpcrl.experiment.stage_kinds)
that differ from their defaults, canonicalised (sorted keys, no spaces), with DEFAULTS_VERSION:

    id = sha256(canonical_json({"defaults": DEFAULTS_VERSION, "set": user_set(config data)}))[:10]

So a release that adds a config field (or a section) with a default moves no id: a sweep half-done
before an upgrade finds its run directories and resumes their checkpoints. Setting a value equal to its
default is the same as leaving it unset. A value inside a field that holds a mapping (`cluster.env`,
`reward.terms`) is compared whole: the mapping is the value.

Changing a default on purpose changes what every run that left it unset trains, so it must change their
ids: bump DEFAULTS_VERSION with it. tests/experiment/test_ids.py keeps the defaults of DEFAULTS_VERSION
as a golden file and fails when one of them changes without the bump; docs/runs.md lists the changes.
"""

from __future__ import annotations

import functools
import hashlib
from typing import Any

from hpcrl.config.schema import field_types, is_config_class, to_dict
from hpcrl.config.yaml_io import canonical_json, canonical_json_joined
from hpcrl.experiment.config import ExperimentConfig

ID_LENGTH = 10
DEFAULTS_VERSION = 1
"""The defaults ids are measured against; bumped with any deliberate change of a default (docs/runs.md)."""
UNSET = object()
"""What section_set returns for an item that is all default."""


@functools.cache
def default_data(schema: type = ExperimentConfig) -> dict[str, Any]:
    """Every field's default, as plain data (what to_dict makes of a config)."""
    return to_dict(schema())


def user_set(data: dict[str, Any], schema: type = ExperimentConfig) -> dict[str, Any]:
    """The values of a config's plain data that differ from their defaults (sections: only their
    differing fields, and only when some differ). `schema`: the config class the data is of."""
    return _differing(data, default_data(schema), schema)


def section_set(key: str, value: Any, schema: type = ExperimentConfig) -> Any:
    """`user_set` of one top-level item: the differing part of a section, the value of a differing
    top-level field, or UNSET when it is all default (a sweep reuses this per shared section)."""
    hint = field_types(schema).get(key)
    default = default_data(schema).get(key, UNSET)
    if is_config_class(hint) and isinstance(value, dict) and isinstance(default, dict):
        differing = _differing(value, default, hint)
        return differing if differing else UNSET
    return UNSET if value == default else value


def _differing(data: dict[str, Any], defaults: dict[str, Any], cls: type) -> dict[str, Any]:
    hints = field_types(cls)
    out = {}
    for key, value in data.items():
        default = defaults.get(key, UNSET)
        hint = hints.get(key)
        if is_config_class(hint) and isinstance(value, dict) and isinstance(default, dict):
            if differing := _differing(value, default, hint):
                out[key] = differing
        elif value != default:
            out[key] = value
    return out


def config_id(data: dict[str, Any], schema: type = ExperimentConfig) -> str:
    """The id of a resolved config's plain data (its stage's sections: hpcrl.experiment.stage_kinds)."""
    return id_of_set_json(canonical_json(user_set(data, schema)))


def id_of_set_json(set_json: str) -> str:
    """The id from the canonical JSON of the user-set values."""
    text = canonical_json_joined({"defaults": canonical_json(DEFAULTS_VERSION), "set": set_json})
    return hashlib.sha256(text.encode()).hexdigest()[:ID_LENGTH]
