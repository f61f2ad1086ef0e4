"""The order test modules are handed to pytest-xdist workers: longest first, by measured seconds.

launch/test.sh runs the foreground tests on three workers, a whole module each (--dist loadfile), in
collection order (--no-loadscope-reorder: xdist's default hands out the modules with the MOST TESTS
first, which put the few-test, several-minute modules — the rehearsal tier, SmolLM2 — last, each then
running alone at the end). Longest first (LPT scheduling) leaves no long module to start late.

MEASURED (module_seconds.json) holds each module's wall seconds, summed over its tests, from a full run
on 2 cores; a module not in it is estimated from its markers. Stale figures only cost speed, never a
result. Refresh them from a full run: `HPCRL_RECORD_MODULE_SECONDS=1 bash launch/test.sh` (the foreground
session merges its modules' figures into the file).
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

MEASURED = Path(__file__).with_name("module_seconds.json")
RECORD_ENV = "HPCRL_RECORD_MODULE_SECONDS"
UNMEASURED_HEAVY_S, UNMEASURED_S = 20.0, 0.3
"""A module not measured yet: this many seconds per `heavy` test (> ~2 s) and per other test."""


def module_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def longest_modules_first(items: list) -> None:
    """Sort `items` in place by their module's seconds, longest first; a module's own order is kept."""
    measured = json.loads(MEASURED.read_text()) if MEASURED.exists() else {}
    estimated: Counter[str] = Counter()
    for item in items:
        heavy = item.get_closest_marker("heavy") or item.get_closest_marker("slow")
        estimated[module_of(item.nodeid)] += UNMEASURED_HEAVY_S if heavy else UNMEASURED_S
    seconds = {module: measured.get(module, guess) for module, guess in estimated.items()}
    items.sort(key=lambda item: -seconds[module_of(item.nodeid)])  # stable: modules stay whole


class ModuleSecondsRecorder:
    """A plugin for the controlling pytest process (with xdist, the workers' reports reach it): sums
    each module's setup + call + teardown seconds and merges them into MEASURED at the end."""

    def __init__(self) -> None:
        self.seconds: Counter[str] = Counter()

    def pytest_runtest_logreport(self, report) -> None:
        self.seconds[module_of(report.nodeid)] += report.duration

    def pytest_sessionfinish(self, session) -> None:
        from filelock import FileLock

        with FileLock(f"{MEASURED}.lock"):  # the Slurm session finishes beside the foreground one
            merged = json.loads(MEASURED.read_text()) if MEASURED.exists() else {}
            merged.update({module: round(s, 1) for module, s in self.seconds.items()})
            MEASURED.write_text(json.dumps(dict(sorted(merged.items())), indent=1) + "\n")


def record_if_asked(config) -> None:
    """Record in the controller of an xdist session only: the order matters there, and a module split
    between it and the Slurm session (tests/bench/test_smoke.py) keeps the foreground's share."""
    distributed = bool(config.getoption("numprocesses", None))
    if os.environ.get(RECORD_ENV) == "1" and distributed and not hasattr(config, "workerinput"):
        config.pluginmanager.register(ModuleSecondsRecorder(), "hpcrl-module-seconds")
