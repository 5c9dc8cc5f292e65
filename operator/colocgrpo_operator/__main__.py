"""`python -m colocgrpo_operator`: the operator daemon, as `colocgrpo-operator` runs it."""

import sys

from colocgrpo_operator.daemon import main

sys.exit(main())
