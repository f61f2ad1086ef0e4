"""What every rank of an array element runs: read the resolved config, take the run's writer lock
(rank 0), form the process group, call the experiment's entrypoint `fn(cfg, run_dir, lifecycle=...)`.

The process group is always formed (world 1 included) from the launcher's environment through
`hpcrl.distributed.env` (Slurm srun, torchrun-style variables from the local executor, or a single process),
so an entrypoint never sets up distribution itself.

One writer per run: group rank 0 holds the writer lock of the run directory (and of the checkpoint root
when it lies elsewhere) for the whole run (hpcrl.launcher.runlock). It tries before anything is written,
then all ranks agree on the outcome right after the process group forms, so a refused second writer
ends on every rank at once (ConfigError, exit 2, naming the holder's host and pid) without touching the
run directory.

Signals: the `Lifecycle` (hpcrl.lifecycle) this wrapper creates owns them for the run and is
passed to the entrypoint; its save trigger reads it. Requeue path: on Slurm the element is a submitit
`Checkpointable`; submitit asks for `--signal=USR2@<signal_delay_s>`, which Slurm sends to EVERY rank;
the lifecycle relays it to the trigger ("save and stop at the next step boundary", agreed across ranks)
instead of letting submitit requeue rank 0 mid-step. An entrypoint that saved and stopped early calls
`lifecycle.stop_for_requeue()`; once it has returned (process group torn down), rank 0 hands over to
submitit's handler, which calls `ElementTask.checkpoint` (state REQUEUED) and `scontrol requeue`s the
element; the restarted element resumes from `latest`. An entrypoint that never asks for it (it saves
nothing) is not requeued: it would restart from scratch. A signal after the last step requeues nothing.
The same path serves a save made before the time limit without any signal. When the time limit's SIGTERM
comes before that save landed, the lifecycle requeues at once an entrypoint that checkpoints and the
ranks still save at the next step boundary, within KillWait; rank 0 then ends as submitit's requeue
would have ended it at the TERM (`Lifecycle.term_requeue_ending`), and its state stays REQUEUED.

Termination path: a preemption (PreemptMode=REQUEUE), `scontrol requeue` or scancel sends SIGTERM to every
rank and SIGKILL KillWait seconds later (submitit's own handler only logs SIGTERM). The entrypoint saves,
stops and calls `lifecycle.stop_for_termination()`; the element exits without a requeue of its own:
Slurm requeues a preempted or requeued job itself and a cancelled one stays ended. Locally, Ctrl-C
(SIGINT, forwarded to every rank by hpcrl.launcher.ranks) takes the same path.
Rank 0 keeps `<run_dir>/launcher.json` up to date (state, job id, restart count) for `hpcrl status`; a
local launcher records the end of a rank 0 that could not (`record_rank_0_end`: SIGKILL, OOM killer).

Run as a module (`python -m hpcrl.launcher.element CONFIG RUN_DIR`) it is one rank of a local run: it
records its error for the launcher (hpcrl.launcher.ranks.record_error) and exits 2 on a config error.
With `--ranks W ...` it is the local element's rank server (hpcrl.launcher.rank_server), which forks the
W ranks from itself, each running that same `main`.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import submitit

from hpcrl.config.safe_read import read_capped
from hpcrl.config.schema import build, check_tree, get_dotted, to_dict
from hpcrl.config.yaml_io import atomic_write, load_yaml
from hpcrl.distributed.env import DistEnv, init_process_group
from hpcrl.errors import ConfigError, Problem
from hpcrl.experiment.config import ExperimentConfig
from hpcrl.experiment.elements import replace_dotted
from hpcrl.experiment.stage_kinds import entrypoint_of
from hpcrl.launcher.inputs import bind_inputs, read_inputs
from hpcrl.launcher.rank_server import serve
from hpcrl.launcher.ranks import CONFIG_ERROR_EXIT, RankEnd, record_error
from hpcrl.launcher.runlock import RunLocked, lock_targets, writer_lock
from hpcrl.lifecycle import REQUEUE_SIGNAL, Lifecycle, requeues_left

if TYPE_CHECKING:
    from hpcrl.distributed.env import DistEnv
    from hpcrl.experiment.config import ExperimentConfig

LAUNCHER_STATE = "launcher.json"
MAX_LAUNCHER_STATE_BYTES = 16 << 20
"""Largest launcher.json read (its error field is cut by record_error; this bounds a file not ours)."""


def load_entrypoint(spec: str) -> Callable[..., Any]:
    module_name, _, func_name = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
        return getattr(module, func_name)
    except (ImportError, AttributeError) as err:
        raise ConfigError(Problem(f"cannot load entrypoint {spec!r}: {err}", key="entrypoint")) from None


def load_resolved(config_path: str | Path):
    """The ExperimentConfig of a resolved config.yaml (checked again: the file may have been edited)."""

    data = load_yaml(config_path)
    checked, problems = check_tree(data, ExperimentConfig, lambda _k: str(config_path))
    if problems:
        raise ConfigError(problems)
    return build(ExperimentConfig, checked)


def record_rank_0_end(run_dir: Path, end: RankEnd | None) -> None:
    """The launcher's word on a rank 0 that ended badly without writing its own end: killed by SIGKILL
    or the OOM killer, or crashed in native code, it left launcher.json saying RUNNING. That becomes
    FAILED, with how rank 0 ended. A state rank 0 wrote itself (FAILED with its error, STOPPED, ...) is
    kept."""
    if end is None or end.returncode == 0:
        return
    state = read_launcher_state(run_dir)  # {}: none (it died before the group formed) or not ours to mend
    if state.get("state") == "RUNNING":
        _write_state(run_dir, state="FAILED", error=end.describe(), ended=time.time())


def read_launcher_state(run_dir: Path) -> dict[str, Any]:
    """`<run_dir>/launcher.json` as a dict; {} when it is absent or not a state this module wrote: not a
    regular file (a FIFO there would hang the reader, a symlink lead outside the run), over
    MAX_LAUNCHER_STATE_BYTES, not UTF-8 JSON, nested past the parser, or not an object."""
    try:
        raw = read_capped(run_dir / LAUNCHER_STATE, MAX_LAUNCHER_STATE_BYTES, follow_symlinks=False)
        state = json.loads(raw.decode("utf-8"))
    except (OSError, ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return {}
    return state if isinstance(state, dict) else {}


def _write_state(run_dir: Path, **fields: Any) -> None:
    state = read_launcher_state(run_dir)
    state.update(fields, updated=time.time())
    atomic_write(run_dir / LAUNCHER_STATE, json.dumps(state, indent=1), fsync=False)


def run_element(config_path: str | Path, run_dir: str | Path, lifecycle: Lifecycle | None = None) -> Any:
    """Run this rank of one element; returns the entrypoint's result. `lifecycle`: the caller's, to read
    how the run ended (e.g. `interrupted_by`); by default one for this process."""

    run_dir = Path(run_dir)
    cfg = load_resolved(config_path)
    env = DistEnv.from_environ()
    lifecycle = lifecycle or Lifecycle.for_this_process()
    # Scoped: a 1-rank element runs inside the caller's process (`hpcrl run`, tests), whose later
    # sbatch calls must not inherit this element's MASTER_PORT and RANK, nor keep its signal handlers.
    with scoped_environ(env.torchrun_environ()), lifecycle.installed():
        return _run_rank(cfg, env, run_dir, lifecycle)


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


def _run_rank(cfg: ExperimentConfig, env: DistEnv, run_dir: Path, lifecycle: Lifecycle) -> Any:
    fn = load_entrypoint(entrypoint_of(cfg))
    with contextlib.ExitStack() as lock:
        refusal = _take_run_lock(lock, cfg, run_dir) if env.rank == 0 else None
        result = _run_in_group(fn, cfg, env, run_dir, lifecycle, refusal)
        return _finish(result, env, run_dir, lifecycle)


def _take_run_lock(stack: contextlib.ExitStack, cfg: ExperimentConfig, run_dir: Path) -> RunLocked | None:
    """Rank 0: hold the writer lock until `stack` closes; the refusal is returned, to be raised on every
    rank together (`_agree_on_lock`)."""
    try:
        stack.enter_context(writer_lock(lock_targets(run_dir, cfg.checkpoint.dir)))
    except RunLocked as refusal:
        return refusal
    return None


def _agree_on_lock(refusal: RunLocked | None, env: DistEnv) -> None:
    """Every rank raises when rank 0 could not take the lock. broadcast_object_list: it works on every
    backend (NCCL included) and the payload is our own rank 0's text."""
    import torch.distributed as dist

    message = [str(refusal) if refusal is not None else None]
    if env.world_size > 1:
        dist.broadcast_object_list(message, src=0)
    if refusal is not None:
        raise refusal
    if message[0] is not None:
        raise RunLocked(Problem(f"rank 0 could not take the writer lock: {message[0]}"))


