"""`UserCodeRunner`: call user code in a child process that can be stopped.

    runner = UserCodeRunner("rewards.py:score", timeout_s=60)
    values = runner.call(prompts, responses, answers, extras)   # UserCodeError when it fails
    runner.close()

The function runs in a worker (hpcrl.usercode.worker) started once and reused across calls (starting
Python and importing the user's module costs far more than a batch's call). The worker is the leader of
a session of its own, so everything it starts is in its process group. A call that does not return
within `timeout_s` kills that whole group (SIGKILL: the function's own children too) and is a
UserCodeTimeout; the next call starts a fresh worker. A worker that dies (a crash, the memory limit) is
replaced the same way. Before, a timed-out reward was abandoned in a daemon thread, still running and
holding its memory and CPU.

The worker's stdout and stderr are drained by a thread into a buffer of the last `output_bytes` (a
function printing 100 MB costs no more memory); each call's new output is echoed to this process's
stderr, its last OUTPUT_ECHO_BYTES escaped, and the tail goes with every error. Memory: RLIMIT_DATA of
`memory_bytes` in the worker (a MemoryError inside the function, or its death). Nothing here is
specific to rewards: a multi-turn tool environment is another function called the same way.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
import weakref
from pathlib import Path
from typing import Any

from hpcrl.errors import printable
from hpcrl.usercode.frames import HEADER, MAX_FRAME_BYTES, FrameError, decode, encode

DEFAULT_MEMORY_BYTES = 16 << 30
"""The worker's RLIMIT_DATA: heap and anonymous mappings, not the address space a library reserves."""
DEFAULT_OUTPUT_BYTES = 64 << 10
"""The worker's output kept (its tail)."""
OUTPUT_ECHO_BYTES = 4 << 10
"""The most of one call's output echoed to stderr."""
HPCRL_ROOT = str(Path(__file__).resolve().parents[2])
"""The directory holding the hpcrl package: the worker imports hpcrl.usercode.worker from there."""


class UserCodeError(Exception):
    """The user's function did not return a value; the message says why and ends with its output."""


class UserCodeTimeout(UserCodeError, TimeoutError):
    """It ran past its timeout: its process group was killed."""


class UserCodeRaised(UserCodeError):
    """It raised; `type_name` is the exception's class name, the message carries the traceback's end."""

    def __init__(self, message: str, type_name: str):
        super().__init__(message)
        self.type_name = type_name


class UserCodeDied(UserCodeError):
    """The worker ended without a reply (killed by a signal, the memory limit, os._exit)."""


class UserCodeImportFailed(UserCodeDied):
    """The worker could not import the function (or build it from `init_args`): it raised doing so, so
    every worker started for it would too."""


class _Worker:
    """One worker process and the pipes to it."""

    def __init__(self, spec: str, memory_bytes: int, output_bytes: int, init_args: list | None):
        req_r, self.req_w = os.pipe()
        self.rep_r, rep_w = os.pipe()
        life_r, self.life_w = os.pipe()
        for fd in (self.req_w, self.rep_r, self.life_w):
            os.set_inheritable(fd, False)
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, (HPCRL_ROOT, os.environ.get("PYTHONPATH")))),
        }
        argv = [
            sys.executable,
            "-m",
            "hpcrl.usercode.worker",
            spec,
            str(req_r),
            str(rep_w),
            str(life_r),
            str(memory_bytes),
            *([] if init_args is None else [json.dumps(init_args)]),
        ]
        self.proc = subprocess.Popen(
            argv,
            pass_fds=(req_r, rep_w, life_r),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: killpg reaches whatever it starts
            env=env,
        )
        for fd in (req_r, rep_w, life_r):
            os.close(fd)
        self.output = bytearray()
        self.output_total = 0
        self._output_bytes = output_bytes
        self._lock = threading.Lock()
        self._drain = threading.Thread(target=self._drain_output, name="hpcrl-usercode-output", daemon=True)
        self._drain.start()
        self._pending = b""
        self._finalizer = weakref.finalize(
            self, _kill_group, self.proc, (self.req_w, self.rep_r, self.life_w)
        )

    def _drain_output(self) -> None:
        for chunk in iter(lambda: self.proc.stdout.read1(1 << 16), b""):
            with self._lock:
                self.output_total += len(chunk)
                self.output += chunk
                del self.output[: max(0, len(self.output) - self._output_bytes)]

    def output_since(self, total: int) -> tuple[int, bytes]:
        """(bytes written since the count was `total`, the kept tail of them)."""
        with self._lock:
            new = self.output_total - total
            return new, bytes(self.output[-new:]) if new else b""

    def send(self, message: Any) -> None:
        os.write(self.req_w, encode(message))  # a request is small: one write (the pipe holds 64 KiB)

    def receive(self, deadline: float) -> Any | None:
        """The next reply, or None when `deadline` (time.monotonic) passed first; UserCodeDied at EOF."""
        while True:
            if len(self._pending) >= HEADER.size:
                (size,) = HEADER.unpack(self._pending[: HEADER.size])
                if size > MAX_FRAME_BYTES:
                    raise UserCodeDied(f"replied a frame of {size:,} bytes (at most {MAX_FRAME_BYTES:,})")
                if len(self._pending) >= HEADER.size + size:
                    body = self._pending[HEADER.size : HEADER.size + size]
                    self._pending = self._pending[HEADER.size + size :]
                    return decode(body)
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.rep_r], [], [], left)[0]:
                return None
            chunk = os.read(self.rep_r, 1 << 20)
            if not chunk:
                self.proc.wait()
                raise UserCodeDied(f"the worker ended ({_ending(self.proc.returncode)}) without a reply")
            self._pending += chunk

    def kill(self) -> None:
        self._finalizer()
        self._drain.join(timeout=10)  # its pipe is closed once the whole group is gone


