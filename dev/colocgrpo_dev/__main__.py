"""`python -m colocgrpo_dev`: the same as the `colocgrpo-dev` command."""

import sys

from colocgrpo_dev.cli import main

sys.exit(main())
