"""Arguments shared by the template commands: TEMPLATE, `--<dotted.key> VALUE` overrides, --print_config
and --help-config.

Every leaf of ExperimentConfig is an option (`--algorithm.lr 1e-6`, `--cluster.env '{A: b}'`), hidden from
--help: ~120 keys listed there made `hpcrl submit --help` 400 lines long, each with jsonargparse's
"(type: str)" beside its real type. --help names the mechanism; `--help-config [PREFIX]` prints every
key with its type, default and docstring (hpcrl.experiment.reference). A mistyped key is refused by the CLI
with the closest key (hpcrl.cli). Values are read as YAML scalars/flow collections and checked like
template values, all at once, each problem naming `command line` and the key. The raw text must be one
line of printable text (the config text rule, hpcrl.config.text_rules) BEFORE YAML reads it: YAML would
otherwise turn "a<newline>#b" into "a" and "a<newline>b" into "a b", silently running something other
than what was typed.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from hpcrl.config.schema import TypeMismatch, check_value, leaf_types
from hpcrl.config.text_rules import text_problem
from hpcrl.config.yaml_io import loads_yaml
from hpcrl.errors import ConfigError, Problem, cut, printable
from hpcrl.experiment.config import ExperimentConfig
from hpcrl.experiment.reference import reference
from hpcrl.experiment.stage_kinds import STAGE_KINDS

OVERRIDES_HELP = """\
--<dotted.key> VALUE  set any config key, e.g. --optim.lr 1e-5 --cluster.nodes 2 (VALUE is YAML);
                      every key with its type, default and meaning: --help-config [PREFIX|STAGE]"""


class HelpConfigAction(argparse.Action):
    """`--help-config [PREFIX|STAGE]`: print the config reference (all keys, those under PREFIX, or those a
    stage reads: rl, dpo, sft) and exit 0, like --help (no template needed)."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        sys.stdout.write(reference(values or ""))
        parser.exit(0)


def add_template_arguments(parser) -> None:
    parser.add_argument("template", help="Experiment template (YAML), e.g. templates/grpo_tiny.yaml.")
    parser.add_argument(
        "--print_config",
        nargs="?",
        const="yes",
        default=None,
        help="Print the resolved config (the first element of a sweep) as YAML and exit.",
    )
    parser.add_argument(
        "--help-config",
        nargs="?",
        const="",
        default=argparse.SUPPRESS,
        metavar="PREFIX|STAGE",
        action=HelpConfigAction,
        help=f"List every config key (or those under PREFIX, or those STAGE reads: {', '.join(STAGE_KINDS)}) "
        "with its type, "
        "default and meaning; exit.",
    )
    add_override_arguments(parser)


def add_override_arguments(parser, help_text: str = OVERRIDES_HELP) -> None:
    """`--<dotted.key> VALUE` for every config key, hidden from --help (see the module docstring)."""
    overrides = parser.add_argument_group("config keys", help_text)
    for key in leaf_types(ExperimentConfig):
        overrides.add_argument(f"--{key}", type=str, default=None, help=argparse.SUPPRESS)


def overrides_from(args) -> dict[str, Any]:
    """The dotted-key overrides given on the command line, type-checked (ConfigError lists all problems)."""

    flat = args.as_dict() if hasattr(args, "as_dict") else dict(args)
    hints = leaf_types(ExperimentConfig)
    out: dict[str, Any] = {}
    problems: list[Problem] = []
    for key, hint in hints.items():
        raw = _get(flat, key)
        if raw is None:
            continue
        problem = text_problem(raw)
        if problem:
            problems.append(Problem(problem, "command line", key))
            continue
        try:
            out[key] = check_value(loads_yaml(raw, f"--{key}"), hint)
        except (TypeMismatch, ConfigError) as err:
            try:  # a str field given something YAML reads as a number/bool: take it verbatim
                out[key] = check_value(raw, hint)
            except TypeMismatch:
                label = err.label if isinstance(err, TypeMismatch) else "wrong type"
                problems.append(Problem(f"{label}: {err}", "command line", key))
    if problems:
        raise ConfigError(problems)
    return out


def _get(tree: dict, dotted: str) -> Any:
    node: Any = tree
    for part in dotted.split("."):
        if not isinstance(node, dict):
            return None
        node = node.get(part)
    return node


CELL_CHARS = 200
"""A table cell shows at most this many characters of a value (a swept value may be long)."""


def cell(value: Any):
    """A rich table cell (or title) of `value`: Text, never markup (rich reads "[...]" in a str as
    markup, and a value is data), its control characters escaped and its length cut (hpcrl.errors.cut):
    a manifest's swept value with an ESC sequence drove the terminal of whoever ran `hpcrl status`."""
    from rich.text import Text  # rich (~50 ms) only for the commands that draw a table

    return Text(cut(str(value), CELL_CHARS))


def element_record(element) -> dict:
    """One resolved element as `expand --json` prints it: index, config id, swept values, run dir, config."""
    return {
        "index": element.index,
        "config_id": element.config_id,
        "swept": element.swept,
        "run_dir": str(element.run_dir),
        "config": element.data,
    }


def print_config_if_asked(args, sweep) -> bool:
    """--print_config: write the first element's resolved config to stdout; True if it did."""
    if args.print_config is None:
        return False
    sys.stdout.write(sweep.elements[0].yaml_text())
    return True


def print_notes(notes: list[str]) -> None:
    """Notes of a check that passed (what it could not judge, what it assumed), one line each on stderr."""
    for note in notes:
        print(f"hpcrl: note: {printable(note)}", file=sys.stderr)
