"""status.conditions shaped like metav1.Condition, the Restarts and Reason columns, and how objects stored under
the previous schema upgrade, on a real kube-apiserver."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from colocgrpo_operator.api.crd import generate_crd
from colocgrpo_operator.controller.conditions import set_condition

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
CRD_FILE = REPO / "charts/colocgrpo-operator/crds/colocgrpojobs.colocgrpo.io.yaml"
NOW = "2026-01-01T00:00:00Z"


def _established(cluster, crd: str, timeout: float = 60) -> None:
    """Wait for the CRD's Established condition. (`kubectl wait` fails at once, rather than waiting, while a
    just-created CRD has no conditions at all.)"""
    import time

    deadline = time.monotonic() + timeout
    jsonpath = 'jsonpath={.status.conditions[?(@.type=="Established")].status}'
    while cluster.kubectl("get", "crd", crd, "-o", jsonpath, check=False).stdout.strip() != "True":
        assert time.monotonic() < deadline, f"{crd} not Established after {timeout} s"
        time.sleep(0.2)


@pytest.fixture(scope="module")
def crd_installed(kube_cluster):
    kube_cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD_FILE))
    _established(kube_cluster, "colocgrpojobs.colocgrpo.io")
    return kube_cluster


def _job(namespace: str, name: str = "cond", api_version: str = "colocgrpo.io/v1alpha1") -> str:
    job = yaml.safe_load((REPO / "examples" / "tiny-cpu.yaml").read_text())
    job["apiVersion"] = api_version
    job["metadata"] = {"name": name, "namespace": namespace}
    return json.dumps(job)


def _patch_status(cluster, resource: str, namespace: str, status: dict):
    return cluster.kubectl(
        "-n",
        namespace,
        "patch",
        resource,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps({"status": status}),
        check=False,
    )


def _condition(type_: str = "Running", **fields: object) -> dict:
    return {"type": type_, "status": "False", "reason": "Pending", "message": "", "lastTransitionTime": NOW, **fields}


@pytest.mark.parametrize(
    ("conditions", "complaint"),
    [
        ([{k: v for k, v in _condition().items() if k != "reason"}], "status.conditions[0].reason: Required value"),
        ([{k: v for k, v in _condition().items() if k != "message"}], "status.conditions[0].message: Required value"),
        (
            [{k: v for k, v in _condition().items() if k != "lastTransitionTime"}],
            "status.conditions[0].lastTransitionTime: Required value",
        ),
        ([_condition(reason="not a reason!")], "status.conditions[0].reason: Invalid value"),
        ([_condition(reason="1Leading")], "status.conditions[0].reason: Invalid value"),
        (
            [_condition(), _condition(status="True")],
            'status.conditions[1]: Duplicate value: {"type":"Running"}',
        ),
        ([_condition(lastTransitionTime="yesterday")], "status.conditions[0].lastTransitionTime"),
    ],
    ids=["no-reason", "no-message", "no-time", "bad-reason", "digit-first", "duplicate-type", "bad-time"],
)
def test_apiserver_refuses_conditions_that_metav1_would(crd_installed, namespace, conditions, complaint):
    crd_installed.kubectl("apply", "-f", "-", input=_job(namespace))
    refused = _patch_status(crd_installed, "cgj/cond", namespace, {"conditions": conditions})
    assert refused.returncode != 0 and complaint in refused.stderr, refused.stderr


def test_conditions_the_operator_writes_are_accepted_and_merge_by_type(crd_installed, namespace):
    from datetime import UTC, datetime

    crd_installed.kubectl("apply", "-f", "-", input=_job(namespace))
    now = datetime(2026, 1, 1, tzinfo=UTC)
    conditions = set_condition([], "SpecValid", True, "Valid", "the spec is valid", now, 1)
    # A reason from outside (a newer trainer, the kubelet) that the pattern would refuse is made acceptable.
    conditions = set_condition(conditions, "Failed", True, "exit code 137 (OOM)", "killed", now, 1)
    conditions = set_condition(conditions, "Running", False, "", "", now, 1)
    accepted = _patch_status(crd_installed, "cgj/cond", namespace, {"conditions": conditions, "restarts": 2})
    assert accepted.returncode == 0, accepted.stderr
    stored = json.loads(crd_installed.kubectl("-n", namespace, "get", "cgj/cond", "-o", "json").stdout)
    assert [(c["type"], c["reason"]) for c in stored["status"]["conditions"]] == [
        ("SpecValid", "Valid"),
        ("Running", "Unknown"),
        ("Failed", "exitcode137OOM"),
    ]
    # `kubectl get` shows the restarts; `-o wide` adds why the job is in its phase.
    plain = crd_installed.kubectl("-n", namespace, "get", "cgj/cond").stdout.splitlines()
    assert "RESTARTS" in plain[0].split() and "REASON" not in plain[0].split()
    wide = crd_installed.kubectl("-n", namespace, "get", "cgj/cond", "-o", "wide").stdout.splitlines()
    row = _table_row(wide[0], wide[1])
    assert (row["RESTARTS"], row["REASON"]) == ("2", "Unknown")


def _table_row(header: str, line: str) -> dict[str, str]:
    """One row of `kubectl get` output by the header's column positions (empty cells stay empty)."""
    import re

    starts = [m.start() for m in re.finditer(r"\S+", header)]
    names = header.split()
    ends = [*starts[1:], None]
    return {name: line[start:end].strip() for name, start, end in zip(names, starts, ends, strict=True)}