def _kill_group(proc: subprocess.Popen, fds: tuple[int, ...]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


def _ending(returncode: int | None) -> str:
    if returncode is not None and returncode < 0:
        name = signal.Signals(-returncode).name
        return f"killed by {name}" + (": the memory limit or the OOM killer?" if name == "SIGKILL" else "")
    return f"exit code {returncode}"


class UserCodeRunner:
    """Calls of one function (`spec`: hpcrl.usercode.spec) in a reused, killable worker."""

    def __init__(
        self,
        spec: str,
        *,
        timeout_s: float,
        memory_bytes: int = DEFAULT_MEMORY_BYTES,
        output_bytes: int = DEFAULT_OUTPUT_BYTES,
        start_timeout_s: float = 120.0,
        init_args: list | None = None,
    ):
        """`init_args` (JSON data): `spec` names a class (or any factory) the worker calls once with
        them; its result is what each call calls (an object that keeps state between calls, e.g. the
        environments of hpcrl.env.host)."""
        self.spec, self.timeout_s, self.init_args = spec, timeout_s, init_args
        self.memory_bytes, self.output_bytes = memory_bytes, output_bytes
        self.start_timeout_s = max(start_timeout_s, timeout_s)
        """Importing the function's module (torch, a tokenizer) may take longer than a call."""
        self._worker: _Worker | None = None

    @property
    def pid(self) -> int | None:
        """The current worker's pid (None before the first call and after a kill)."""
        return None if self._worker is None else self._worker.proc.pid

    @property
    def alive(self) -> bool:
        """A worker is running (the next call reuses it; else it starts one). A worker killed from outside
        between calls counts as running until the kernel has it ready to reap; a call sent to it then
        fails as UserCodeDied, and the call after starts a fresh worker."""
        return self._worker is not None and self._worker.proc.poll() is None

    def call(self, *args: Any) -> Any:
        """The function's return value for `args` (JSON data both ways), or a UserCodeError."""
        worker = self._started()
        mark = worker.output_total
        try:
            worker.send({"args": list(args)})
            reply = worker.receive(time.monotonic() + self.timeout_s)
        except (UserCodeDied, FrameError, OSError) as err:
            self._discard()
            raise UserCodeDied(f"{err}{self._tail(worker, mark)}") from None
        finally:
            self._echo(worker, mark)
        if reply is None:
            self._discard()
            raise UserCodeTimeout(
                f"did not return within {self.timeout_s:g} s: its processes were killed{self._tail(worker, mark)}"
            )
        if "error" in reply:
            error = reply["error"]
            raise UserCodeRaised(f"{error['type']}: {error['message']}\n{error['traceback']}", error["type"])
        return reply["value"]

    def close(self) -> None:
        """Kill the worker (and everything it started)."""
        self._discard()

    def __enter__(self) -> UserCodeRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _started(self) -> _Worker:
        if self.alive:
            return self._worker
        self._discard()
        worker = _Worker(self.spec, self.memory_bytes, self.output_bytes, self.init_args)
        try:
            ready = worker.receive(time.monotonic() + self.start_timeout_s)
        except (UserCodeDied, FrameError) as err:
            worker.kill()
            raise UserCodeDied(f"{err}{self._tail(worker, 0)}") from None
        if ready is None or "ready" not in ready:
            worker.kill()
            if ready is None:
                raise UserCodeDied(
                    f"{self.spec} did not import within {self.start_timeout_s:g} s{self._tail(worker, 0)}"
                )
            error = ready["error"]
            raise UserCodeImportFailed(
                f"{self.spec} failed to import: {error['type']}: {error['message']}{self._tail(worker, 0)}"
            )
        self._worker = worker
        return worker

    def _discard(self) -> None:
        if self._worker is not None:
            self._worker.kill()
            self._worker = None

    def _tail(self, worker: _Worker, mark: int) -> str:
        new, tail = worker.output_since(mark)
        if not new:
            return ""
        return f"\n[its output, {new:,} bytes; the last {len(tail):,}:]\n{_shown(tail)}"

    def _echo(self, worker: _Worker, mark: int) -> None:
        new, tail = worker.output_since(mark)
        if new:
            shown = _shown(tail[-OUTPUT_ECHO_BYTES:])
            print(
                f"[{self.spec}] output ({new:,} bytes; the last {min(new, OUTPUT_ECHO_BYTES):,}):\n{shown}",
                file=sys.stderr,
            )


def _shown(output: bytes) -> str:
    """Output as text a terminal shows and cannot be driven by: each line's control characters escaped."""
    return "\n".join(printable(line) for line in output.decode(errors="replace").splitlines())
