"""The kopf glue: where the operator meets kopf, and the only part of it that imports kopf.

`run.py` (`kopf.run` with the operator's handlers), `handlers.py` (thin handlers and kopf's four
indices; importing it registers every handler), `startup.py` (every kopf setting; the startup,
login and cleanup handlers), `runtime.py` (`OperatorRuntime`: what the startup handler builds
into kopf's memo), `owner.py` (a job's Events and its children's owner references, for the
reconciler), `session.py` (kopf's aiohttp session from the client's credentials),
`namespaces.py` and `index_audit.py` (two gaps of kopf's, closed through its internals),
`transient_logs.py`, `event_refusals.py` and `kueue_watch.py` (kopf's log lines, reshaped),
`config.py` (`OperatorConfig`: the flags of `colocgrpo-operator`) and `health.py` (its probes).

Every import of kopf, its private modules included, and of aiohttp lives here: the job logic
(controller/) and the Kubernetes client (kube/) import neither (tests/test_import_boundaries.py).
Importing the package itself imports nothing: `colocgrpo-operator` reads its configuration
(config.py) before it lets kopf in.
"""