def _with_inputs(cfg: ExperimentConfig, env: DistEnv, run_dir: Path) -> ExperimentConfig:
    """The config with the element's inputs bound (hpcrl.launcher.inputs): rank 0 chooses and verifies,
    every rank gets its values or its refusal (broadcast_object_list: any backend; rank 0's own data)."""
    import torch.distributed as dist

    answer: list[Any] = [None]
    if env.rank == 0:
        try:
            inputs = read_inputs(run_dir)
            data = to_dict(cfg) if inputs else {}
            answer = [
                ("ok", bind_inputs(run_dir, inputs, {i.key: get_dotted(data, i.key, None) for i in inputs}))
            ]
        except ConfigError as err:
            answer = [("refused", [(p.message, p.file, p.key) for p in err.problems])]
        except Exception as err:  # an unreadable export file: every rank must end, not wait on rank 0
            answer = [
                ("refused", [(f"cannot bind the element's inputs: {type(err).__name__}: {err}", None, None)])
            ]
    if env.world_size > 1:
        dist.broadcast_object_list(answer, src=0)
    kind, payload = answer[0]
    if kind == "refused":
        raise ConfigError([Problem(*fields) for fields in payload])
    return replace_dotted(cfg, payload) if payload else cfg


def _run_in_group(
    fn: Callable[..., Any],
    cfg: ExperimentConfig,
    env: DistEnv,
    run_dir: Path,
    lifecycle: Lifecycle,
    refusal: RunLocked | None,
) -> Any:
    import torch.distributed as dist

    init_process_group(env, cfg.parallel.backend, cfg.parallel.timeout_s)
    try:
        _agree_on_lock(refusal, env)  # before anything is written: the run dir may be another's
        if env.rank == 0:
            _write_state(
                run_dir,
                state="RUNNING",
                job_id=env.job_id,
                restart_count=int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0),
                world_size=env.world_size,
                node=env.node_name,
                started=time.time(),
            )
        try:
            cfg = _with_inputs(cfg, env, run_dir)  # a pipeline stage: its upstream outputs, chosen, verified
            return fn(cfg, run_dir, lifecycle=lifecycle)
        except BaseException as err:
            # requeued from the TERM handler (ElementTask.checkpoint wrote REQUEUED, Slurm restarts the
            # job whatever ends this attempt), unless submitit refused the requeue (none left): an error
            if env.rank == 0 and not _requeue_taken_at_term(lifecycle):
                _write_state(run_dir, state="FAILED", error=f"{type(err).__name__}: {err}")
            raise
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _finish(result: Any, env: DistEnv, run_dir: Path, lifecycle: Lifecycle) -> Any:
    """After the entrypoint returned: requeue (it stopped for one, under submitit), STOPPED (it saved
    and stopped because the job is ending) or COMPLETED. Still under the writer lock."""
    # Done: a late warning signal must not kill the exiting process (Python restores the default
    # action, terminate, while it shuts down; Slurm would then call the finished element FAILED).
    lifecycle.uninstall()
    if lifecycle.requeued_at_term:  # saved at the step boundary after it (or ended first): Slurm restarts it
        _end_term_requeue(lifecycle, env.rank, run_dir)
        return result
    if lifecycle.submitit_handler is not None and lifecycle.wants_requeue:
        _requeue(lifecycle.submitit_handler, env.rank)
        return result
    if lifecycle.stopped:  # saved on SIGTERM/SIGINT: Slurm decides what comes next (requeue or the end)
        if env.rank == 0:
            _write_state(run_dir, state="STOPPED", stopped=time.time())
        return result
    if env.rank == 0:
        _write_state(run_dir, state="COMPLETED", finished=time.time())
    return result


