"""`python -m tools.retention_soak run|produce|consume ...` (see tools.retention_soak.cli)."""

import sys

from tools.retention_soak.cli import main

sys.exit(main())
