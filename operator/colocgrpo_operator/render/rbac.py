"""ServiceAccount, Role and RoleBinding `<job>-trainer`: the trainer may touch only its own job.

Rank 0 reads its ColocGRPOJob and merge-patches `status.progress`; nothing else. The
Role names the one object (resourceNames), so a compromised trainer cannot edit other
jobs or its own spec.
"""

from __future__ import annotations

from typing import Any

from colocgrpo_operator.api.model import ColocGRPOJob
from colocgrpo_operator.api.naming import GROUP, PLURAL, trainer_account_name
from colocgrpo_operator.render.workload import object_meta


def render_service_account(job: ColocGRPOJob) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": object_meta(job, trainer_account_name(job.name)),
        "automountServiceAccountToken": True,
    }


def render_role(job: ColocGRPOJob) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": object_meta(job, trainer_account_name(job.name)),
        "rules": [
            {
                "apiGroups": [GROUP],
                "resources": [f"{PLURAL}/status"],
                "resourceNames": [job.name],
                "verbs": ["get", "patch"],
            },
            {"apiGroups": [GROUP], "resources": [PLURAL], "resourceNames": [job.name], "verbs": ["get"]},
        ],
    }


def render_role_binding(job: ColocGRPOJob) -> dict[str, Any]:
    name = trainer_account_name(job.name)
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": object_meta(job, name),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": job.namespace}],
    }
