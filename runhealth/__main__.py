"""`python -m runhealth` — the command-line interface (see runhealth.cli)."""

import sys

from runhealth.cli import main

sys.exit(main())
