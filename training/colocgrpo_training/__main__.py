"""`python -m colocgrpo_training --config FILE`."""

from colocgrpo_training.entrypoint import exit_process, main

exit_process(main())
