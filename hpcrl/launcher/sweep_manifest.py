"""The sweep manifest: index -> config id -> resolved config -> run dir -> job id -> state.

One JSON file, `<sweep dir>/manifest.json`, always replaced atomically (tmp + fsync + rename), so a
crash or a failed submission never leaves it half-written. status / logs / cancel / resume read it.
A resubmitted element keeps its earlier job ids in `attempts`. Each entry is one line of the file: a
100,000-element manifest (~30 MB) is written as it is produced, and stays readable with grep.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from hpcrl.config.safe_read import read_capped
from hpcrl.config.yaml_io import atomic_write
from hpcrl.errors import ConfigError, Problem

MANIFEST = "manifest.json"
VERSION = 1
CONFIG_FILE = "config.yaml"
"""An element's resolved config in its run directory: `<run_dir>/config.yaml` (what every rank reads)."""
DRY_RUN_CONFIGS = "configs"
"""A dry run's configs, inside the sweep directory: `<sweep>/configs/<config id>.yaml`."""

RESUBMITTABLE = {
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "BOOT_FAIL",
    "DEADLINE",
    "PREEMPTED",
    "SUBMIT_FAILED",
    "LOST",
}
"""States after which `resume` runs an element again."""
FINAL = RESUBMITTABLE | {"COMPLETED"}
SLURM_STATES = frozenset(
    {
        *FINAL,
        *("PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED", "RESIZING", "SUSPENDED"),
        *("REQUEUE_FED", "REQUEUE_HOLD", "RESV_DEL_HOLD", "REVOKED", "SIGNALING", "SPECIAL_EXIT"),
        *("STAGE_OUT", "STOPPED"),
    }
)
"""Every job state Slurm reports (squeue/sacct JOB STATE CODES); refresh records any other as UNKNOWN."""
STATES = SLURM_STATES | {"NEW", "DRY_RUN", "UNKNOWN"}
"""Every state a manifest entry may hold: a manifest naming another is refused on load."""
EXECUTORS = ("slurm", "local")
MAX_MANIFEST_BYTES = 256 << 20
"""A 100,000-element manifest (hpcrl.config.sweep_axes.MAX_ELEMENTS) is ~30 MB: 256 MiB is room for long
swept values and many resumes, and still refuses a device or a runaway file before it fills memory."""
JOB_ID = {
    "slurm": re.compile(r"[0-9]{1,10}(?:_[0-9]{1,10})?", re.ASCII),
    "local": re.compile(r"local:[1-9][0-9]{0,8}_[0-9]{1,10}", re.ASCII),
}
"""An element's job id per executor: '<array>_<task>' (or a plain job's '<id>') on Slurm, what
hpcrl.launcher.sweeps.submit_elements writes locally ('local:<runner pid>_<index>'). Job ids become
file names in the sweep directory (submitit's '<id>_0_result.pkl'): nothing else may pass."""
ARRAY_ID = {
    "slurm": re.compile(r"[0-9]{1,10}", re.ASCII),
    "local": re.compile(r"local:[1-9][0-9]{0,8}", re.ASCII),
}


@dataclass(slots=True)
class Entry:
    """One array element of the sweep."""

    index: int
    config_id: str
    config_path: str
    run_dir: str
    swept: dict[str, Any]
    job_id: str | None = None
    """Scheduler id of the current attempt: '<array job>_<task>' on Slurm, 'local:<pid>_<index>' locally."""
    state: str = "NEW"
    """Last known state (NEW, DRY_RUN, SUBMIT_FAILED, then the scheduler's states)."""
    attempts: list[str] = field(default_factory=list)
    """Job ids of earlier attempts (before a resume)."""
    reason: str | None = None
    """Why it is in its state, when something says: sbatch's error (SUBMIT_FAILED), Slurm's reason
    (PENDING, FAILED, ...), or the first line of the exception the element raised."""


ENTRY_FIELDS = tuple(f.name for f in fields(Entry))


