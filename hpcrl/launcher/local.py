"""The `local` executor: run elements on this machine, no Slurm needed.

An element of W = nodes * tasks_per_node ranks runs as W local processes with torchrun-style
variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR=127.0.0.1, and a MASTER_PORT that the rank server
binds before any rank exists and rank 0 hosts the store on: hpcrl.launcher.rank_server), supervised as one
job (hpcrl.launcher.ranks: stops forwarded, ranks die with their launcher, a dead rank is named); a
1-rank element of `hpcrl run` runs in-process. `submit` with this executor starts a detached sweep runner
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
from collections.abc import Callable
from pathlib import Path
from typing import IO

from hpcrl.config.safe_read import read_capped
from hpcrl.config.yaml_io import atomic_write
from hpcrl.errors import ConfigError, Problem
from hpcrl.launcher.element import load_resolved, record_rank_0_end
from hpcrl.launcher.ranks import Ranks, forwarded_stops, start_ranks, supervise
from hpcrl.launcher.sweep_manifest import load_manifest

LOCAL_DIR = "local"


def run_local(
    config_path: str | Path,
    run_dir: str | Path,
    world: int,
    extra_env: dict[str, str],
    log: IO[bytes] | None = None,
    grace_s: float = 5.0,
) -> int:
    """Run one element of `world` ranks as local processes, supervised as one job (hpcrl.launcher.ranks:
    Ctrl-C/SIGTERM forwarded, then SIGKILL after `grace_s`; the ranks die with this process; a dead rank
    is named). Returns the job's exit code (0, 2 for a config error, RANK_DIED_EXIT, 128 + signal)."""
    with forwarded_stops() as stops:
        ranks = start_ranks(str(config_path), str(run_dir), world, extra_env, log)
        try:
            code = supervise(ranks, grace_s, stops)
            record_rank_0_end(Path(run_dir), ranks.end_of(0))
            return code
        finally:
            ranks.close()


# --- detached sweep runner -------------------------------------------------------------------------


def state_path(sweep_dir: Path, index: int) -> Path:
    return sweep_dir / LOCAL_DIR / f"{index}.json"


def log_path(sweep_dir: Path, index: int) -> Path:
    return sweep_dir / LOCAL_DIR / f"{index}.log"


STATE_TYPES: dict[str, tuple[type, ...]] = {
    "state": (str,),
    "pgid": (int,),
    "started": (int, float),
    "exit_code": (int,),
    "finished": (int, float),
}
"""The fields of `<sweep dir>/local/<index>.json` (write_state's callers), each of its JSON type."""
MAX_STATE_BYTES = 64 << 10


