"""A small Kubernetes client: credentials, requests as plain dicts over urllib3, which failures are
transient, and leader election over a Lease.

`client.py` (`KubeApi`, the few API calls), `credentials.py` (in-cluster or a kubeconfig, exec
plugins included), `transient.py` (which failures a retry may not meet), `leadership.py` (one
replica of several reconciles). The operator's job logic (controller/), its kopf glue
(kopf_glue/) and the user's CLI (`watch`, `logs`) all talk to the API server through it.

It imports nothing of the operator but api/ (the ColocGRPOJob's group and kind) and metrics.py:
never kopf, aiohttp, the job logic or the glue (tests/test_import_boundaries.py).
"""
