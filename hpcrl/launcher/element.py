"""What every rank of an array element runs: read the resolved config, form the process group, call
the experiment's entrypoint `fn(cfg, run_dir)`.

The process group is always formed (world 1 included) from the launcher's environment through
`hpcrl.dist.env` (Slurm srun, torchrun-style variables from the local executor, or a single process),
so an entrypoint never sets up distribution itself.

Requeue path: on Slurm the element is a submitit `Checkpointable`; submitit asks for
`--signal=USR2@<signal_delay_s>`, which Slurm sends to EVERY rank (srun tasks). submitit's own handler
would checkpoint and requeue on rank 0 at once, in the middle of a step, while the other ranks carry on.
So `run_element` relays the signal instead: on every rank it runs the callbacks registered with
`on_requeue` (the RL job's is "save and stop at the next step boundary", agreed across ranks). An
entrypoint that then saves and stops early calls `stop_for_requeue()`; once it has returned (process
group torn down), rank 0 hands over to submitit's handler, which calls `ElementTask.checkpoint` (state
REQUEUED) and `scontrol requeue`s the element; the restarted element resumes from `latest`. Without any
registered callback (an entrypoint that saves nothing) the element is not requeued: it would restart
from scratch. A signal that arrives after the last step (the run completes) requeues nothing either.
The same `stop_for_requeue()` path serves a save made before the time limit without any signal.

Termination path: a preemption (PreemptMode=REQUEUE), `scontrol requeue` or scancel sends SIGTERM to every
rank and SIGKILL KillWait seconds later (submitit's own handler only logs SIGTERM). Under submitit every
rank relays it to the callbacks registered with `on_terminate` (the RL job's: "save and stop at the next
step boundary"); an entrypoint that saved and stopped calls `stop_for_termination()`, and the element
exits without a requeue of its own: Slurm requeues a preempted or requeued job itself (it then resumes
exactly where it stopped) and a cancelled one stays ended.
Rank 0 keeps `<run_dir>/launcher.json` up to date (state, job id, restart count) for `hpcrl status`.

Run as a module (`python -m hpcrl.launcher.element CONFIG RUN_DIR`) it is one rank of a local run.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import submitit

from hpcrl.config.yaml_io import atomic_write
from hpcrl.errors import ConfigError, Problem

if TYPE_CHECKING:
    from hpcrl.config.experiment import ExperimentConfig
    from hpcrl.dist.env import DistEnv

LAUNCHER_STATE = "launcher.json"

REQUEUE_SIGNAL = signal.SIGUSR2
"""submitit's warning signal on Slurm (`--signal=USR2@<cluster.signal_delay_s>`)."""

TERMINATE_SIGNAL = signal.SIGTERM
"""Slurm's 'this job ends now' (preemption, requeue, cancel); SIGKILL follows KillWait seconds later."""

_requeue_callbacks: list[Callable[[], None]] = []
_terminate_callbacks: list[Callable[[], None]] = []
_flags = {"signalled": False, "stop_for_requeue": False, "terminating": False, "stopped": False}
# Process-local (one per rank process), not distributed state: signal handlers can't take arguments.


def on_requeue(callback: Callable[[], None]) -> Callable[[], None]:
    """Register `callback()` to run on this rank when Slurm is about to stop the element for a requeue
    (it runs inside a signal handler: only set a flag). A signal that came before the registration
    (while the entrypoint was starting) is delivered at once. Returns a function that unregisters it."""
    _requeue_callbacks.append(callback)
    if _flags["signalled"]:
        callback()
    return lambda: _requeue_callbacks.remove(callback) if callback in _requeue_callbacks else None


def on_terminate(callback: Callable[[], None]) -> Callable[[], None]:
    """Register `callback()` to run on this rank when Slurm is terminating the element (SIGTERM under
    submitit; runs inside a signal handler: only set a flag). Returns a function that unregisters it."""
    _terminate_callbacks.append(callback)
    if _flags["terminating"]:
        callback()
    return lambda: _terminate_callbacks.remove(callback) if callback in _terminate_callbacks else None


def stop_for_termination() -> None:
    """Called by an entrypoint that saved and stopped because Slurm is terminating the element: it ends
    without being reported COMPLETED and without a requeue of its own."""
    _flags["stopped"] = True


def _on_sigterm(signum, frame) -> None:
    _flags["terminating"] = True
    print(f"hpcrl: {signal.Signals(signum).name}: Slurm is ending the job", file=sys.stderr, flush=True)
    for callback in list(_terminate_callbacks):
        callback()