def _requeue_taken_at_term(lifecycle: Lifecycle) -> bool:
    return lifecycle.requeued_at_term and not isinstance(lifecycle.term_requeue_ending, Exception)


def _end_term_requeue(lifecycle: Lifecycle, rank: int, run_dir: Path) -> None:
    """Rank 0 ends now as submitit's requeue ended it at the TERM (held by the lifecycle until the
    entrypoint returned): SystemExit after `scontrol requeue` (no result pickle: the job runs again), or
    submitit's refusal, which its job wrapper records as the element's error."""
    ending = lifecycle.term_requeue_ending
    if rank != 0 or ending is None:
        return
    if not _requeue_taken_at_term(lifecycle):
        _write_state(run_dir, state="FAILED", error=f"{type(ending).__name__}: {ending}")
    raise ending


REQUEUED_WHILE_STARTING = (
    "the requeue signal came while this attempt was starting, before its handlers: requeued "
    "(resumes from the last checkpoint, if any)"
)
"""What rank 0 prints when submitit's own handler requeued the attempt (ElementTask.checkpoint)."""
ENDED_WHILE_STARTING = (
    "the requeue signal came while this attempt was starting, before its handlers, and no requeue is "
    "left (max_num_timeout): the element ends"
)
"""What rank 0 prints, and launcher.json records, when submitit then refuses that requeue."""


