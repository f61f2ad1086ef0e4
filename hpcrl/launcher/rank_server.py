"""The fork server of a local element: one process imports torch, megatron-core and the element's
entrypoint once, then forks the element's W ranks from itself.

Why: every rank started as its own interpreter imports torch and megatron-core again (~7 s of CPU per
rank on 2 cores), so 8 local ranks took 4.4x as long to start as one. A rank forked from a process that
has imported them starts in milliseconds (benchmarks/startup.py measures both).

Run by hpcrl.launcher.ranks.start_ranks as `python -m hpcrl.launcher.element CONFIG RUN_DIR --ranks W
--ends DIR`: the server leads the element's process group (so `hpcrl cancel`'s ownership check,
hpcrl.launcher.local.runs_element, still reads the element's own command line), ignores SIGINT and SIGTERM
(they reach every rank through the group; the server must outlive its ranks to report how they ended) and
dies with its launcher (PR_SET_PDEATHSIG, set by the launcher); each rank dies with the server the same
way, so a killed launcher still takes every rank with it.

The rendezvous port: the server binds and listens on 127.0.0.1:0 before anything else, and rank 0
hosts the TCP store on that very socket (STORE_FD_ENV): no other process can take the port between its
choice and rank 0's store (a port found free by the launcher and bound by rank 0 seconds later, after
the imports, was taken in between by another job's gloo socket in a loaded CI run).

Fork safety: before forking the server runs no torch op and initialises no CUDA (importing torch does
neither; `fork_safety_problems` checks it) and has one Python thread, so a rank inherits no thread pool,
CUDA context or lock held by another thread. Each rank gets its torchrun-style environment
(`rank_environ`) before any of its code runs and default signal dispositions.

Why a forked rank costs little CPU (measured on 2 cores, `hpcrl run templates/grpo_tiny.yaml
--parallel.data 8`, one step: 22 s of CPU without the two points below, 9 s with them, 6.3 s for one
rank in-process):
- The server freezes its heap before forking (`gc.freeze()`, what the gc docs advise before a fork):
  the millions of objects torch, megatron-core and transformers create move to the permanent generation,
  so a rank's full collections no longer walk them (and no longer write to their pages, which the kernel
  would copy into every rank).
- A rank whose entrypoint returned ends with `os._exit`, as multiprocessing's fork children do, after
  what interpreter exit owes it (`exit_rank`): non-daemon threads joined, atexit handlers run (which
  multiprocessing's children skip), stdio flushed. It skips the teardown that deallocates every
  inherited module (each rank would copy the whole heap to do it), so objects' `__del__` does not run
  at exit: an entrypoint closes the files it writes (hpcrl's sinks, checkpoints and exports do), or
  runs with HPCRL_LOCAL_RANK_START=exec. A rank that raised leaves the server's stack and exits the
  normal way (its traceback printed).

Files in DIR (the launcher's only view of ranks it did not fork): `<rank>.pid` once forked,
`<rank>.end` ({"pid", "returncode"}, Popen's convention: minus the signal that killed it) once reaped,
and the rank's own error record `<rank>.json` (hpcrl.launcher.ranks.record_error).
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import ctypes
import gc
import importlib
import json
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from hpcrl.distributed.env import AGENT_STORE_ENV, STORE_FD_ENV
from hpcrl.distributed.spawn import RANK_MODULES

if TYPE_CHECKING:
    from typing import NoReturn

START_MODES = ("fork", "exec")
"""fork: ranks forked from the server after its imports (the default); exec: each rank a fresh interpreter
(`python -m hpcrl.launcher.element CONFIG RUN_DIR`), as srun starts them: the baseline of
benchmarks/startup.py, and a way out should some library not survive a fork. The launcher takes it from
START_ENV."""
START_ENV = "HPCRL_LOCAL_RANK_START"
ERROR_FILE_ENV = "HPCRL_ERROR_FILE"
"""Where a rank writes its error as JSON (rank, host, pid, error) before it exits non-zero
(hpcrl.launcher.ranks.record_error; the launcher reads it)."""
_PR_SET_PDEATHSIG = 1
STOP_SIGNALS = frozenset({signal.SIGINT, signal.SIGTERM})
"""What the launcher or `hpcrl cancel` sends the element's group to stop its ranks."""


