"""The rank processes of one local element, supervised as one job.

- The ranks are forked by the element's rank server (hpcrl.launcher.rank_server: torch and the
  entrypoint imported once, not once per rank), which leads their process group, so a stop reaches
  every rank and whatever a rank started, and the terminal's Ctrl-C reaches only the launcher, which
  decides what the ranks get.
- Ranks die with their launcher: the server asks the kernel for SIGKILL when the launcher dies, and each
  rank when the server dies (prctl PR_SET_PDEATHSIG). Chosen over a pipe the ranks watch because the
  kernel delivers it whatever state the rank is in (inside a C collective holding the GIL, or hung),
  with no thread or polling in the rank. The race "launcher died before the
  prctl" is closed by checking the parent pid right after it. Caveat: the signal follows the *thread*
  that forked the server, so `start_ranks` must run on a thread that lives as long as the launcher (the
  main thread in `hpcrl run` and in the sweep runner). Not on Linux: no such guard (a warning says so).
- The server records each rank's pid and how it ended; every rank records the first line of its error
  in its own file (ERROR_FILE_ENV, written by hpcrl.launcher.element), so the launcher can say which
  rank died, on which host, by which signal or exit code, and why, instead of the peers' "Connection reset by peer".

`supervise` is the wait: when one rank ends badly, the others get `grace_s` to end on their own (they
usually fail at their next collective) and are then SIGKILLed; a stop request (the launcher's SIGINT or
SIGTERM) is forwarded to the group, and after `grace_s` (or at a second request) it is SIGKILLed.
Exit codes: 0, CONFIG_ERROR_EXIT when the first rank to fail had a config error, RANK_DIED_EXIT when a
rank died any other way, 128 + signal number when the launcher was asked to stop (the shell's rule).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from hpcrl.launcher.rank_server import ERROR_FILE_ENV, START_ENV, end_path, pid_path, read_record

CONFIG_ERROR_EXIT = 2
"""A rank's exit code for a config error (hpcrl.errors.ConfigError): it is the job's exit code too."""
RANK_DIED_EXIT = 3
"""The job's exit code when a rank died: killed by a signal, or exited non-zero but for a config error."""
_PR_SET_PDEATHSIG = 1
_ERROR_CHARS = 200
"""A recorded error line is cut here (gloo's run to 300 characters of advice)."""
_POLL_S = 0.05
_SERVER_EXIT_S = 30.0
"""How long `Ranks.close` waits for the rank server to exit after its last rank (it only writes a file)."""


@dataclass(frozen=True)
class RankEnd:
    """How one rank ended."""

    rank: int
    world: int
    pid: int
    host: str
    returncode: int
    """Popen's: the exit code, or minus the number of the signal that killed it."""
    error: str | None = None
    """The first line of its error, when it recorded one."""

    def describe(self) -> str:
        if self.returncode < 0:
            how = f"was killed by {signal.Signals(-self.returncode).name}"
        else:
            how = f"exited with code {self.returncode}"
        why = f": {self.error}" if self.error else ""
        return f"rank {self.rank} of {self.world} (pid {self.pid}, host {self.host}) {how}{why}"


@dataclass
class StopRequests:
    """Signals the launcher received and has not acted on yet (its handler only appends)."""

    pending: list[int] = field(default_factory=list)

    def take(self) -> int | None:
        return self.pending.pop(0) if self.pending else None


@contextlib.contextmanager
def forwarded_stops(signals: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM)) -> Iterator[StopRequests]:
    """While the block runs, SIGINT/SIGTERM of this process become stop requests for `supervise` instead
    of ending it at once (which would orphan the ranks). Only on the main thread (elsewhere Python
    cannot install handlers; the requests then stay empty)."""
    requests = StopRequests()
    if threading.current_thread() is not threading.main_thread():
        yield requests
        return
    previous = {
        sig: signal.signal(sig, lambda signum, _frame: requests.pending.append(signum)) for sig in signals
    }
    try:
        yield requests
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


class Ranks:
    """The W rank processes of one element: forked by its rank server (hpcrl.launcher.rank_server), which
    leads their process group and records how each ended."""

    def __init__(self, server: subprocess.Popen, world: int, error_dir: Path) -> None:
        self.server = server
        self.world = world
        self.error_dir = error_dir
        self.host = socket.gethostname()
        self._ended: dict[int, RankEnd] = {}

    @property
    def pgid(self) -> int:
        return self.server.pid

    def pids(self) -> list[int | None]:
        """Each rank's pid, None before the server forked it."""
        records = [read_record(pid_path(self.error_dir, rank)) for rank in range(self.world)]
        return [None if r is None else r["pid"] for r in records]

    def running(self) -> bool:
        return len(self._ended) < self.world

    def end_of(self, rank: int) -> RankEnd | None:
        """How `rank` ended, once `reap` saw it end (None before)."""
        return self._ended.get(rank)

    def returncodes(self) -> list[int | None]:
        """Each rank's returncode as recorded so far (None: running); `reap` still reports them."""
        server_code = self.server.poll()
        codes = []
        for rank in range(self.world):
            record = read_record(end_path(self.error_dir, rank))
            if record is None and server_code is not None:
                # read again: the server writes its last records just before it exits (poll came first)
                record = read_record(end_path(self.error_dir, rank)) or {"returncode": server_code or 1}
            codes.append(None if record is None else record["returncode"])
        return codes

    def reap(self) -> list[RankEnd]:
        """Ranks that ended since the last call; of several, those killed by a signal first (a signal
        death is a cause, a peer's error right after it is its effect), then by rank. A rank the server
        never reported (it died: killed, or failed before forking) ended as the server did."""
        new = []
        for rank, code in enumerate(self.returncodes()):
            if rank not in self._ended and code is not None:
                self._ended[rank] = self._end_of(rank, code)
                new.append(self._ended[rank])
        return sorted(new, key=lambda end: (end.returncode >= 0, end.rank))

    def signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pgid, sig)

    def close(self) -> None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.server.wait(timeout=_SERVER_EXIT_S)
        shutil.rmtree(self.error_dir, ignore_errors=True)

    def _end_of(self, rank: int, code: int) -> RankEnd:
        recorded = _read_error(self.error_dir / f"{rank}.json") if code else {}
        pid = self.pids()[rank] or self.server.pid  # never forked: the server is who ended
        return RankEnd(
            rank, self.world, pid, str(recorded.get("host") or self.host), code, recorded.get("error")
        )


