"""The kopf operator: reconciles ColocGRPOJobs into gangs and reports what really happens.

Importing `colocgrpo_operator.controller.handlers` registers every kopf handler (and the
startup settings); `colocgrpo operator` runs them. `status` is the pure core.
"""
