"""The ValidatingAdmissionPolicy that keeps the trainer to `status.progress`.

Each job's trainer runs as the ServiceAccount `<job>-trainer`, whose Role lets it patch that one
job's status subresource (render/rbac.py): RBAC names objects and subresources, never fields, so
without this policy the trainer's token could rewrite the phase, the restart count or the
completion time. The policy matches only that account writing that job's status, and refuses any
change outside `status.progress`; the operator and users are not matched (docs/decisions.md).

In a policy, objects are plain maps at run time (not typed by the CRD's schema), so the rule
compares every status key except `progress`, including keys a later API version may add.
"""

from __future__ import annotations

from typing import Any

from colocgrpo_operator.api.naming import GROUP, PLURAL, TRAINER_ACCOUNT_SUFFIX, TRAINER_STATUS_POLICY

ADMISSION_API_VERSION = "admissionregistration.k8s.io/v1"

# The request comes from the ServiceAccount named after the job it writes (same namespace).
TRAINER_OF_THIS_JOB = (
    "request.userInfo.username == 'system:serviceaccount:' + request.namespace + ':' + request.name"
    f" + '{TRAINER_ACCOUNT_SUFFIX}'"
)
# Every status key but progress is unchanged: none added, none removed, none edited.
ONLY_PROGRESS_CHANGES = (
    "variables.new.all(k, k == 'progress' || (k in variables.old && variables.new[k] == variables.old[k]))"
    " && variables.old.all(k, k == 'progress' || k in variables.new)"
)


def trainer_status_policy(name: str = TRAINER_STATUS_POLICY) -> list[dict[str, Any]]:
    """The policy and its binding (both cluster-scoped, both called `name`)."""
    policy = {
        "apiVersion": ADMISSION_API_VERSION,
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": [GROUP],
                        "apiVersions": ["*"],
                        "operations": ["UPDATE"],
                        "resources": [f"{PLURAL}/status"],
                    }
                ]
            },
            "matchConditions": [{"name": "trainer-of-this-job", "expression": TRAINER_OF_THIS_JOB}],
            "variables": [
                {"name": "new", "expression": "has(object.status) ? object.status : {}"},
                {"name": "old", "expression": "has(oldObject.status) ? oldObject.status : {}"},
            ],
            "validations": [
                {
                    "expression": ONLY_PROGRESS_CHANGES,
                    "messageExpression": (
                        "'the trainer of ColocGRPOJob ' + request.name + ' may change status.progress only; "
                        "the rest of the status belongs to the operator'"
                    ),
                    "reason": "Forbidden",
                }
            ],
        },
    }
    binding = {
        "apiVersion": ADMISSION_API_VERSION,
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {"policyName": name, "validationActions": ["Deny"]},
    }
    return [policy, binding]