def _requeue(submitit_handler: Callable, rank: int) -> None:
    """After a save-and-stop: rank 0 lets submitit checkpoint (ElementTask.checkpoint), `scontrol
    requeue` the element and exit non-zero. The other ranks simply return (a non-zero exit could make
    srun kill rank 0 before it requeued); the requeue ends them anyway."""
    if rank == 0:
        submitit_handler(REQUEUE_SIGNAL, None)  # scontrol requeue + sys.exit(-1)


class ElementTask(submitit.helpers.Checkpointable):
    """The callable submitit pickles for each array element: `task(config_path, run_dir)`."""

    def __call__(self, config_path: str, run_dir: str) -> Any:
        """One rank of a Slurm element (a task submitit started: a fresh interpreter per rank)."""
        from hpcrl.train.megatron_compat import fusions_off_without_cuda  # imports torch: see main

        fusions_off_without_cuda()  # before the entrypoint imports megatron-core (~2.5 s of CPU a rank)
        self._lifecycle = Lifecycle.for_this_process()  # read by `checkpoint`
        return run_element(config_path, run_dir, self._lifecycle)

    def checkpoint(self, config_path: str, run_dir: str) -> submitit.helpers.DelayedSubmission:
        """submitit's requeue hook: called by `_requeue` once the entrypoint saved and returned, by the
        TERM handler when the time limit beat the requested save, or by submitit's own handler when the
        requeue signal came before this attempt installed hpcrl's (still importing, loading its config):
        said here, as the other two say theirs, so that every requeue in the log has its reason."""
        state: dict[str, Any] = {"state": "REQUEUED", "requeue_requested": time.time()}
        lifecycle = self.__dict__.get("_lifecycle")
        if lifecycle is None or not (lifecycle.wants_requeue or lifecycle.requeued_at_term):
            refused = (requeues_left() or 0) < 0  # submitit refuses right after this returns: the job ends
            said = ENDED_WHILE_STARTING if refused else REQUEUED_WHILE_STARTING
            print(f"hpcrl: {said}", file=sys.stderr, flush=True)
            if refused:
                state = {"state": "FAILED", "error": said}
        _write_state(Path(run_dir), **state)
        return submitit.helpers.DelayedSubmission(self, config_path, run_dir)

    def __getstate__(self) -> dict:
        """What the next attempt unpickles: nothing of this one (its lifecycle holds signal handlers)."""
        return {}


def main(argv: list[str] | None = None) -> int:
    """One rank of a local run. Its error's first line goes where the launcher reads it; a config error
    is printed like the CLI does and exits 2 (the job's exit code then says config error too)."""

    config_path, run_dir = argv if argv is not None else sys.argv[1:]
    from hpcrl.train.megatron_compat import fusions_off_without_cuda  # imports torch: not at import

    fusions_off_without_cuda()  # before the entrypoint imports megatron-core (a no-op in a forked rank)
    lifecycle = Lifecycle.for_this_process()
    try:
        run_element(config_path, run_dir, lifecycle)
    except ConfigError as err:
        record_error(err)
        print(f"hpcrl: {len(err.problems)} problem(s):", file=sys.stderr)
        for problem in err.problems:
            print(f"  - {problem}", file=sys.stderr)
        return CONFIG_ERROR_EXIT
    except SystemExit:
        raise
    except BaseException as err:
        record_error(err)
        raise
    return 128 + lifecycle.interrupted_by if lifecycle.interrupted_by else 0


def server_or_rank(argv: list[str]) -> int:
    """`CONFIG RUN_DIR`: one rank; `CONFIG RUN_DIR --ranks W ...`: the element's rank server
    (hpcrl.launcher.rank_server), which forks the W ranks from itself; each then runs `main`."""
    if len(argv) == 2:
        return main(argv)
    return serve(argv, main, lambda config_path: entrypoint_of(load_resolved(config_path)))


if __name__ == "__main__":
    raise SystemExit(server_or_rank(sys.argv[1:]))
