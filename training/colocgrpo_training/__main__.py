"""`python -m colocgrpo_training --config FILE`."""

import sys

from colocgrpo_training.entrypoint import main

sys.exit(main())
