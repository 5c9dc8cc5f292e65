"""Kueue's labels on a ColocGRPOJob (api/queueing.py): what the operator, the renderer and `colocgrpo validate`
make of them and of their deprecated spec fields, without a cluster (tests/operator/test_kueue.py has Kueue)."""

from __future__ import annotations

import copy

import pytest

from colocgrpo_operator.api import JobSpecError, parse_job
from colocgrpo_operator.api.queueing import job_priority_class, job_queue, job_warnings
from colocgrpo_operator.render import render_children

BASE = {
    "apiVersion": "colocgrpo.io/v1alpha1",
    "kind": "ColocGRPOJob",
    "metadata": {"name": "demo", "namespace": "ns"},
    "spec": {
        "model": {"name": "m"},
        "dataset": {"name": "d"},
        "resources": {"gpusPerNode": 0},
        "rewards": [{"function": "accuracy"}],
    },
}
QUEUE = "kueue.x-k8s.io/queue-name"
PRIORITY = "kueue.x-k8s.io/priority-class"


def job(labels: dict | None = None, **scheduling) -> dict:
    obj = copy.deepcopy(BASE)
    if labels:
        obj["metadata"]["labels"] = labels
    if scheduling:
        obj["spec"]["scheduling"] = scheduling
    return obj


def batch_job(obj: dict) -> dict:
    return next(c for c in render_children(parse_job(obj)) if c["kind"] == "Job")


def test_the_labels_go_onto_the_batch_job_which_waits_for_kueue():
    parsed = parse_job(job({QUEUE: "gpu", PRIORITY: "high"}))
    assert (job_queue(parsed), job_priority_class(parsed)) == ("gpu", "high")
    assert job_warnings(parsed) == []
    rendered = batch_job(job({QUEUE: "gpu", PRIORITY: "high"}))
    assert rendered["metadata"]["labels"][QUEUE] == "gpu"
    assert rendered["metadata"]["labels"][PRIORITY] == "high"
    assert rendered["spec"]["suspend"] is True
    assert rendered["metadata"]["annotations"] == {"colocgrpo.io/suspend-requested": "true"}


def test_a_job_without_a_queue_asks_for_a_running_batch_job():
    rendered = batch_job(job())
    assert QUEUE not in rendered["metadata"]["labels"]
    assert rendered["spec"]["suspend"] is False
    assert rendered["metadata"]["annotations"] == {"colocgrpo.io/suspend-requested": "false"}


def test_the_deprecated_fields_still_work_and_warn():
    parsed = parse_job(job(queueName="gpu", workloadPriorityClassName="high"))
    assert (job_queue(parsed), job_priority_class(parsed)) == ("gpu", "high")
    assert [path for path, _ in job_warnings(parsed)] == [
        "spec.scheduling.queueName",
        "spec.scheduling.workloadPriorityClassName",
    ]
    assert all("deprecated" in message and "kueue.x-k8s.io/" in message for _, message in job_warnings(parsed))
    assert batch_job(job(queueName="gpu"))["metadata"]["labels"][QUEUE] == "gpu"
    # The same value twice is no conflict.
    assert job_queue(parse_job(job({QUEUE: "gpu"}, queueName="gpu"))) == "gpu"


@pytest.mark.parametrize(
    ("labels", "scheduling", "path"),
    [
        ({QUEUE: "gpu"}, {"queueName": "cpu"}, f"metadata.labels.{QUEUE}"),
        ({PRIORITY: "high"}, {"workloadPriorityClassName": "low"}, f"metadata.labels.{PRIORITY}"),
    ],
)
def test_a_label_and_its_field_that_disagree_are_refused_naming_both(labels, scheduling, path):
    with pytest.raises(JobSpecError) as error:
        parse_job(job(labels, **scheduling))
    ((where, message),) = error.value.errors
    assert where == path
    assert "spec.scheduling." in message and "different values" in message


def test_validate_prints_the_warning_and_exits_zero(tmp_path, capsys):
    import yaml

    from colocgrpo_operator.cli import main

    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job(queueName="gpu")))
    assert main(["validate", "-f", str(path)]) == 0
    err = capsys.readouterr().err
    assert f"{path}: warning: spec.scheduling.queueName: deprecated: put the label {QUEUE}" in err
