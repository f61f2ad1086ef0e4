"""The rules of a logging config alone, run at expand/submit for every element (hpcrl.experiment.rules):
a tracker that is not installed, a W&B project name W&B would refuse, a tracking URI that is neither a
server nor an absolute file store, and a tracker's setting without that tracker (it would do nothing)."""

from __future__ import annotations

import importlib.util
import re
from dataclasses import fields
from urllib.parse import urlparse

from hpcrl.errors import Problem, short
from hpcrl.metrics.config import LoggingConfig, MlflowConfig, WandbConfig

_WANDB_PROJECT = re.compile(r"[A-Za-z0-9_.-][A-Za-z0-9 _.-]{0,127}")
"""W&B refuses / \\ # ? % : in project names (and 128+ characters); control characters are refused here."""
_URI_SCHEMES = ("file", "http", "https")
MODULES = {"wandb": "wandb", "mlflow": "mlflow"}
"""The module each tracker imports (from the `trackers` extra)."""


def logging_problems(cfg: LoggingConfig) -> list[Problem]:
    """Every problem of `cfg`, each naming its dotted key under `logging`."""
    out = []
    for name in sorted({t for t in cfg.trackers if cfg.trackers.count(t) > 1}):
        out.append(Problem(f"{name} is listed twice", key="logging.trackers"))
    for name in dict.fromkeys(cfg.trackers):
        if importlib.util.find_spec(MODULES[name]) is None:
            out.append(
                Problem(f"{name} is not installed: pip install 'hpcrl[trackers]'", key="logging.trackers")
            )
    out += _unread("wandb", cfg.wandb, WandbConfig(), cfg.trackers)
    out += _unread("mlflow", cfg.mlflow, MlflowConfig(), cfg.trackers)
    if not _WANDB_PROJECT.fullmatch(cfg.wandb.project) or cfg.wandb.project != cfg.wandb.project.strip():
        out.append(
            Problem(
                f"{short(cfg.wandb.project)} is not a W&B project name: 1-128 letters, digits, spaces (not at "
                "either end), '_', '.', '-'",
                key="logging.wandb.project",
            )
        )
    if cfg.mlflow.tracking_uri is not None:
        out += _uri_problems(cfg.mlflow.tracking_uri)
    return out


def _unread(name: str, section: object, default: object, trackers: list[str]) -> list[Problem]:
    """A tracker's setting changed while that tracker is not listed: nothing would read it."""
    if name in trackers:
        return []
    return [
        Problem(
            f"set, but logging.trackers does not list {name}: nothing reads it",
            key=f"logging.{name}.{f.name}",
        )
        for f in fields(section)  # type: ignore[arg-type]
        if getattr(section, f.name) != getattr(default, f.name)
    ]


def _uri_problems(uri: str) -> list[Problem]:
    key = "logging.mlflow.tracking_uri"
    if not uri.isprintable() or uri != uri.strip():
        return [Problem(f"{short(uri)} holds control characters or surrounding spaces", key=key)]
    parsed = urlparse(uri)
    if parsed.scheme not in _URI_SCHEMES:
        return [Problem(f"{short(uri)}: expected http(s)://host... or file:/absolute/path", key=key)]
    if parsed.scheme == "file" and (
        parsed.netloc not in ("", "localhost") or not parsed.path.startswith("/")
    ):
        return [
            Problem(
                f"{short(uri)}: a file store must be an absolute path on this host (file:/abs/path)", key=key
            )
        ]
    if parsed.scheme != "file" and not parsed.hostname:
        return [Problem(f"{short(uri)}: no host", key=key)]
    return []
