"""One verdict: what the API server admits, `colocgrpo validate` accepts and the operator runs.

Manifests come from the fuzz driver's generators (bench/fuzz.py: wrong types, out-of-range and
huge values, nulls, unknown fields and trainerArgs keys, garbage in free-form fields, 300,000-
character strings). The API server is asked as kubectl asks it (strict field validation), with
a dry run; `validate`'s verdict is `parse_job`'s, what `colocgrpo validate` runs."""

from __future__ import annotations

import random
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench import fuzz
from colocgrpo_operator.api import JobSpecError, parse_job
from colocgrpo_operator.kube.client import KubeApiError
from support.operator_harness import condition, wait_for

pytestmark = pytest.mark.cluster

GROUP_PATH = "/apis/colocgrpo.io/v1alpha1"
ADMITTED = 60


def _manifest(seed: int) -> dict:
    return fuzz.mutated(f"v{seed % 1_000_000}", random.Random(seed))


def _validate_accepts(body: dict) -> tuple[bool, str]:
    try:
        parse_job(body)
    except JobSpecError as error:
        return False, "; ".join(error.lines())
    return True, ""


def _api_admits(cluster, namespace: str, body: dict, dry_run: bool = True) -> tuple[bool, str]:
    query = {"fieldValidation": "Strict", **({"dryRun": "All"} if dry_run else {})}
    try:
        cluster.api.request("POST", f"{GROUP_PATH}/namespaces/{namespace}/colocgrpojobs", body=body, query=query)
    except KubeApiError as error:
        assert error.status in (400, 413, 422), error  # a refusal, not a failure of the API server
        return False, error.message
    return True, ""


@settings(
    max_examples=400,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(seed=st.integers(min_value=0, max_value=2**32 - 1))
def test_the_api_server_and_validate_admit_and_refuse_the_same_manifests(cluster, crd_installed, namespace, seed):
    body = _manifest(seed)
    validated, why_not = _validate_accepts(body)
    admitted, refusal = _api_admits(cluster, namespace, body)
    assert validated == admitted, f"seed {seed}: validate {validated} ({why_not}), API {admitted} ({refusal})"


def test_no_admitted_job_ends_with_an_invalid_spec(cluster, operator, op_namespace):
    """Admitted manifests, created for real: the operator judges each one valid (it may not fit
    the fake nodes, or wait: any phase but an invalid spec)."""
    names = []
    seed = 5_000_000
    while len(names) < ADMITTED:
        seed += 1
        body = _manifest(seed)
        if _validate_accepts(body)[0] and _api_admits(cluster, op_namespace, body, dry_run=False)[0]:
            names.append(body["metadata"]["name"])

    def judged() -> dict | None:
        jobs = {n: cluster.get_job(op_namespace, n) for n in names}
        return jobs if all((j.get("status") or {}).get("phase") for j in jobs.values()) else None

    jobs = wait_for(judged, 120, "a phase for every admitted job", on_timeout=operator.log_tail)
    time.sleep(2)  # a later reconcile must not change its mind either
    refused = {}
    for name in names:
        job = cluster.get_job(op_namespace, name)
        if condition(job, "SpecValid").get("status") != "True":
            refused[name] = (job["status"].get("message"), jobs[name]["spec"])
    assert not refused, "\n".join(f"{n}: {m}" for n, (m, _) in refused.items())
