"""The child that runs user code: `python -m hpcrl.usercode.worker SPEC FD_IN FD_OUT FD_LIFELINE MEMORY [INIT]`.

It bounds its own memory (RLIMIT_DATA, set before any user code is imported: a limit set from the parent
would need a preexec hook, unsafe in a process with threads), imports the function once, says it is
ready (with INIT, a JSON list, the function is a factory called once with it: its result is what
each request calls), then answers one request per call until its input closes. Requests and replies are JSON frames
(hpcrl.usercode.frames) on pipes of their own, so whatever the function prints (stdout and stderr go to
the parent's capture) cannot corrupt them. A thread waits on the lifeline pipe, which the parent holds
open and never writes: when the parent dies it closes, and the thread kills this process group (the
function's own children included) even while the function is still running.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import sys
import threading
import traceback

from hpcrl.usercode.frames import read_frame, write_frame
from hpcrl.usercode.spec import load_function

TRACEBACK_CHARS = 4000
"""The end of the function's traceback sent back with its error."""


def main(argv: list[str]) -> int:
    spec, fd_in, fd_out, fd_lifeline, memory_bytes, *init = argv
    if int(memory_bytes) > 0:
        resource.setrlimit(resource.RLIMIT_DATA, (int(memory_bytes), int(memory_bytes)))
    threading.Thread(target=_die_with_parent, args=(int(fd_lifeline),), daemon=True).start()
    with (
        os.fdopen(int(fd_in), "rb", buffering=0) as requests,
        os.fdopen(int(fd_out), "wb", buffering=0) as replies,
    ):
        try:
            fn = load_function(spec)
            if init:
                fn = fn(*json.loads(init[0]))
        except BaseException as err:  # noqa: BLE001 - reported to the parent, which decides
            write_frame(replies, {"error": _described(err)})
            return 1
        write_frame(replies, {"ready": os.getpid()})
        while (request := read_frame(requests)) is not None:
            try:
                reply = {"value": fn(*request["args"])}
            except BaseException as err:  # noqa: BLE001 - the user's code may raise anything
                reply = {"error": _described(err)}
            write_frame(replies, reply)
    return 0


def _described(err: BaseException) -> dict[str, str]:
    trace = "".join(traceback.format_exception(err))
    return {
        "type": type(err).__name__,
        "message": str(err)[:TRACEBACK_CHARS],
        "traceback": trace[-TRACEBACK_CHARS:],
    }


def _die_with_parent(lifeline: int) -> None:
    while os.read(lifeline, 1):
        pass  # the parent never writes: only its end (EOF) returns
    os.killpg(0, signal.SIGKILL)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
