"""`python -m colocgrpo_training --config FILE`: the same program as `colocgrpo-train`."""

from colocgrpo_training.entrypoint import console_main

console_main()
