"""Cluster profiles: slurm/profiles/<name>.yaml holds defaults for a template's `cluster:` section.

A profile is a mapping of ClusterConfig fields. The template's own `cluster:` values win over the
profile's; `env` mappings merge (template keys win). Lookup order for a bare name:
$HPCRL_PROFILES (os.pathsep-separated directories), `slurm/profiles/` in the template's directory or
any parent of it, then the profiles shipped beside the hpcrl package. A value ending in .yaml/.yml
is a path relative to the template instead.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any

from hpcrl.config.yaml_io import load_yaml
from hpcrl.errors import ConfigError, Problem

PACKAGE_PROFILES = Path(__file__).resolve().parents[2] / "slurm" / "profiles"


def search_dirs(template_dir: Path) -> list[Path]:
    dirs = [Path(p) for p in os.environ.get("HPCRL_PROFILES", "").split(os.pathsep) if p]
    here = template_dir.resolve()
    dirs += [parent / "slurm" / "profiles" for parent in (here, *here.parents)]
    dirs.append(PACKAGE_PROFILES)
    return list(dict.fromkeys(dirs))


def available(template_dir: Path) -> list[str]:
    names: set[str] = set()
    for directory in search_dirs(template_dir):
        if directory.is_dir():
            names.update(p.stem for p in directory.glob("*.yaml"))
    return sorted(names)


def find_profile(name: str, template_dir: Path) -> Path:
    """The file of profile `name`; ConfigError listing the available ones when there is none."""
    if name.endswith((".yaml", ".yml")):
        path = Path(name) if Path(name).is_absolute() else template_dir / name
        if path.is_file():
            return path
        raise ConfigError(Problem(f"profile file {str(path)!r} not found", key="cluster.profile"))
    for directory in search_dirs(template_dir):
        path = directory / f"{name}.yaml"
        if path.is_file():
            return path
    raise ConfigError(
        Problem(
            f"unknown profile {name!r} (available: {', '.join(available(template_dir)) or 'none'})",
            key="cluster.profile",
        )
    )


@functools.lru_cache(maxsize=64)
def _load_profile_file(path: Path, mtime_ns: int) -> dict[str, Any]:
    data = load_yaml(path) or {}
    if not isinstance(data, dict):
        raise ConfigError(Problem("a cluster profile must be a mapping of cluster fields", file=str(path)))
    return data


def load_profile(path: Path) -> dict[str, Any]:
    """The raw mapping of a profile file (cached by path and modification time)."""
    return dict(_load_profile_file(path, path.stat().st_mtime_ns))
