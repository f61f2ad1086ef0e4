"""The `local` executor: run elements on this machine, no Slurm needed.

An element of W = nodes * tasks_per_node ranks runs as W local processes with torchrun-style
variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR=127.0.0.1, a free MASTER_PORT); a 1-rank element
of `hpcrl run` runs in-process. `submit` with this executor starts a detached sweep runner
(`python -m hpcrl.launcher.local SWEEP_DIR INDEX...`) and returns at once; the runner runs up to
`array_parallelism` elements at a time and keeps `<sweep dir>/local/<index>.json` (state, process
group, exit code) and `<index>.log` for status / logs / cancel.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from hpcrl.config.yaml_io import atomic_write
from hpcrl.dist.spawn import free_port

LOCAL_DIR = "local"
_STRIP = ("SLURM_PROCID", "SLURM_STEP_ID", "TORCHELASTIC_RUN_ID")  # a local run is never an srun step


def rank_environ(rank: int, world: int, port: int, extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _STRIP}
    env.update(extra)
    env.update(
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world),
        GROUP_RANK="0",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    return env


def start_ranks(
    config_path: str, run_dir: str, world: int, extra_env: dict[str, str], log
) -> list[subprocess.Popen]:
    """Start the W rank processes of one element in one new process group (led by rank 0)."""
    port = free_port()
    procs: list[subprocess.Popen] = []
    for rank in range(world):
        group = {"process_group": 0 if rank == 0 else procs[0].pid}  # one group: cancel kills all ranks
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "hpcrl.launcher.element", config_path, run_dir],
                env=rank_environ(rank, world, port, extra_env),
                stdout=log,
                stderr=subprocess.STDOUT,
                **group,
            )
        )
    return procs


def wait_ranks(procs: list[subprocess.Popen], grace_s: float = 10.0) -> int:
    """Wait for all ranks; once one fails, give the others `grace_s` and then kill the group."""
    deadline = None
    while True:
        codes = [p.poll() for p in procs]
        if all(c is not None for c in codes):
            return next((c for c in codes if c != 0), 0)
        if deadline is None and any(c not in (None, 0) for c in codes):
            deadline = time.monotonic() + grace_s
        if deadline is not None and time.monotonic() > deadline:
            _kill_group(procs[0].pid, signal.SIGKILL)
        time.sleep(0.1)


def _kill_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)


def run_local(
    config_path: str | Path, run_dir: str | Path, world: int, extra_env: dict[str, str], log=None
) -> int:
    """Run one element of `world` ranks as local processes; returns the first non-zero exit code or 0."""
    procs = start_ranks(str(config_path), str(run_dir), world, extra_env, log)
    return wait_ranks(procs)


# --- detached sweep runner -------------------------------------------------------------------------


def state_path(sweep_dir: Path, index: int) -> Path:
    return sweep_dir / LOCAL_DIR / f"{index}.json"


def log_path(sweep_dir: Path, index: int) -> Path:
    return sweep_dir / LOCAL_DIR / f"{index}.log"


def read_state(sweep_dir: Path, index: int) -> dict:
    try:
        return json.loads(state_path(sweep_dir, index).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def write_state(sweep_dir: Path, index: int, **fields) -> None:
    atomic_write(state_path(sweep_dir, index), json.dumps(fields), fsync=False)


def start_runner(sweep_dir: Path, indices: list[int]) -> int:
    """Start the detached runner for `indices`; returns its pid (the 'job id' of these elements)."""
    for index in indices:
        write_state(sweep_dir, index, state="PENDING")
    with open(sweep_dir / LOCAL_DIR / "runner.log", "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "hpcrl.launcher.local", str(sweep_dir), *map(str, indices)],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    return proc.pid


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def cancel_local(sweep_dir: Path, index: int) -> None:
    """Cancel a pending element (the runner skips it) or stop a running one's process group."""
    state = read_state(sweep_dir, index)
    if state.get("state") in ("PENDING", "RUNNING"):
        write_state(sweep_dir, index, **{**state, "state": "CANCELLED"})
        if state.get("pgid"):
            _kill_group(state["pgid"], signal.SIGTERM)


def _run_sweep(sweep_dir: Path, indices: list[int]) -> None:
    from hpcrl.launcher.element import load_resolved
    from hpcrl.launcher.manifest import load_manifest

    manifest = load_manifest(sweep_dir)
    entries = [manifest.entry(i) for i in indices]
    cfgs = {e.index: load_resolved(e.config_path) for e in entries}
    parallel = max(1, min(cfgs[entries[0].index].cluster.array_parallelism, os.cpu_count() or 1))
    running: dict[int, tuple[list[subprocess.Popen], object]] = {}
    queue = list(entries)
    while queue or running:
        while queue and len(running) < parallel:
            entry = queue.pop(0)
            if read_state(sweep_dir, entry.index).get("state") == "CANCELLED":
                continue
            cfg = cfgs[entry.index]
            log = open(log_path(sweep_dir, entry.index), "ab")  # noqa: SIM115 - closed when the element ends
            world = cfg.cluster.nodes * cfg.cluster.tasks_per_node
            procs = start_ranks(entry.config_path, entry.run_dir, world, cfg.cluster.env, log)
            write_state(sweep_dir, entry.index, state="RUNNING", pgid=procs[0].pid, started=time.time())
            running[entry.index] = (procs, log)
        for index, (procs, log) in list(running.items()):
            if all(p.poll() is not None for p in procs) or any(p.poll() not in (None, 0) for p in procs):
                code = wait_ranks(procs)
                log.close()
                del running[index]
                cancelled = read_state(sweep_dir, index).get("state") == "CANCELLED"
                final = "CANCELLED" if cancelled else ("COMPLETED" if code == 0 else "FAILED")
                write_state(sweep_dir, index, state=final, exit_code=code, finished=time.time())
        time.sleep(0.2)


if __name__ == "__main__":
    _run_sweep(Path(sys.argv[1]), [int(i) for i in sys.argv[2:]])
