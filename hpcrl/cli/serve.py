"""`hpcrl serve SWEEP [--port N] [--host H] [--refresh_s S]`: a live, read-only web page of a sweep.

The element table (state, Slurm reason, restarts, last step, last value of the chosen metric, swept
values), the elements' curves of that metric overlaid and coloured by a swept key, and one element's log
tail, refreshed every `--refresh_s` seconds (hpcrl.serve.page). Binds 127.0.0.1 unless told: on a login
node, reach it through `ssh -L PORT:127.0.0.1:PORT login-node`. Prints the URL, then serves until
Ctrl-C or SIGTERM. Exit 2 for a bad sweep directory or an address it cannot bind.
"""

from __future__ import annotations

import importlib.util
import logging
import signal
import threading

from hpcrl.errors import ConfigError, Problem
from hpcrl.launcher.sweep_manifest import load_manifest

HELP = "Serve a live, read-only web page of a sweep (element table, overlaid curves, log tails)."


def add_arguments(parser) -> None:
    parser.add_argument("sweep", help="Sweep directory (printed by submit).")
    parser.add_argument("--port", type=int, default=8050, help="Port (0: any free one, printed).")
    parser.add_argument("--host", default="127.0.0.1", help="Address to bind (default: this host only).")
    parser.add_argument("--refresh_s", type=float, default=2.0, help="Seconds between refreshes of the page.")


def main(args) -> int:
    if not 0 <= args.port <= 65535:
        raise ConfigError(Problem(f"{args.port} is not a port (0-65535)", key="--port"))
    if not 0.2 <= args.refresh_s <= 3600:
        raise ConfigError(Problem(f"{args.refresh_s} is outside 0.2..3600 seconds", key="--refresh_s"))
    load_manifest(args.sweep)  # a bad sweep directory is exit 2 before anything binds
    if importlib.util.find_spec("dash") is None:
        raise ConfigError(Problem("needs Dash: pip install 'hpcrl[serve]'", key="serve"))
    from werkzeug.serving import make_server

    from hpcrl.serve.page import build_app  # imports Dash (~0.6 s): here only, not for every command

    app = build_app(args.sweep, args.refresh_s)
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # no line per request (one every refresh)
    try:
        server = make_server(args.host, args.port, app.server, threaded=True)
    except OSError as err:
        raise ConfigError(
            Problem(f"cannot bind {args.host}:{args.port}: {err.strerror or err}", key="--port")
        ) from None
    stop = lambda *_: threading.Thread(target=server.shutdown, daemon=True).start()  # noqa: E731
    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    print(
        f"hpcrl: serving {args.sweep} at http://{args.host}:{server.server_port}/ (Ctrl-C stops)", flush=True
    )
    try:
        server.serve_forever()
    finally:
        server.server_close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0
