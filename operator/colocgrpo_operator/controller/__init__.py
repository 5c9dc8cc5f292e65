"""The job logic: what a ColocGRPOJob's status is, and what to write to make the world match it.

`status.py` is the pure core (with `failures.py`, `workers.py`, `kueue.py`, `conditions.py` and
`objects.py`, the readers of what others wrote, beside it); `record.py` is the operator's memory of
each job, `ledger.py` its own last writes, `specs.py` each spec parsed once, `snapshots.py` the
trimmed views the indices hold, `progress_clock.py` when each job's step last moved;
`reconciler.py` decides with them and acts through the Kubernetes client (kube/), `scheduling.py`
says when reconciles run, and `housekeeping.py` is the operator-wide clock.

It imports no kopf (tests/test_import_boundaries.py): the kopf glue (kopf_glue/) calls in here and
hands the reconciler what it needs of kopf, its Event poster and its adopter.
"""
