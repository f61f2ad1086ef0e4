"""Cluster profiles: trusted defaults for a template's `cluster:` section, and the only source of `setup`.

A profile is a mapping of ClusterConfig fields. The template's own `cluster:` values win over the
profile's; `env` mappings merge (template keys win). A profile may carry `setup:` shell lines, which go
verbatim into every batch script, so where a profile may come from is a security rule:

- A template (or a sweep) names a profile by NAME only (`cluster: {profile: a100-ib}`), looked up in
  the repository's `slurm/profiles/`, then in the user's `$XDG_CONFIG_HOME/hpcrl/profiles/`
  (default `~/.config/hpcrl/profiles/`). Both are written by people who run hpcrl, not by whoever
  wrote a template: a template downloaded into /tmp cannot bring a profile (no lookup next to the
  template) and cannot point at a file.
- The command line may also give a profile FILE: `--cluster.profile PATH` (relative to the working
  directory). Whoever types the command chooses the file.
- `cluster.profile` is never a sweep axis (hpcrl.config.sweep_axes.SWEEP_LEVEL_KEYS): one profile per sweep.
- `cluster.setup` is accepted from a profile only, never from a template or the command line.
- `cluster.env_allow` (environment names beyond the known-safe ones) from a profile or the command line,
  never from a template.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from hpcrl.config.text_rules import path_problem
from hpcrl.config.yaml_io import load_yaml
from hpcrl.errors import ConfigError, Problem, short

PACKAGE_PROFILES = Path(__file__).resolve().parents[2] / "slurm" / "profiles"
"""The repository's profiles."""
PROFILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,99}")
"""A profile name: a file stem, no directory part."""
KEY = "cluster.profile"
COMMAND_LINE = "command line"
"""What a template's `origin_of` says of a key given on the command line (hpcrl.experiment.resolve)."""


def user_profiles() -> Path:
    """The user's own profile directory: $XDG_CONFIG_HOME/hpcrl/profiles (default ~/.config/...)."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "hpcrl" / "profiles"


def search_dirs() -> list[Path]:
    """Where a profile name is looked up, first match wins: the repository's, then the user's."""
    return [PACKAGE_PROFILES, user_profiles()]


def available() -> list[str]:
    names: set[str] = set()
    for directory in search_dirs():
        if directory.is_dir():
            names.update(p.stem for p in directory.glob("*.yaml"))
    return sorted(names)


def is_path(reference: str) -> bool:
    """A profile reference that names a file rather than a profile."""
    return "/" in reference or reference.endswith((".yaml", ".yml"))


def reference_problem(reference: str, from_command_line: bool) -> str | None:
    """Why `reference` (the value of cluster.profile) may not select a profile here, or None."""
    problem = path_problem(reference)
    if problem:
        return problem
    if is_path(reference):
        if from_command_line:
            return None
        return (
            f"{short(reference)} is a file: a template names a profile ({', '.join(available()) or 'none'}, "
            f"from {PACKAGE_PROFILES} or {user_profiles()}); a profile file is given on the command "
            "line only (--cluster.profile PATH)"
        )
    if not PROFILE_NAME.fullmatch(reference):
        return f"{short(reference)} is not a profile name (letters, digits, _ . + -)"
    return None


NOT_IN_TEMPLATES = ("setup", "env_allow")
"""`cluster` keys a template never sets (see `setup_problems`): a profile or the command line does."""


def setup_problems(cluster: Any, origin_of: Callable[[str], str | None]) -> list[Problem]:
    """`cluster.setup` set anywhere but in a profile (a template of the extends chain, the command line),
    and `cluster.env_allow` set in a template (it comes from a profile or the command line).

    Setup lines are shell code run in every batch script; they are trusted because profiles are. The
    environment names a job may set beyond the known-safe ones are accepted by whoever runs the command
    (or their profile), never by the template they run."""
    if not isinstance(cluster, Mapping):
        return []
    problems = []
    if "setup" in cluster:
        key = "cluster.setup"
        message = (
            "shell setup lines come from a cluster profile only (slurm/profiles/ or --cluster.profile PATH)"
        )
        problems.append(Problem(message, origin_of(key), key))
    if "env_allow" in cluster and origin_of("cluster.env_allow") != COMMAND_LINE:
        key = "cluster.env_allow"
        message = (
            "environment names are allowed by a cluster profile or on the command line "
            "(--cluster.env_allow '[NAME]'), never by a template"
        )
        problems.append(Problem(message, origin_of(key), key))
    return problems


def find_profile(reference: str, from_command_line: bool) -> Path:
    """The file of a checked profile reference; ConfigError listing the available ones when none is."""
    if is_path(reference):
        path = Path(reference).absolute()
        if path.is_file():
            return path
        raise ConfigError(Problem(f"profile file {short(str(path))} not found", key=KEY))
    for directory in search_dirs():
        path = directory / f"{reference}.yaml"
        if path.is_file():
            return path
    raise ConfigError(
        Problem(
            f"unknown profile {short(reference)} (available: {', '.join(available()) or 'none'})", key=KEY
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
