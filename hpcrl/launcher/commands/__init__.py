"""CLI command modules of the launcher (each: HELP, add_arguments(parser), main(args) -> int)."""
