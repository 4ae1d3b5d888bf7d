"""`python -m orquestador.cli`: the same as `orquestador`."""

import sys

from orquestador.cli.main import main

sys.exit(main())
