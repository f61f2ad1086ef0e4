"""What every rank of an array element runs: read the resolved config, form the process group, call
the experiment's entrypoint `fn(cfg, run_dir)`.

The process group is always formed (world 1 included) from the launcher's environment through
`hpcrl.dist.env` (Slurm srun, torchrun-style variables from the local executor, or a single process),
so an entrypoint never sets up distribution itself.

Requeue hook: on Slurm the element is a submitit `Checkpointable`. When the time limit nears (or the
job is preempted) submitit's signal handler calls `ElementTask.checkpoint`, which runs the callbacks
registered with `on_requeue` (the checkpoint subsystem registers "save now" there), records the
request, and hands submitit the same element to requeue. Rank 0 keeps `<run_dir>/launcher.json` up to
date (state, job id, restart count) for `hpcrl status`.

Run as a module (`python -m hpcrl.launcher.element CONFIG RUN_DIR`) it is one rank of a local run.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import submitit

from hpcrl.config.yaml_io import atomic_write
from hpcrl.errors import ConfigError, Problem

LAUNCHER_STATE = "launcher.json"

_requeue_callbacks: list[Callable[[], None]] = []
# Process-local (one list per rank process), not distributed state: signal handlers can't take arguments.


def on_requeue(callback: Callable[[], None]) -> None:
    """Register `callback()` to run on this rank when Slurm is about to stop the element for a requeue."""
    _requeue_callbacks.append(callback)


def load_entrypoint(spec: str) -> Callable[..., Any]:
    module_name, _, func_name = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
        return getattr(module, func_name)
    except (ImportError, AttributeError) as err:
        raise ConfigError(Problem(f"cannot load entrypoint {spec!r}: {err}", key="entrypoint")) from None


def load_resolved(config_path: str | Path):
    """The ExperimentConfig of a resolved config.yaml (checked again: the file may have been edited)."""
    from hpcrl.config.experiment import ExperimentConfig
    from hpcrl.config.schema import build, check_tree
    from hpcrl.config.yaml_io import load_yaml

    data = load_yaml(config_path)
    checked, problems = check_tree(data, ExperimentConfig, lambda _k: str(config_path))
    if problems:
        raise ConfigError(problems)
    return build(ExperimentConfig, checked)


def _write_state(run_dir: Path, **fields: Any) -> None:
    path = run_dir / LAUNCHER_STATE
    state = json.loads(path.read_text()) if path.exists() else {}
    state.update(fields, updated=time.time())
    atomic_write(path, json.dumps(state, indent=1), fsync=False)


def run_element(config_path: str | Path, run_dir: str | Path) -> Any:
    """Run this rank of one element; returns the entrypoint's result."""
    import torch.distributed as dist

    from hpcrl.dist.env import DistEnv, init_process_group

    run_dir = Path(run_dir)
    cfg = load_resolved(config_path)
    env = DistEnv.from_environ()
    os.environ.update(env.torchrun_environ())
    fn = load_entrypoint(cfg.entrypoint)
    if env.rank == 0:
        restarts = int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)
        _write_state(
            run_dir,
            state="RUNNING",
            job_id=env.job_id,
            restart_count=restarts,
            world_size=env.world_size,
            node=env.node_name,
            started=time.time(),
        )
    init_process_group(env, cfg.parallel.backend, cfg.parallel.timeout_s)
    try:
        result = fn(cfg, run_dir)
    except BaseException as err:
        if env.rank == 0:
            _write_state(run_dir, state="FAILED", error=f"{type(err).__name__}: {err}")
        raise
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    if env.rank == 0:
        _write_state(run_dir, state="COMPLETED", finished=time.time())
    return result


class ElementTask(submitit.helpers.Checkpointable):
    """The callable submitit pickles for each array element: `task(config_path, run_dir)`."""

    def __call__(self, config_path: str, run_dir: str) -> Any:
        return run_element(config_path, run_dir)

    def checkpoint(self, config_path: str, run_dir: str) -> submitit.helpers.DelayedSubmission:
        for callback in _requeue_callbacks:
            callback()
        _write_state(Path(run_dir), state="REQUEUED", requeue_requested=time.time())
        return submitit.helpers.DelayedSubmission(self, config_path, run_dir)


def main(argv: list[str] | None = None) -> int:
    config_path, run_dir = argv if argv is not None else sys.argv[1:]
    run_element(config_path, run_dir)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
