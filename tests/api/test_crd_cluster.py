"""The generated CRD in a real kube-apiserver: accepted, defaults applied, CEL rules reject with
field-named messages, immutability after start, and rendered children accepted (server dry-run)."""

from __future__ import annotations

import copy
import json
import time
from pathlib import Path

import pytest
import yaml

from colocgrpo_operator.api import JobSpecError, parse_job
from colocgrpo_operator.render import render_children
from colocgrpo_training import rules
from support.rule_cases import broken

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
CRD_FILE = REPO / "charts/colocgrpo-operator/crds/colocgrpojobs.colocgrpo.io.yaml"


@pytest.fixture(scope="module")
def crd_installed(kube_cluster):
    kube_cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD_FILE))
    kube_cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd/colocgrpojobs.colocgrpo.io")
    # Discovery of a new resource can lag the Established condition by a moment.
    for _ in range(30):
        if kube_cluster.kubectl("get", "cgj", "-A", check=False).returncode == 0:
            break
        time.sleep(1)
    return kube_cluster


def example(name: str = "tiny-cpu.yaml") -> dict:
    return yaml.safe_load((REPO / "examples" / name).read_text())


def create(cluster, namespace: str, obj: dict):
    return cluster.kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(obj), check=False)


def test_examples_are_accepted_and_defaulted(crd_installed, namespace):
    for name in ("tiny-cpu.yaml", "seed-qwen14b-tp4.yaml"):
        result = create(crd_installed, namespace, example(name))
        assert result.returncode == 0, result.stderr
    stored = json.loads(crd_installed.kubectl("get", "cgj", "tiny-cpu", "-n", namespace, "-o", "json").stdout)
    # API-server defaults equal the model's defaults.
    assert stored["spec"]["vllm"]["gpuMemoryUtilization"] == 0.3
    assert stored["spec"]["deepspeed"]["zeroStage"] == 3
    assert stored["spec"]["runPolicy"]["maxRestarts"] == 1
    assert parse_job(stored).spec.vllm.sleep_policy.value == "auto"
    table = crd_installed.kubectl("get", "cgj", "-n", namespace).stdout
    assert table.split("\n")[0].split() == ["NAME", "PHASE", "NODES", "GPUS", "TP", "STEP", "REWARD", "RESTARTS", "AGE"]


@pytest.mark.parametrize(
    "mutate, expected",
    [
        (lambda o: o["spec"].update(vllm={"tensorParallelSize": 3}), "spec.vllm.tensorParallelSize must divide"),
        (lambda o: o["metadata"].update(name="x" * 53), "metadata.name must be at most 52"),
        (lambda o: o["spec"]["resources"].update(nodes=0), "spec.resources.nodes"),
        (
            lambda o: o["spec"].update(vllm={"tensorParallelSize": 4, "gpuMemoryUtilization": 1.0}),
            "gpuMemoryUtilization",
        ),
        (
            lambda o: o["spec"].update(
                vllm={"tensorParallelSize": 4, "offloadTrainerState": True}, deepspeed={"zeroStage": 2}
            ),
            "spec.vllm.offloadTrainerState needs spec.deepspeed.zeroStage 3",
        ),
        (
            lambda o: o["spec"].update(
                vllm={"tensorParallelSize": 4, "offloadTrainerState": True},
                deepspeed={"offloadParams": "cpu", "offloadOptimizer": "cpu"},
            ),
            "spec.vllm.offloadTrainerState cannot be combined with spec.deepspeed.offloadParams cpu",
        ),
        (
            lambda o: o["spec"].update(
                vllm={"tensorParallelSize": 4, "offloadTrainerState": True, "sleepPolicy": "off"}
            ),
            "spec.vllm.offloadTrainerState needs a sleeping spec.vllm.sleepPolicy",
        ),
        (
            lambda o: o["spec"]["resources"].update(nodes=2),
            "spec.checkpoint.claimName is required when spec.resources.nodes is more than 1",
        ),
        # Not an image reference: no kubelet could pull it, and KWOK's fake kubelet cannot even report on it.
        (lambda o: o["spec"].update(image="trainer\x7f:1"), "spec.image in body should match"),
        (lambda o: o["spec"].update(image="Trainer:latest"), "spec.image in body should match"),
        (lambda o: o["spec"].update(image="registry.example.com/team/trainer:v1 "), "spec.image in body should match"),
    ],
)
def test_api_server_rejects_with_the_field_named(crd_installed, namespace, mutate, expected):
    obj = example("seed-qwen14b-tp4.yaml")
    mutate(obj)
    result = create(crd_installed, namespace, obj)
    assert result.returncode != 0
    assert expected in result.stderr


