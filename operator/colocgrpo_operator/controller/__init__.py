"""The job logic: what a ColocGRPOJob's status is, and what to write to make the world match it.

`status.py` is the pure core; `reconciler.py` decides with it and acts through the Kubernetes
client (kube/). kopf's handlers (kopf_glue/) call in here.
"""
