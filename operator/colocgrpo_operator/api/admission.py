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


def policy_and_binding(
    name: str, operations: list[str], resource: str, spec: dict[str, Any], action: str = "Deny"
) -> list[dict[str, Any]]:
    """A ValidatingAdmissionPolicy over ColocGRPOJobs (`resource`: colocgrpojobs or a subresource of it) and its
    binding, both cluster-scoped and called `name`; `spec` adds the policy's conditions, variables and
    validations; `action` is the binding's (Deny refuses, Warn makes the API server warn)."""
    match = {
        "resourceRules": [
            {"apiGroups": [GROUP], "apiVersions": ["*"], "operations": operations, "resources": [resource]}
        ]
    }
    policy = {
        "apiVersion": ADMISSION_API_VERSION,
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {"failurePolicy": "Fail", "matchConstraints": match, **spec},
    }
    binding = {
        "apiVersion": ADMISSION_API_VERSION,
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {"policyName": name, "validationActions": [action]},
    }
    return [policy, binding]


def trainer_status_policy(name: str = TRAINER_STATUS_POLICY) -> list[dict[str, Any]]:
    """The policy and its binding (both cluster-scoped, both called `name`)."""
    return policy_and_binding(
        name,
        ["UPDATE"],
        f"{PLURAL}/status",
        {
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
    )