@pytest.mark.parametrize("rule", [rule for rule in rules.RULES if rule.cel is not None], ids=lambda rule: rule.name)
def test_the_api_server_says_what_validate_says_of_each_broken_rule(crd_installed, namespace, rule):
    # One table gives both readers their rule and their words, values included (the CEL's messageExpression).
    obj = broken(rule)
    with pytest.raises(JobSpecError) as caught:
        parse_job(obj)
    ((path, message),) = caught.value.errors
    result = create(crd_installed, namespace, obj)
    assert result.returncode != 0
    words = " ".join(result.stderr.split())  # kubectl wraps nothing, but be safe about line breaks
    assert (f"{path} {message}" if rule.reports else message) in words, result.stderr


def test_spec_immutable_after_start_except_suspend_and_ttl(crd_installed, namespace):
    obj = example()
    assert create(crd_installed, namespace, obj).returncode == 0

    def patch(body: dict, *extra: str):
        return crd_installed.kubectl(
            "patch", "cgj", "tiny-cpu", "-n", namespace, "--type=merge", "-p", json.dumps(body), *extra, check=False
        )

    assert patch({"spec": {"dataset": {"split": "train[:50%]"}}}).returncode == 0  # not started yet
    started = patch({"status": {"startTime": "2026-01-01T00:00:00Z"}}, "--subresource=status")
    assert started.returncode == 0, started.stderr
    refused = patch({"spec": {"dataset": {"split": "train"}}})
    assert refused.returncode != 0 and "spec.dataset is immutable once the job has started" in refused.stderr
    refused = patch({"spec": {"runPolicy": {"maxRestarts": 5}}})
    assert refused.returncode != 0 and "spec.runPolicy" in refused.stderr
    allowed = patch({"spec": {"runPolicy": {"suspend": True, "ttlSecondsAfterFinished": 60}}})
    assert allowed.returncode == 0, allowed.stderr


def test_trainer_progress_patch_fits_the_closed_status(crd_installed, namespace):
    assert create(crd_installed, namespace, example()).returncode == 0
    progress = {"status": {"progress": {"step": 2, "maxSteps": 2, "metrics": {"reward": 0.5, "kl": 0.0}}}}
    result = crd_installed.kubectl(
        "patch", "cgj", "tiny-cpu", "-n", namespace, "--type=merge", "--subresource=status", "-p", json.dumps(progress)
    )
    assert result.returncode == 0, result.stderr
    stored = json.loads(crd_installed.kubectl("get", "cgj", "tiny-cpu", "-n", namespace, "-o", "json").stdout)
    assert stored["status"]["progress"]["metrics"] == {"reward": 0.5, "kl": 0.0}
    assert parse_job(stored).status.progress.step == 2


def test_rendered_children_are_accepted_by_the_api_server(crd_installed, namespace):
    for name, nodes in (("tiny-cpu.yaml", 1), ("seed-qwen14b-tp4.yaml", 1), ("seed-qwen14b-tp4.yaml", 2)):
        obj = copy.deepcopy(example(name))
        obj["metadata"]["namespace"] = namespace
        if nodes > 1:  # a gang across pods, with its headless Service; one checkpoint claim for every pod
            obj["spec"]["resources"]["nodes"] = nodes
            obj["spec"]["checkpoint"] = {**obj["spec"].get("checkpoint", {}), "claimName": "ckpt"}
        children = render_children(parse_job(obj))
        assert ("Service" in [c["kind"] for c in children]) is (nodes > 1)
        result = crd_installed.kubectl(
            "apply", "--dry-run=server", "-f", "-", input="\n---\n".join(json.dumps(c) for c in children), check=False
        )
        assert result.returncode == 0, result.stderr
