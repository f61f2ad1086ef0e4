"""The pipeline directory's record: `<pipeline dir>/pipeline.json`, one entry per stage, in order.

    <pipeline dir>/pipeline.json      name, the pipeline file, each stage: what it waits for, its state,
                                      its array job ids (Slurm) and why it is in its state
    <pipeline dir>/<stage>/           the stage's sweep directory: an ordinary sweep (manifest.json, the
                                      sbatch scripts, submitit's logs): `hpcrl status DIR/<stage>` works

Written atomically (tmp + fsync + rename) before the first sbatch and after each stage is queued, so a
refused sbatch or a crash mid-submit leaves a record saying which stages are queued. Read back as
untrusted data: a stage's directory is its name (one path component, hpcrl.pipeline.refs.STAGE_NAME),
never a path the file chooses.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hpcrl.config.safe_read import read_capped
from hpcrl.config.yaml_io import atomic_write
from hpcrl.errors import ConfigError, Problem
from hpcrl.pipeline.refs import STAGE_NAME

PIPELINE_MANIFEST = "pipeline.json"
VERSION = 1
MAX_BYTES = 1 << 20
STAGE_STATES = ("NEW", "DRY_RUN", "QUEUED", "SUBMIT_FAILED", "CANCELLED")
"""What the submission did with a stage (its elements' own states are in its sweep manifest): NEW
(written, not sent yet), DRY_RUN, QUEUED (every array accepted by sbatch), SUBMIT_FAILED (sbatch refused
it), CANCELLED (scancelled because a later stage was refused, or by `hpcrl cancel`)."""


@dataclass
class StageRecord:
    name: str
    after: list[str]
    state: str = "NEW"
    job_ids: list[str] = field(default_factory=list)
    """The stage's array job ids (what its dependents' `afterok` names)."""
    reason: str | None = None


@dataclass
class PipelineManifest:
    pipeline_dir: str
    name: str
    file: str
    """The pipeline file it was submitted from."""
    created: str
    stages: list[StageRecord]
    version: int = VERSION

    @property
    def path(self) -> Path:
        return Path(self.pipeline_dir) / PIPELINE_MANIFEST

    def stage_dir(self, name: str) -> Path:
        return Path(self.pipeline_dir) / name

    def stage(self, name: str) -> StageRecord:
        return next(s for s in self.stages if s.name == name)

    def downstream(self, name: str) -> list[str]:
        """`name` and every stage that waits for it, directly or not, in pipeline order."""
        chosen = {name}
        for stage in self.stages:
            if chosen.intersection(stage.after):
                chosen.add(stage.name)
        return [s.name for s in self.stages if s.name in chosen]

    def save(self) -> None:
        data = {k: v for k, v in asdict(self).items() if k != "pipeline_dir"}
        atomic_write(self.path, json.dumps(data, indent=1) + "\n")


def is_pipeline_dir(path: str | Path) -> bool:
    return (Path(path) / PIPELINE_MANIFEST).is_file()


def load_pipeline_manifest(pipeline_dir: str | Path) -> PipelineManifest:
    """The checked record of `pipeline_dir` (the directory it is in, whatever was moved); ConfigError
    naming the file and key for anything else."""
    path = Path(pipeline_dir) / PIPELINE_MANIFEST
    file = str(path)
    try:
        data = json.loads(read_capped(path, MAX_BYTES, follow_symlinks=False).decode("utf-8"))
    except FileNotFoundError:
        raise ConfigError(
            Problem("no pipeline record here (expected a pipeline directory)", file=file)
        ) from None
    except (OSError, ValueError, RecursionError) as err:  # UnicodeDecodeError and JSON errors are ValueErrors
        why = getattr(err, "strerror", None) or err
        raise ConfigError(Problem(f"unreadable pipeline record: {why}", file=file)) from None
    if not isinstance(data, dict) or data.get("version") != VERSION:
        raise ConfigError(Problem(f"not a pipeline record of version {VERSION}", file=file, key="version"))
    for key in ("name", "file", "created"):
        if not isinstance(data.get(key), str):
            raise ConfigError(Problem("must be a string", file=file, key=key))
    raw_stages = data.get("stages")
    if not isinstance(raw_stages, list) or not raw_stages:
        raise ConfigError(Problem("must be a non-empty list of stages", file=file, key="stages"))
    stages: list[StageRecord] = []
    for position, raw in enumerate(raw_stages):
        stages.append(_stage(raw, [s.name for s in stages], file, f"stages[{position}]"))
    return PipelineManifest(
        pipeline_dir=str(path.parent.absolute()),
        name=data["name"],
        file=data["file"],
        created=data["created"],
        stages=stages,
    )


def _stage(raw: Any, earlier: list[str], file: str, where: str) -> StageRecord:
    def refuse(key: str, message: str) -> ConfigError:
        return ConfigError(
            Problem(f"not a valid pipeline record: {message}", file=file, key=f"{where}.{key}")
        )

    if not isinstance(raw, dict) or set(raw) - {"name", "after", "state", "job_ids", "reason"}:
        raise refuse("name", "a stage is an object of name, after, state, job_ids, reason")
    name = raw.get("name")
    if not isinstance(name, str) or not STAGE_NAME.fullmatch(name) or name in earlier:
        raise refuse("name", "must be a stage name, once")
    after = raw.get("after", [])
    if not isinstance(after, list) or any(a not in earlier for a in after):
        raise refuse("after", "must list earlier stages")
    if raw.get("state", "NEW") not in STAGE_STATES:
        raise refuse("state", f"must be one of {', '.join(STAGE_STATES)}")
    job_ids = raw.get("job_ids", [])
    if not isinstance(job_ids, list) or not all(
        isinstance(j, str) and j.isdigit() and len(j) <= 10 for j in job_ids
    ):
        raise refuse("job_ids", "must be a list of Slurm job ids")
    reason = raw.get("reason")
    if reason is not None and not isinstance(reason, str):
        raise refuse("reason", "must be a string or null")
    return StageRecord(name, list(after), raw.get("state", "NEW"), list(job_ids), reason)