@dataclass
class Manifest:
    sweep_dir: str
    template: str
    name: str
    executor: str
    created: str
    keys: list[str]
    """Swept dotted keys."""
    entries: list[Entry]
    arrays: list[dict[str, Any]] = field(default_factory=list)
    """One record per array job: job_id, indices, the sbatch script sent, and for a resume its
    `overrides` (the cluster keys changed for those elements)."""
    overrides: dict[str, Any] = field(default_factory=dict)
    code: dict[str, str] = field(default_factory=dict)
    """User code the elements name (reward.function spec -> sha256 of its source at submit)."""
    version: int = VERSION

    @property
    def path(self) -> Path:
        return Path(self.sweep_dir) / MANIFEST

    def save(self) -> None:
        atomic_write(self.path, self._json_lines())

    def _json_lines(self) -> Iterator[str]:
        """The manifest as JSON: one field per line, one entry per line (json's `indent` mode is pure
        Python, and `asdict` copies every entry first: together ~1 s per save of 100,000 entries)."""
        yield "{\n"
        for f in fields(self):
            if f.name != "entries":
                yield f"{json.dumps(f.name)}: {json.dumps(getattr(self, f.name))},\n"
        yield '"entries": [\n'
        for i, entry in enumerate(self.entries):
            line = json.dumps({name: getattr(entry, name) for name in ENTRY_FIELDS})
            yield f",{line}\n" if i else f"{line}\n"
        yield "]\n}\n"

    def entry(self, index: int) -> Entry:
        if not 0 <= index < len(self.entries):
            raise ConfigError(
                Problem(f"index {index} is outside 0..{len(self.entries) - 1}", file=str(self.path))
            )
        return self.entries[index]


def load_manifest(sweep: str | Path) -> Manifest:
    """Load `<sweep>/manifest.json` (or the manifest file itself); ConfigError naming the file (and the
    key) if it is absent, unreadable, not a regular file or not a manifest of the shape `save` writes.

    The directory the manifest is in is the sweep directory, whatever its `sweep_dir` field says: a
    copied or moved sweep keeps working, and nothing read or written leaves the directory given (the
    field follows on the next save)."""
    path = Path(sweep)
    try:
        if path.is_dir():
            path = path / MANIFEST
        raw = read_capped(path, MAX_MANIFEST_BYTES, follow_symlinks=False)
    except FileNotFoundError:
        raise ConfigError(
            Problem("no sweep manifest here (expected a sweep directory)", file=str(path))
        ) from None
    except (OSError, ValueError) as err:  # ValueError: a NUL byte in the path
        why = getattr(err, "strerror", None) or err
        raise ConfigError(Problem(f"unreadable sweep manifest: {why}", file=str(path))) from None
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as err:
        raise ConfigError(
            Problem(f"not UTF-8 text: {err.reason} at byte {err.start}", file=str(path))
        ) from None
    except (ValueError, RecursionError) as err:
        raise ConfigError(Problem(f"unreadable sweep manifest: {err}", file=str(path))) from None
    manifest = manifest_from_json(data, str(path))
    manifest.sweep_dir = str(path.parent.absolute())
    for position, entry in enumerate(manifest.entries):
        entry.config_path = _config_path(entry, Path(manifest.sweep_dir), str(path), position)
    return manifest


def _config_path(entry: Entry, sweep_dir: Path, file: str, position: int) -> str:
    """The config file an entry may name: its run directory's config.yaml, or a dry run's
    `configs/<config id>.yaml`, read in THIS sweep directory (a moved sweep's dry-run configs moved with
    it). Anything else (/etc/passwd, a FIFO) is refused naming the entry's key, before it is read."""
    if entry.config_path == os.path.join(entry.run_dir, CONFIG_FILE):
        return entry.config_path
    dry = Path(entry.config_path)
    if dry.name == f"{entry.config_id}.yaml" and dry.parent.name == DRY_RUN_CONFIGS:
        return str(sweep_dir / DRY_RUN_CONFIGS / dry.name)
    raise _refuse(
        file,
        f"entries[{position}].config_path",
        f"must be <run_dir>/{CONFIG_FILE} or a dry run's {DRY_RUN_CONFIGS}/<config_id>.yaml in the sweep",
    )


# --- validation: a manifest is read back as untrusted data ---------------------------------------------