def end_path(ends: Path, rank: int) -> Path:
    return ends / f"{rank}.end"


def pid_path(ends: Path, rank: int) -> Path:
    return ends / f"{rank}.pid"


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m hpcrl.launcher.element")
    parser.add_argument("config")
    parser.add_argument("run_dir")
    parser.add_argument("--ranks", type=int, required=True)
    parser.add_argument("--ends", type=Path, required=True)
    parser.add_argument("--start", choices=START_MODES, default="fork")
    return parser.parse_args(argv)


def preload(entrypoint: Callable[[], str] | None = None) -> list[str]:
    """Import what every rank would import first: `RANK_MODULES` and the module of `entrypoint()` (the
    config's `module:function`). A config or module that fails to load is skipped: each rank then fails
    on it and reports it, as without the server. Returns the modules imported."""
    from hpcrl.train.megatron_compat import fusions_off_without_cuda  # imports torch: the server only

    fusions_off_without_cuda()
    names = list(RANK_MODULES)
    if entrypoint is not None:
        with contextlib.suppress(Exception):  # the ranks report it, naming file and key
            names.append(entrypoint().partition(":")[0])
    loaded = []
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError:
            continue
        loaded.append(name)
    return loaded


def fork_safety_problems() -> list[str]:
    """What would make a forked rank inherit broken state: CUDA initialised, or Python threads besides
    this one (a forked child holds only the forking thread; a lock another thread held stays locked).
    `import torch` starts one native helper thread that holds nothing a rank needs (forking after it is
    what torch.multiprocessing's fork start method does too); an intra-op thread pool appears only with
    the first parallel op, which the server never runs."""
    problems = []
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        problems.append("CUDA is initialised")
    if threading.active_count() != 1:
        problems.append(f"{threading.active_count()} Python threads")
    return problems


def serve(argv: list[str], rank_main: Callable[[list[str]], int], entrypoint_of: Callable[[str], str]) -> int:
    """The server's life: preload, fork the ranks, reap them; returns 0 once every rank ended. A rank
    never returns from here: it exits with `rank_main`'s code (`exit_rank`), or `rank_main`'s exception
    propagates out of this stack (the interpreter prints it and exits 1, as in a rank of its own).
    `entrypoint_of(config_path)`: the config's `module:function` (hpcrl.launcher.element's reading)."""
    args = parse(argv)
    # The group's INT and TERM are for the ranks. Held (blocked), not ignored, until the ranks exist: one
    # that comes while the server still imports (`hpcrl cancel` right after the element started) would
    # otherwise be lost, and the ranks forked after it would run on, never told to stop.
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    store_socket = socket.create_server(("127.0.0.1", 0), backlog=max(128, args.ranks))
    if args.start == "fork":
        preload(lambda: entrypoint_of(args.config))
        problems = fork_safety_problems()
        if problems:  # the launcher then reports every rank ended as the server did, with this line
            print(f"hpcrl: the rank server cannot fork safely: {', '.join(problems)}", file=sys.stderr)
            return 1
        gc.freeze()  # the preloaded heap: never walked by a rank's collections (module docstring)
    pids: dict[int, int] = {}
    server = os.getpid()
    for rank in range(args.ranks):
        if signal.sigpending() & STOP_SIGNALS:
            break  # stopped while starting: no more ranks
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # never returns: the rank exits, or its exception leaves through this stack
            _become_rank(rank, args, server, store_socket, rank_main)
        pids[pid] = rank
        _write(pid_path(args.ends, rank), {"pid": pid})
    store_socket.close()  # rank 0 has it: a client must not wait on a queue that rank 0 never reads
    _release_stop_signals(pids, args)
    _reap(pids, args.ends)
    return 0


def _release_stop_signals(pids: dict[int, int], args: argparse.Namespace) -> None:
    """After the forks: the server ignores INT and TERM from now on (its ranks take them; it reaps). One
    that came before is not lost: with no rank forked the server dies of it, as the element would have
    without a server. Else only the last rank forked can have missed it (the check before each fork
    stopped the others: a signal pending there forked no more ranks), so that rank gets it again (a
    duplicate only if it came in the instant after that fork), and each rank never forked ends as
    killed by it, for the launcher to read."""
    came = sorted(signal.sigpending() & STOP_SIGNALS)
    if came and not pids:
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)  # the pending signal ends this process
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)  # discards the pending ones: handled below
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    if not came:
        return
    last = max(pids, key=pids.__getitem__)
    for sig in came:
        with contextlib.suppress(ProcessLookupError):
            os.kill(last, sig)
    for rank in range(len(pids), args.ranks):
        _write(end_path(args.ends, rank), {"pid": os.getpid(), "returncode": -came[-1]})


