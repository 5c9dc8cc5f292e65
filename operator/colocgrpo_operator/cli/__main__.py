"""`python -m colocgrpo_operator.cli ...` (used by the Makefile) is the `colocgrpo` command."""

import sys

from colocgrpo_operator.cli import main

sys.exit(main())
