"""The kopf operator: reconciles ColocGRPOJobs into gangs and reports what really happens.

Importing `colocgrpo_operator.controller.handlers` registers every kopf handler (the startup,
login and cleanup ones of `startup.py` included); `colocgrpo-operator` runs them with an
`OperatorConfig` (`config.py`). `status` is the pure core.
"""