def _become_rank(
    rank: int,
    args: argparse.Namespace,
    server: int,
    store_socket: socket.socket,
    rank_main: Callable[[list[str]], int],
) -> NoReturn:
    """In the forked child: die with the server, take the rank's environment and default signal
    dispositions, run the rank. Rank 0 owns the store's socket from here (torch's store takes its file
    descriptor; exec keeps it open), the others close it."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != server:  # the server died before the prctl: nobody will tell us
        os.kill(os.getpid(), signal.SIGKILL)
    port = store_socket.getsockname()[1]
    if rank == 0:
        store_fd = store_socket.detach()
        os.set_inheritable(store_fd, True)
    else:
        store_fd = None
        store_socket.close()
    env = rank_environ(rank, args.ranks, port, args.ends / f"{rank}.json", store_fd)
    os.environ.clear()
    os.environ.update(env)
    torch, threads = sys.modules.get("torch"), env["OMP_NUM_THREADS"]
    if torch is not None and threads.isdigit() and int(threads) > 0:  # else torch's default, as in exec
        torch.set_num_threads(int(threads))  # its OpenMP runtime read the server's OMP_NUM_THREADS
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)  # one sent since the fork arrives now
    if args.start == "exec":
        os.execv(sys.executable, [sys.executable, "-m", "hpcrl.launcher.element", args.config, args.run_dir])
    sys.argv = [sys.argv[0], args.config, args.run_dir]
    exit_rank(rank_main([args.config, args.run_dir]))


def exit_rank(code: int) -> NoReturn:
    """End a forked rank whose work returned `code`: what interpreter exit does that a rank needs (join
    its non-daemon threads, e.g. an async checkpoint save; run atexit handlers, e.g. logging's flush;
    flush stdio), then `os._exit`, without deallocating the inherited heap (module docstring)."""
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C while joining: as at interpreter exit, the
        threading._shutdown()  # code stands (Py_Finalize's first step; multiprocessing's children's too)
    with contextlib.suppress(KeyboardInterrupt):
        atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a closed pipe: nothing left to tell
            stream.flush()
    os._exit(code)


def rank_environ(
    rank: int, world: int, port: int, error_file: Path, store_fd: int | None = None
) -> dict[str, str]:
    """This process's environment as rank `rank` of `world` sees it: torchrun-style variables, no
    Slurm step or torchrun agent of the launcher's own, rank 0's store socket `store_fd` when given,
    where to record its error, and OMP_NUM_THREADS unless the caller or `cluster.env` set it: this
    process's CPUs shared among the ranks (torchrun defaults it to 1 for the same reason: W ranks each
    running one OpenMP thread per core spin against each other)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("SLURM_PROCID", "SLURM_STEP_ID", "TORCHELASTIC_RUN_ID", AGENT_STORE_ENV, STORE_FD_ENV)
    }
    env.update(
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world),
        GROUP_RANK="0",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    if store_fd is not None:
        env[STORE_FD_ENV] = str(store_fd)
    env[ERROR_FILE_ENV] = str(error_file)
    env.setdefault("OMP_NUM_THREADS", str(max(1, len(os.sched_getaffinity(0)) // world)))
    return env


def _reap(pids: dict[int, int], ends: Path) -> None:
    """Wait for every rank; record how each ended (Popen's returncode) for the launcher."""
    while pids:
        pid, status = os.waitpid(-1, 0)
        rank = pids.pop(pid, None)
        if rank is None:
            continue
        code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        _write(end_path(ends, rank), {"pid": pid, "returncode": code})


def _write(path: Path, record: dict) -> None:
    """Atomically (the launcher polls for the file and reads it whole)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(record))
    os.replace(tmp, path)


def read_record(path: Path) -> dict | None:
    """A `<rank>.pid` or `<rank>.end` record; None before it is written."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None
