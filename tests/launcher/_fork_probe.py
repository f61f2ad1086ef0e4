"""An entrypoint that reports how its rank was started: `tests.launcher._fork_probe:main` writes
`<run_dir>/rank_<r>.json` with its pid, parent, process group, command line and whether megatron-core was
imported before the entrypoint ran (it never imports it itself), how much of the heap it inherited frozen,
and which of its file descriptors listen on MASTER_PORT (rank 0's store socket, inherited from the server).

How the rank ends is shown by two files it leaves behind: `rank_<r>.atexit`, written by an atexit
handler, and `rank_<r>.thread`, written by a non-daemon thread once the main thread is done (joining the
main thread returns only when interpreter exit, or hpcrl's `exit_rank`, has begun the shutdown that
joins the other threads)."""

from __future__ import annotations

import atexit
import contextlib
import gc
import json
import os
import socket
import sys
import threading
from pathlib import Path


def main(cfg, run_dir: Path, lifecycle=None) -> None:
    rank = int(os.environ["RANK"])
    report = {
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "pgid": os.getpgid(0),
        "cmdline": Path("/proc/self/cmdline").read_bytes().decode().split("\0")[:-1],
        "megatron_preloaded": "megatron.core" in sys.modules,
        "rank_env": [os.environ[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")],
        "frozen_objects": gc.get_freeze_count(),
        "omp_threads": os.environ.get("OMP_NUM_THREADS"),
        "torch_threads": sys.modules["torch"].get_num_threads() if "torch" in sys.modules else None,
        "store_fd": os.environ.get("HPCRL_STORE_FD"),
        "listening_on_master_port": _listening_on(int(os.environ["MASTER_PORT"])),
    }
    (Path(run_dir) / f"rank_{rank}.json").write_text(json.dumps(report))
    atexit.register(Path(run_dir, f"rank_{rank}.atexit").write_text, "ran")
    threading.Thread(
        target=_write_after_the_main_thread, args=(Path(run_dir, f"rank_{rank}.thread"),)
    ).start()


def _write_after_the_main_thread(path: Path) -> None:
    threading.main_thread().join()
    path.write_text("joined")


def _listening_on(port: int) -> list[int]:
    """This process's file descriptors that are sockets listening on `port`."""
    found = []
    for name in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError), socket.socket(fileno=os.dup(int(name))) as sock:
            if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN) and sock.getsockname()[1] == port:
                found.append(int(name))
    return found
