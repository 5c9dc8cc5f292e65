"""`python -m bench.grpo`: the parent of a run, or with `--worker` one rank of a contender's launch."""

from __future__ import annotations

import sys

from bench.grpo.run import main

if "--worker" in sys.argv:
    # A rank of a contender's launch: it leaves as the trainer's pods do, without the interpreter's
    # finalization, where a torch process-group thread may abort it (colocgrpo_training.entrypoint).
    from colocgrpo_training.entrypoint import exit_process

    exit_process(main())
sys.exit(main())
