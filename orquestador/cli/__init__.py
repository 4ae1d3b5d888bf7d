"""The `orquestador` command line: one module per command group, output in `output.py`."""

from orquestador.cli.main import main

__all__ = ["main"]