def read_state(sweep_dir: Path, index: int) -> dict:
    """The element's state record; {} before the runner wrote one. ConfigError naming the file when it
    is not a regular file of write_state's shape: its pgid is what `cancel` signals."""
    path = state_path(sweep_dir, index)
    try:
        data = json.loads(read_capped(path, MAX_STATE_BYTES, follow_symlinks=False).decode("utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, RecursionError) as err:  # UnicodeDecodeError is a ValueError
        why = getattr(err, "strerror", None) or err
        raise ConfigError(Problem(f"not a local element state: {why}", file=str(path))) from None
    problem = _state_problem(data)
    if problem:
        raise ConfigError(Problem(f"not a local element state: {problem[1]}", file=str(path), key=problem[0]))
    return data


def _state_problem(data: object) -> tuple[str | None, str] | None:
    if type(data) is not dict:
        return None, "must be a JSON object"
    for key, value in data.items():
        if type(value) not in STATE_TYPES.get(key, ()):
            return key, "unknown key" if key not in STATE_TYPES else "wrong type"
    if "pgid" in data and data["pgid"] < 2:
        return "pgid", "must be a process group id above 1"
    return None


def _state_or_empty(sweep_dir: Path, index: int) -> dict:
    """The runner's view: an unreadable record is no cancel (the runner never stops on a bad file)."""
    try:
        return read_state(sweep_dir, index)
    except ConfigError:
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


def cancel_local(sweep_dir: Path, index: int, config_path: str, run_dir: str) -> str | None:
    """Cancel a pending element (the runner skips it) or stop a running one's process group. When the
    recorded group is not this element's, nothing is written or signalled, and the returned line says
    why (else None)."""
    state = read_state(sweep_dir, index)
    if state.get("state") not in ("PENDING", "RUNNING"):
        return None
    pgid = state.get("pgid")
    if pgid is not None and not runs_element(pgid, config_path, run_dir):
        return (
            f"element {index}: process group {pgid} (recorded in {state_path(sweep_dir, index)}) is not "
            "this element's rank 0 (it ended, or the file was edited): left alone"
        )
    write_state(sweep_dir, index, **{**state, "state": "CANCELLED"})
    if pgid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGTERM)
    return None


def runs_element(pgid: int, config_path: str, run_dir: str) -> bool:
    """Whether process group `pgid` is led by this element's rank server: its leader's command line is
    the one hpcrl.launcher.ranks.start_ranks gave it (`-m hpcrl.launcher.element CONFIG RUN_DIR ...`). A pid
    reused by another program, or a number written into the state file by hand, has another command
    line (Linux: /proc; elsewhere nothing is signalled)."""
    try:
        if os.getpgid(pgid) != pgid:
            return False
        cmdline = read_capped(f"/proc/{pgid}/cmdline", 1 << 20).split(b"\0")
    except (OSError, OverflowError):
        return False
    expected = [b"-m", b"hpcrl.launcher.element", os.fsencode(config_path), os.fsencode(run_dir)]
    return cmdline[1:5] == expected


def _run_sweep(sweep_dir: Path, indices: list[int]) -> None:
    manifest = load_manifest(sweep_dir)
    entries = [manifest.entry(i) for i in indices]
    cfgs = {e.index: load_resolved(e.config_path) for e in entries}
    parallel = max(1, min(cfgs[entries[0].index].cluster.array_parallelism, os.cpu_count() or 1))
    running: dict[int, tuple[Ranks, IO[bytes]]] = {}
    queue = list(entries)
    while queue or running:
        while queue and len(running) < parallel:
            entry = queue.pop(0)
            if _state_or_empty(sweep_dir, entry.index).get("state") == "CANCELLED":
                continue
            cfg = cfgs[entry.index]
            log = open(log_path(sweep_dir, entry.index), "ab")  # noqa: SIM115 - closed when the element ends
            world = cfg.cluster.nodes * cfg.cluster.tasks_per_node
            ranks = start_ranks(entry.config_path, entry.run_dir, world, cfg.cluster.env, log)
            write_state(sweep_dir, entry.index, state="RUNNING", pgid=ranks.pgid, started=time.time())
            running[entry.index] = (ranks, log)
        for index, (ranks, log) in list(running.items()):
            codes = ranks.returncodes()
            if all(c is not None for c in codes) or any(c not in (None, 0) for c in codes):
                say = _log_writer(log)  # the launcher's report goes into the element's log
                code = supervise(ranks, cfgs[index].cluster.stop_grace_s, say=say)
                record_rank_0_end(Path(manifest.entries[index].run_dir), ranks.end_of(0))
                ranks.close()
                log.close()
                del running[index]
                cancelled = _state_or_empty(sweep_dir, index).get("state") == "CANCELLED"
                final = "CANCELLED" if cancelled else ("COMPLETED" if code == 0 else "FAILED")
                write_state(sweep_dir, index, state=final, exit_code=code, finished=time.time())
        time.sleep(0.2)


def _log_writer(log: IO[bytes]) -> Callable[[str], None]:
    def say(text: str) -> None:
        log.write(f"hpcrl: {text}\n".encode())
        log.flush()

    return say


if __name__ == "__main__":
    _run_sweep(Path(sys.argv[1]), [int(i) for i in sys.argv[2:]])