def _previous_crd(group: str) -> dict:
    """This CRD as the previous release had it: conditions with only type and status required, a plain list."""
    crd = generate_crd()
    crd["metadata"]["name"] = f"colocgrpojobs.{group}"
    crd["spec"]["group"] = group
    crd["spec"]["names"]["shortNames"] = ["cgjprev"]
    crd["spec"]["names"]["categories"] = ["colocgrpo-previous"]
    conditions = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"][
        "conditions"
    ]
    conditions["items"]["required"] = ["type", "status"]
    del conditions["items"]["properties"]["reason"]["pattern"]
    del conditions["x-kubernetes-list-type"], conditions["x-kubernetes-list-map-keys"]
    return crd


def test_objects_stored_under_the_previous_schema_keep_working_until_rewritten(kube_cluster, namespace):
    """A job whose conditions an older operator left without reason or message: after the CRD upgrade the
    trainer's progress patches still go through (validation ratcheting leaves unchanged fields alone), and the
    operator's next status write, which replaces the whole list with complete conditions, is accepted."""
    group = "previous-schema.colocgrpo.io"
    previous = _previous_crd(group)
    resource = f"colocgrpojobs.{group}/cond"
    try:
        kube_cluster.kubectl("apply", "--server-side", "-f", "-", input=json.dumps(previous))
        _established(kube_cluster, f"colocgrpojobs.{group}")
        kube_cluster.kubectl("apply", "-f", "-", input=_job(namespace, api_version=f"{group}/v1alpha1"))
        old_style = [{"type": "Running", "status": "True"}, {"type": "SpecValid", "status": "True", "reason": "Valid"}]
        stored = _patch_status(kube_cluster, resource, namespace, {"phase": "Running", "conditions": old_style})
        assert stored.returncode == 0, stored.stderr

        current = generate_crd()
        current["metadata"]["name"], current["spec"]["group"] = previous["metadata"]["name"], group
        current["spec"]["names"] = previous["spec"]["names"]
        kube_cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=json.dumps(current))
        _established(kube_cluster, f"colocgrpojobs.{group}")

        progress = {"progress": {"step": 3, "maxSteps": 10, "percent": 30, "lastUpdateTime": NOW}}
        ratcheted = _patch_status(kube_cluster, resource, namespace, progress)
        assert ratcheted.returncode == 0, ratcheted.stderr
        # Writing another incomplete condition is refused now...
        refused = _patch_status(
            kube_cluster, resource, namespace, {"conditions": [*old_style, {"type": "Failed", "status": "False"}]}
        )
        assert refused.returncode != 0 and "reason: Required value" in refused.stderr, refused.stderr
        # ...and the operator's rewrite of the whole list is accepted.
        from datetime import UTC, datetime

        now = datetime(2026, 1, 1, 0, 1, tzinfo=UTC)
        rewritten: list = []
        for type_, flag, reason in (("SpecValid", True, "Valid"), ("Running", True, "AllWorkersRunning")):
            rewritten = set_condition(rewritten, type_, flag, reason, "", now, 1)
        accepted = _patch_status(kube_cluster, resource, namespace, {"conditions": rewritten})
        assert accepted.returncode == 0, accepted.stderr
        status = json.loads(kube_cluster.kubectl("-n", namespace, "get", resource, "-o", "json").stdout)["status"]
        assert all({"reason", "message", "lastTransitionTime"} <= set(c) for c in status["conditions"])
        assert status["progress"]["percent"] == 30
    finally:
        kube_cluster.kubectl("delete", "crd", f"colocgrpojobs.{group}", "--ignore-not-found", check=False)
