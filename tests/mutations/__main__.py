"""python -m tests.mutations: apply every guard mutation to a scratch copy and run its tests."""

import sys

from tests.mutations.run import main

sys.exit(main())
