"""`hpcrl` command line: a jsonargparse parser with one subcommand per registered module.

A command module exposes `HELP: str`, `add_arguments(parser) -> None` and `main(args) -> int`, and keeps
its top-level imports light (no torch), so `hpcrl --help` stays fast. Heavy imports go inside `main`.
Exit codes: 0 ok, 1 runtime/cluster failure, 2 usage or config error (all problems listed), 141
(128 + SIGPIPE) when whoever read stdout stopped reading (`hpcrl expand --json T | head -1`): quietly,
as `git log | head` ends.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
import textwrap
from collections.abc import Sequence

from jsonargparse import ArgumentParser, DefaultHelpFormatter, Namespace

from hpcrl import __version__
from hpcrl.config.schema import suggest
from hpcrl.errors import MESSAGE_CHARS, PROBLEMS_SHOWN, ClusterError, ConfigError, Problem, cut

# subcommand -> module implementing it (see module docstring for the protocol)
COMMANDS: dict[str, str] = {
    "info": "hpcrl.cli.info",
    "expand": "hpcrl.cli.expand",
    "submit": "hpcrl.cli.submit",
    "run": "hpcrl.cli.run",
    "status": "hpcrl.cli.status",
    "compare": "hpcrl.cli.compare",
    "serve": "hpcrl.cli.serve",
    "logs": "hpcrl.cli.logs",
    "cancel": "hpcrl.cli.cancel",
    "resume": "hpcrl.cli.resume",
    "ckpt": "hpcrl.cli.ckpt",
    "plan": "hpcrl.cli.plan",
    "rehearse": "hpcrl.cli.rehearse",
    "bench": "hpcrl.cli.bench",
}

DESCRIPTION = (
    "RL post-training of LLMs on Slurm clusters: check an experiment template and its sweep, submit it "
    "as array jobs, follow and resume them, or run one config on this machine."
)
EPILOG = """\
typical use:
  hpcrl expand T.yaml               list the sweep's configs (index, id, swept values); writes nothing
  hpcrl submit T.yaml --dry-run     write the configs and show the exact sbatch script(s)
  hpcrl submit T.yaml               submit the array job(s); prints the sweep directory
  hpcrl status SWEEP_DIR            the state of every element; then logs, cancel, resume
  hpcrl compare SWEEP_DIR           the elements side by side: report.md + overlaid curves
  hpcrl serve SWEEP_DIR             a live web page of the sweep (127.0.0.1:8050)
  hpcrl run T.yaml [--index N]      run one config here, in the foreground

Any config key is set with --<dotted.key> VALUE (e.g. --optim.lr 1e-5); every key with its type,
default and meaning: hpcrl submit --help-config [PREFIX|STAGE]. Help of one command: hpcrl COMMAND --help."""
COMMAND_LINE = "command line"
BROKEN_PIPE_EXIT = 128 + signal.SIGPIPE


class HelpFormatter(argparse.RawDescriptionHelpFormatter, DefaultHelpFormatter):
    """jsonargparse's help, with descriptions and epilogs kept as written (the command list above)."""


HELP_WIDTH = 100


def build_parser() -> tuple[ArgumentParser, dict[str, ArgumentParser]]:
    """The `hpcrl` parser and each subcommand's own parser (to name an unknown option's closest one)."""
    parser = _parser(prog="hpcrl", description=_fill(DESCRIPTION), epilog=EPILOG)
    parser.add_argument("--version", action="version", version=f"hpcrl {__version__}")
    subcommands = parser.add_subcommands(required=True, dest="command")
    commands = {}
    for name, module_name in COMMANDS.items():
        module = importlib.import_module(module_name)
        commands[name] = sub = _parser(description=_fill(module.HELP))
        module.add_arguments(sub)
        subcommands.add_subcommand(name, sub, help=module.HELP)
    return parser, commands


def _fill(text: str) -> str:
    """A paragraph wrapped for the help (HelpFormatter keeps line breaks as written)."""
    return textwrap.fill(text, HELP_WIDTH)


def _parser(**kwargs) -> ArgumentParser:
    # allow_abbrev=False: `--dry` for `--dry-run` is deprecated in jsonargparse, and among ~120 dotted
    # keys a prefix is more often a typo than a shorthand (it gets a "did you mean" instead).
    return ArgumentParser(exit_on_error=False, allow_abbrev=False, formatter_class=HelpFormatter, **kwargs)


def main(argv: Sequence[str | os.PathLike[str]] | None = None) -> int:
    """Run one `hpcrl` command; returns its exit code (see the module docstring). `argv` may hold paths
    (as `subprocess` takes them): each is its file system string."""
    try:
        try:
            return _main([os.fspath(arg) for arg in (sys.argv[1:] if argv is None else argv)])
        finally:  # inside the try: a reader gone before this flush is a broken pipe too
            sys.stdout.flush()
    except BrokenPipeError:
        _drop_stdout()
        return BROKEN_PIPE_EXIT


def _main(argv: list[str]) -> int:
    parser, commands = build_parser()
    unknown = unknown_options(argv, commands)
    if unknown:
        _print_problems(ConfigError(unknown))
        return 2
    try:
        args: Namespace = parser.parse_args(argv)
    except ConfigError as err:
        _print_problems(err)
        return 2
    except Exception as err:  # jsonargparse raises ArgumentError/TypeError-likes on bad usage
        # its messages span lines ('Parser key "index":\n  Expected ...'): one line, not a literal \n
        text = " ".join(line.strip() for line in str(err).splitlines() if line.strip())
        print(f"hpcrl: error: {cut(text, MESSAGE_CHARS)}", file=sys.stderr)
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


def unknown_options(argv: Sequence[str], commands: dict[str, ArgumentParser]) -> list[Problem]:
    """Every `--option` of the chosen command that it does not have, each with its closest option
    (the same "did you mean" as an unknown key in a template: hpcrl.config.schema.suggest)."""
    command = next((arg for arg in argv if not arg.startswith("-")), None)
    if command not in commands:
        return []
    # argparse keeps a parser's actions in `_actions` (so since Python 2.7; there is no public accessor)
    known = sorted(option for action in commands[command]._actions for option in action.option_strings)
    problems = []
    for arg in argv[argv.index(command) + 1 :]:
        if arg == "--":
            break
        name = arg.partition("=")[0]
        if arg.startswith("--") and name not in known:
            problems.append(Problem(f"unknown option{suggest(name, known)}", COMMAND_LINE, name))
    return problems


def _drop_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's last flush at exit raises nothing more."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


def _print_problems(err: ConfigError) -> None:
    """Every problem up to PROBLEMS_SHOWN (each bounded by Problem itself), then how many more."""
    print(f"hpcrl: {len(err.problems)} problem(s):", file=sys.stderr)
    for problem in err.problems[:PROBLEMS_SHOWN]:
        print(f"  - {problem}", file=sys.stderr)
    if len(err.problems) > PROBLEMS_SHOWN:
        print(f"  ... and {len(err.problems) - PROBLEMS_SHOWN} more", file=sys.stderr)


if __name__ == "__main__":
    raise SystemExit(main())
