"""The `hpcrl` command line: one module per subcommand (see hpcrl.cli.app for the protocol)."""

from hpcrl.cli.app import main

__all__ = ["main"]
