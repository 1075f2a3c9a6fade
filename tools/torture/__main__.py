"""`python -m tools.torture run|soak ...` (see tools.torture.cli)."""

import sys

from tools.torture.cli import main

sys.exit(main())
