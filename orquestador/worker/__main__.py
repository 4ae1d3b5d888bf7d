"""`python -m orquestador.worker`: the same as `orquestador worker`."""

from __future__ import annotations

import sys

from orquestador.cli import main

if __name__ == "__main__":
    sys.exit(main(["worker"]))
