"""The sweep manifest: index -> config id -> resolved config -> run dir -> job id -> state.

One JSON file, `<sweep dir>/manifest.json`, always replaced atomically (tmp + fsync + rename), so a
crash or a failed submission never leaves it half-written. status / logs / cancel / resume read it.
A resubmitted element keeps its earlier job ids in `attempts`. Each entry is one line of the file: a
100,000-element manifest (~30 MB) is written as it is produced, and stays readable with grep.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from hpcrl.config.yaml_io import atomic_write
from hpcrl.errors import ConfigError, Problem

MANIFEST = "manifest.json"
VERSION = 1

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


@dataclass(slots=True)
class Entry:
    """One array element of the sweep."""

    index: int
    config_id: str
    config_path: str
    run_dir: str
    swept: dict[str, Any]
    job_id: str | None = None
    """Scheduler id of the current attempt: '<array job>_<task>' on Slurm, 'local:<pid>/<index>' locally."""
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
    """Load `<sweep>/manifest.json` (or the manifest file itself). ConfigError if absent or unreadable."""
    path = Path(sweep)
    if path.is_dir():
        path = path / MANIFEST
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(
            Problem("no sweep manifest here (expected a sweep directory)", file=str(path))
        ) from None
    except (OSError, json.JSONDecodeError) as err:
        raise ConfigError(Problem(f"unreadable sweep manifest: {err}", file=str(path))) from None
    entries = [Entry(**e) for e in data.pop("entries")]
    return Manifest(entries=entries, **data)
