"""Stage `cli`: the `tessera` command."""
from tessera.cli.main import main

__all__ = ["main"]
