"""`hpcrl` command line: a jsonargparse parser with one subcommand per registered module.

A command module exposes `HELP: str`, `add_arguments(parser) -> None` and `main(args) -> int`, and keeps
its top-level imports light (no torch), so `hpcrl --help` stays fast. Heavy imports go inside `main`.
Exit codes: 0 ok, 1 runtime/cluster failure, 2 usage or config error (all problems listed).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

from jsonargparse import ArgumentParser, Namespace

from hpcrl import __version__
from hpcrl.errors import MESSAGE_CHARS, PROBLEMS_SHOWN, ClusterError, ConfigError, cut

# subcommand -> module implementing it (see module docstring for the protocol)
COMMANDS: dict[str, str] = {
    "info": "hpcrl.env_info",
    "expand": "hpcrl.launcher.commands.expand",
    "submit": "hpcrl.launcher.commands.submit",
    "run": "hpcrl.launcher.commands.run",
    "status": "hpcrl.launcher.commands.status",
    "logs": "hpcrl.launcher.commands.logs",
    "cancel": "hpcrl.launcher.commands.cancel",
    "resume": "hpcrl.launcher.commands.resume",
    "ckpt": "hpcrl.ckpt.command",
    "plan": "hpcrl.plan.command",
    "bench": "hpcrl.bench.command",
}


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(prog="hpcrl", description=__doc__.splitlines()[0], exit_on_error=False)
    parser.add_argument("--version", action="version", version=f"hpcrl {__version__}")
    subcommands = parser.add_subcommands(required=True, dest="command")
    for name, module_name in COMMANDS.items():
        module = importlib.import_module(module_name)
        sub = ArgumentParser(description=module.HELP, exit_on_error=False)
        module.add_arguments(sub)
        subcommands.add_subcommand(name, sub, help=module.HELP)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    try:
        args: Namespace = parser.parse_args(argv)
    except ConfigError as err:
        _print_problems(err)
        return 2
    except Exception as err:  # jsonargparse raises ArgumentError/TypeError-likes on bad usage
        print(f"hpcrl: error: {cut(str(err), MESSAGE_CHARS)}", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[args.command])
    try:
        return int(module.main(args[args.command]) or 0)
    except ConfigError as err:
        _print_problems(err)
        return err.exit_code
    except ClusterError as err:
        print(f"hpcrl: cluster error: {err}", file=sys.stderr)
        return err.exit_code


def _print_problems(err: ConfigError) -> None:
    """Every problem up to PROBLEMS_SHOWN (each bounded by Problem itself), then how many more."""
    print(f"hpcrl: {len(err.problems)} problem(s):", file=sys.stderr)
    for problem in err.problems[:PROBLEMS_SHOWN]:
        print(f"  - {problem}", file=sys.stderr)
    if len(err.problems) > PROBLEMS_SHOWN:
        print(f"  ... and {len(err.problems) - PROBLEMS_SHOWN} more", file=sys.stderr)


if __name__ == "__main__":
    raise SystemExit(main())