def _read_error(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def start_ranks(
    config_path: str, run_dir: str, world: int, extra_env: dict[str, str], log: IO[bytes] | None
) -> Ranks:
    """Start the W ranks of one element: its rank server (`python -m hpcrl.launcher.element CONFIG
    RUN_DIR --ranks W ...`, hpcrl.launcher.rank_server) imports torch and the entrypoint once and forks
    them."""

    error_dir = Path(tempfile.mkdtemp(prefix="hpcrl-ranks-"))
    argv = [sys.executable, "-m", "hpcrl.launcher.element", config_path, run_dir]
    argv += ["--ranks", str(world), "--ends", str(error_dir)]
    argv += ["--start", os.environ.get(START_ENV) or "fork"]
    server = subprocess.Popen(
        argv,
        env={**os.environ, **extra_env},
        stdout=log,
        stderr=subprocess.STDOUT if log is not None else None,
        process_group=0,
        preexec_fn=_die_with_launcher(),
    )
    return Ranks(server, world, error_dir)


def _die_with_launcher() -> Callable[[], None] | None:
    """The preexec function of a rank: SIGKILL when the launcher dies (see the module docstring).
    libc is loaded here, before the fork: the child only makes two system calls."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        print("hpcrl: no prctl here: ranks will outlive a killed launcher", file=sys.stderr)
        return None
    launcher = os.getpid()

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != launcher:  # it died before the prctl: nobody will tell us
            os.kill(os.getpid(), signal.SIGKILL)

    return preexec


def supervise(
    ranks: Ranks, grace_s: float, stops: StopRequests | None = None, say: Callable[[str], None] | None = None
) -> int:
    """Wait for every rank (see the module docstring for what happens on a failure or a stop request);
    reports each rank that ended badly through `say` (default: stderr), the cause first. Returns the
    job's exit code."""
    stops = stops or StopRequests()
    say = say or _say
    failure: RankEnd | None = None
    stopped_by: int | None = None
    deadline: float | None = None
    while ranks.running():
        for end in ranks.reap():
            if end.returncode != 0 and stopped_by is None:
                say(("" if failure is None else "then ") + end.describe())
                if failure is None:
                    failure, deadline = end, time.monotonic() + grace_s
        sig = stops.take()
        if sig is not None:
            deadline = _forward(ranks, sig, stopped_by is None, grace_s, say) or deadline
            stopped_by = stopped_by or sig
        if deadline is not None and time.monotonic() > deadline and ranks.running():
            say(f"ranks still running {grace_s:g}s later: SIGKILL")
            ranks.signal(signal.SIGKILL)
            deadline = None
        time.sleep(_POLL_S)
    return _exit_code(failure, stopped_by)


def _forward(ranks: Ranks, sig: int, first: bool, grace_s: float, say: Callable[[str], None]) -> float | None:
    """A stop request: the first is forwarded as is (the ranks may save and stop), a second one kills."""
    if not first:
        say(f"{signal.Signals(sig).name} again: SIGKILL")
        ranks.signal(signal.SIGKILL)
        return None
    say(f"{signal.Signals(sig).name}: stopping the ranks (SIGKILL in {grace_s:g}s if still running)")
    ranks.signal(sig)
    return time.monotonic() + grace_s


def _exit_code(failure: RankEnd | None, stopped_by: int | None) -> int:
    if stopped_by is not None:
        return 128 + stopped_by
    if failure is None:
        return 0
    return CONFIG_ERROR_EXIT if failure.returncode == CONFIG_ERROR_EXIT else RANK_DIED_EXIT


def _say(text: str) -> None:
    print(f"hpcrl: {text}", file=sys.stderr, flush=True)


def record_error(err: BaseException) -> None:
    """In a rank: write the first line of `err` where the launcher looks for it (no-op without one)."""
    path = os.environ.get(ERROR_FILE_ENV)
    if not path:
        return
    text = str(err).strip().splitlines()
    first = f"{type(err).__name__}: {text[0][:_ERROR_CHARS]}" if text else type(err).__name__
    info = {
        "rank": os.environ.get("RANK"),
        "host": os.environ.get("SLURMD_NODENAME") or socket.gethostname(),
        "pid": os.getpid(),
        "error": first,
    }
    with contextlib.suppress(OSError):
        Path(path).write_text(json.dumps(info))