_NONE = type(None)
TOP_TYPES: dict[str, tuple[type, ...]] = {
    "sweep_dir": (str,),
    "template": (str,),
    "name": (str,),
    "executor": (str,),
    "created": (str,),
    "keys": (list,),
    "entries": (list,),
    "arrays": (list,),
    "overrides": (dict,),
    "code": (dict,),
    "version": (int,),
}
TOP_REQUIRED = ("sweep_dir", "template", "name", "executor", "created", "keys", "entries")
ENTRY_TYPES: dict[str, tuple[type, ...]] = {
    "index": (int,),
    "config_id": (str,),
    "config_path": (str,),
    "run_dir": (str,),
    "swept": (dict,),
    "job_id": (str, _NONE),
    "state": (str,),
    "attempts": (list,),
    "reason": (str, _NONE),
}
ENTRY_REQUIRED = ("index", "config_id", "config_path", "run_dir", "swept")
ARRAY_TYPES: dict[str, tuple[type, ...]] = {
    "job_id": (str,),
    "indices": (list,),
    "script": (str,),
    "overrides": (dict,),
}


def manifest_from_json(data: Any, file: str) -> Manifest:
    """The Manifest in parsed JSON `data`, every field checked (types are exact: json makes no
    subclasses, and a bool is no index); ConfigError naming `file` and the first wrong key."""
    _check_object(data, TOP_TYPES, TOP_REQUIRED, "", file)
    executor = data["executor"]
    if executor not in EXECUTORS:
        raise _refuse(file, "executor", f"must be one of {', '.join(EXECUTORS)}")
    if data.get("version", VERSION) != VERSION:
        raise _refuse(file, "version", f"must be {VERSION} (a manifest of another hpcrl version)")
    if any(type(v) is not str for v in data.get("code", {}).values()):
        raise _refuse(file, "code", "must map each reward function to its sha256 (strings)")
    if any(type(k) is not str for k in data["keys"]):
        raise _refuse(file, "keys", "must be a list of dotted keys (strings)")
    arrays = data.get("arrays", [])
    for k, array in enumerate(arrays):
        _check_array(array, executor, f"arrays[{k}]", file)
    entries = [_entry(e, i, executor, file) for i, e in enumerate(data["entries"])]
    return Manifest(**{**data, "entries": entries})


def _entry(data: Any, position: int, executor: str, file: str) -> Entry:
    where = f"entries[{position}]"
    _check_object(data, ENTRY_TYPES, ENTRY_REQUIRED, f"{where}.", file)
    if data["index"] != position:
        raise _refuse(file, f"{where}.index", f"must be {position} (its position in entries)")
    for name in ("config_path", "run_dir"):
        if not data[name] or "\0" in data[name]:
            raise _refuse(file, f"{where}.{name}", "must be a non-empty path without NUL bytes")
    if data.get("state", "NEW") not in STATES:
        raise _refuse(file, f"{where}.state", "is not a known element state")
    for n, job_id in enumerate([data.get("job_id"), *data.get("attempts", [])]):
        key = f"{where}.job_id" if n == 0 else f"{where}.attempts[{n - 1}]"
        if (job_id is not None or n > 0) and not _matches(JOB_ID[executor], job_id):
            raise _refuse(file, key, f"is not a {executor} job id")
    return Entry(**data)


def _check_array(data: Any, executor: str, where: str, file: str) -> None:
    _check_object(data, ARRAY_TYPES, ("job_id", "indices"), f"{where}.", file)
    if not _matches(ARRAY_ID[executor], data["job_id"]):
        raise _refuse(file, f"{where}.job_id", f"is not a {executor} array job id")
    if any(type(i) is not int for i in data["indices"]):
        raise _refuse(file, f"{where}.indices", "must be a list of element indices")


def _check_object(
    data: Any, types: dict[str, tuple[type, ...]], required: tuple[str, ...], prefix: str, file: str
) -> None:
    """`data` is a JSON object with only keys of `types`, each of its type, and every `required` one."""
    if type(data) is not dict:
        raise _refuse(file, prefix.rstrip(".") or None, f"must be a JSON object, not {_kind(data)}")
    for key, value in data.items():
        allowed = types.get(key)
        if allowed is None:
            raise _refuse(file, f"{prefix}{key}", "unknown key")
        if type(value) not in allowed:
            names = " or ".join("null" if t is _NONE else t.__name__ for t in allowed)
            raise _refuse(file, f"{prefix}{key}", f"must be {names}, not {_kind(value)}")
    for key in required:
        if key not in data:
            raise _refuse(file, f"{prefix}{key}", "missing")


def _matches(pattern: re.Pattern[str], value: Any) -> bool:
    return type(value) is str and pattern.fullmatch(value) is not None


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _refuse(file: str, key: str | None, message: str) -> ConfigError:
    return ConfigError(Problem(f"not a valid sweep manifest: {message}", file=file, key=key))