def stop_for_requeue() -> None:
    """Called by an entrypoint that saved and stopped early (requeue signal or time limit): when it
    returns, the element is requeued on Slurm instead of being reported COMPLETED."""
    _flags["stop_for_requeue"] = True


def _submitit_handler() -> Callable | None:
    """submitit's requeue handler when this process runs under submitit on Slurm, else None."""
    from submitit.core.job_environment import SignalHandler

    handler = signal.getsignal(REQUEUE_SIGNAL)
    return handler if isinstance(getattr(handler, "__self__", None), SignalHandler) else None


def _requeues_left(submitit_handler: Callable) -> int:
    """What submitit's handler would compute (its `max_num_timeout` countdown): < 0 = it will refuse to
    requeue. Reads submitit 1.5's private fields; unknown -> assume a requeue is possible."""
    handler = submitit_handler.__self__
    countdown = getattr(getattr(handler, "_delayed", None), "_timeout_countdown", None)
    return 0 if countdown is None else countdown - int(handler.has_timed_out())


def _relay(submitit_handler: Callable) -> Callable:
    """The USR2 handler of every rank: remember the signal and tell the registered callbacks. An
    entrypoint that registers none runs on to the time limit: requeueing it would restart it from
    scratch (nothing saved) and it could never finish."""

    def relay(signum, frame) -> None:
        if _requeues_left(submitit_handler) < 0:
            # stopping would end the run for good: better to keep going and maybe finish in time
            print("hpcrl: requeue signal ignored: no requeue left (max_num_timeout)", file=sys.stderr)
            return
        _flags["signalled"] = True
        print(f"hpcrl: {signal.Signals(signum).name}: requeue requested", file=sys.stderr, flush=True)
        for callback in list(_requeue_callbacks):
            callback()

    return relay


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
    from hpcrl.dist.env import DistEnv

    run_dir = Path(run_dir)
    cfg = load_resolved(config_path)
    env = DistEnv.from_environ()
    # Scoped: a 1-rank element runs inside the caller's process (`hpcrl run`, tests), whose later
    # sbatch calls must not inherit this element's MASTER_PORT and RANK.
    with scoped_environ(env.torchrun_environ()):
        return _run_rank(cfg, env, run_dir)


@contextlib.contextmanager
def scoped_environ(overrides: dict[str, str]) -> Iterator[None]:
    """Set environment variables for the duration of the block, then restore the previous values."""
    saved = {key: os.environ.get(key) for key in overrides}
    os.environ.update(overrides)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _run_rank(cfg: ExperimentConfig, env: DistEnv, run_dir: Path) -> Any:
    import torch.distributed as dist

    from hpcrl.dist.env import init_process_group

    fn = load_entrypoint(cfg.entrypoint)
    submitit_handler = _submitit_handler()
    if submitit_handler is not None and threading.current_thread() is threading.main_thread():
        signal.signal(REQUEUE_SIGNAL, _relay(submitit_handler))
        signal.signal(TERMINATE_SIGNAL, _on_sigterm)
    _flags.update(signalled=False, stop_for_requeue=False, terminating=False, stopped=False)
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
    if submitit_handler is not None:
        # Done: a late warning signal must not kill the exiting process (Python restores the default
        # action, terminate, while it shuts down; Slurm would then call the finished element FAILED).
        signal.signal(REQUEUE_SIGNAL, signal.SIG_IGN)
        if _flags["stop_for_requeue"]:
            _requeue(submitit_handler, env.rank)
            return result
    if _flags["stopped"]:  # saved on SIGTERM: Slurm decides what comes next (requeue or the end)
        if env.rank == 0:
            _write_state(run_dir, state="STOPPED", stopped=time.time())
        return result
    if env.rank == 0:
        _write_state(run_dir, state="COMPLETED", finished=time.time())
    return result


def _requeue(submitit_handler: Callable, rank: int) -> None:
    """After a save-and-stop: rank 0 lets submitit checkpoint (ElementTask.checkpoint), `scontrol
    requeue` the element and exit non-zero. The other ranks simply return (a non-zero exit could make
    srun kill rank 0 before it requeued); the requeue ends them anyway."""
    if rank == 0:
        submitit_handler(REQUEUE_SIGNAL, None)  # scontrol requeue + sys.exit(-1)


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
