"""`python -m orquestador.worker`: the worker daemon with settings from the environment."""

from __future__ import annotations

import sys

from orquestador.config import Settings
from orquestador.errors import ConfigError
from orquestador.worker.daemon import run_worker


def main() -> int:
    try:
        settings = Settings.from_env()
    except ConfigError as exc:
        for problem in exc.problems:
            print(f"worker: {problem}", file=sys.stderr)
        return 2
    return run_worker(settings)


if __name__ == "__main__":
    sys.exit(main())
