"""Run identity: which run a run directory and its checkpoints belong to.

A run id is `<fingerprint>-<created>-<nonce>`: the config fingerprint (below), the UTC time the run
directory was first started and 4 random hex digits (two runs started in the same second stay apart).
It is written once, at the first start, into `<run_dir>/run.json` and stamped into every checkpoint
(`RunState.run_id`); a resume refuses a checkpoint whose run id is another run's (hpcrl.stages.checkpointing).

The fingerprint: the first 12 hex digits of sha256 over the canonical JSON of the resolved config's
leaves that differ from their defaults (as config ids, hpcrl.experiment.ids: a release that adds a field
with a default keeps every run's identity; DEFAULTS_VERSION is hashed with them), minus the keys that say
how long, where or how a run is carried out rather than what it trains (IDENTITY_FREE). Changing one of those keeps the identity, so a run continues from its own checkpoints:
    name, run_root       where the run directory lives (not what is trained)
    algorithm.steps      how long to train (dpo.steps for DPO): a run extended to more steps is the same run
    logging.*            sinks and progress output
    checkpoint.*         cadence, retention, async, timeouts, the root's location, resume policy;
                         except checkpoint.resume_from (the weights a run starts from are part of it)
    cluster.*            executor, Slurm resources, environment (test knobs such as HPCRL_STEP_SLEEP_S)
    parallel.*           the layout: checkpoints load under another layout by design (resharded load)
Everything else of the stage's sections (seed, model, optim, rollout, algorithm but steps, data, reward,
entrypoint, stage) is identity: the same checkpoint under another seed or learning rate is another run's.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hpcrl.config.schema import flatten, to_dict
from hpcrl.config.yaml_io import atomic_write, canonical_json
from hpcrl.errors import ConfigError, Problem
from hpcrl.experiment.config import ExperimentConfig
from hpcrl.experiment.ids import DEFAULTS_VERSION, user_set
from hpcrl.experiment.resolve import user_code_specs
from hpcrl.experiment.stage_kinds import stage_data, stage_of
from hpcrl.usercode.spec import source_sha256

log = logging.getLogger(__name__)

RUN_FILE = "run.json"
FINGERPRINT_LENGTH = 12
IDENTITY_FREE = ("name", "run_root", "logging", "checkpoint", "cluster", "parallel")
"""Dotted keys (and the sections under them) that do not change a run's identity, with the stage's step
count (its kind's `steps_key`); see the docstring."""
IDENTITY_KEPT = ("checkpoint.resume_from",)
"""Keys under an IDENTITY_FREE section that are identity all the same."""


@dataclass(frozen=True)
class RunIdentity:
    """What `<run_dir>/run.json` holds."""

    run_id: str
    fingerprint: str
    created: str
    """UTC time of the run's first start (ISO 8601)."""
    config: dict[str, Any] = field(default_factory=dict)
    """The fingerprinted config leaves (dotted keys), so a refusal can say which keys differ."""
    code: dict[str, str] = field(default_factory=dict)
    """Code the config names, by key: 'spec sha256=<hex>' of its source (reward.function)."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def identity_config(cfg: ExperimentConfig) -> dict[str, Any]:
    """The config leaves of its stage's sections that make a run's identity (dotted key -> value): those
    set to other than their defaults."""
    free = (*IDENTITY_FREE, stage_of(cfg).steps_key)
    leaves = flatten(user_set(stage_data(to_dict(cfg)), type(cfg)))
    return {key: value for key, value in leaves.items() if _is_identity(key, free)}


def _is_identity(key: str, free_keys: tuple[str, ...]) -> bool:
    if key in IDENTITY_KEPT:
        return True
    return not any(key == free or key.startswith(free + ".") for free in free_keys)


def fingerprint(config: dict[str, Any]) -> str:
    text = canonical_json({"defaults": DEFAULTS_VERSION, "set": config})
    return hashlib.sha256(text.encode()).hexdigest()[:FINGERPRINT_LENGTH]


def fingerprint_of(run_id: str) -> str:
    """The fingerprint part of a run id ('' for an empty or foreign-format id)."""
    head = run_id.split("-", 1)[0]
    return head if len(head) == FINGERPRINT_LENGTH else ""


def new_identity(cfg: Any) -> RunIdentity:
    config = identity_config(cfg)
    fp = fingerprint(config)
    now = time.gmtime()
    run_id = f"{fp}-{time.strftime('%Y%m%dT%H%M%SZ', now)}-{os.urandom(2).hex()}"
    return RunIdentity(run_id, fp, time.strftime("%Y-%m-%dT%H:%M:%SZ", now), config, code_digests(cfg))


def code_digests(cfg: Any) -> dict[str, str]:
    """'spec sha256=<hex>' of every piece of user code the config names (reward.function, rollout.env),
    by key."""
    return {key: f"{spec} sha256={source_sha256(spec)}" for key, spec in user_code_specs(cfg).items()}


def load_or_create(run_dir: Path, cfg: Any) -> RunIdentity:
    """The run's identity from `<run_dir>/run.json`, created there at the first start (call on one rank,
    under the run lock). A run.json of another config is a ConfigError naming the keys that differ:
    the directory belongs to another run."""
    path = Path(run_dir) / RUN_FILE
    if not path.exists():
        identity = new_identity(cfg)
        atomic_write(path, json.dumps(identity.to_json(), indent=1))
        return identity
    saved = _read(path)
    config = identity_config(cfg)
    if saved.fingerprint != fingerprint(config):
        raise ConfigError(
            Problem(
                f"this run directory belongs to run {saved.run_id} (fingerprint {saved.fingerprint}); this "
                f"config's fingerprint is {fingerprint(config)} ({_differences(saved.config, config)}). "
                "Use another run_root or name, or move the directory away",
                file=str(path),
            )
        )
    code = code_digests(cfg)
    if code != saved.code:
        log.warning("%s: the code this run names changed since it started: %s -> %s", path, saved.code, code)
    return saved


def read_identity(run_dir: Path) -> RunIdentity:
    """The identity in `<run_dir>/run.json` (made by `load_or_create` at the first start)."""
    return _read(Path(run_dir) / RUN_FILE)


def _read(path: Path) -> RunIdentity:
    try:
        data = json.loads(path.read_text())
        code = {str(k): str(v) for k, v in dict(data.get("code", {})).items()}
        return RunIdentity(
            str(data["run_id"]),
            str(data["fingerprint"]),
            str(data["created"]),
            dict(data.get("config", {})),
            code,
        )
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ConfigError(Problem(f"unreadable run identity: {err!r}", file=str(path))) from None


def _differences(old: dict[str, Any], new: dict[str, Any], shown: int = 5) -> str:
    """The keys that differ; a key absent from one side is at its default there (only set values are kept)."""
    keys = sorted(k for k in old.keys() | new.keys() if old.get(k, _DEFAULT) != new.get(k, _DEFAULT))
    parts = [f"{k}: {_value(old, k)} -> {_value(new, k)}" for k in keys[:shown]]
    more = f", and {len(keys) - shown} more" if len(keys) > shown else ""
    return "differs in " + ", ".join(parts) + more if parts else "no key recorded differs"


_DEFAULT = object()


def _value(config: dict[str, Any], key: str) -> str:
    return repr(config[key]) if key in config else "(default)"
