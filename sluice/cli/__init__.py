"""The `sluice` command line; `main` is the console-script entry point."""

from sluice.cli.main import app, main

__all__ = ["app", "main"]
