"""The `hpcrl` command run in this process, as tests call it."""

from __future__ import annotations

from typing import Any

from hpcrl import cli


def run_cli(capsys, *argv: Any) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `hpcrl ARGV` run by cli.main here; earlier output is dropped first."""
    capsys.readouterr()
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err
