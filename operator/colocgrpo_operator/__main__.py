import sys

from colocgrpo_operator.cli import main

sys.exit(main())
