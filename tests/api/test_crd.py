"""The generated CRD: committed copy is current, structural, and agrees with the model."""

from __future__ import annotations

from pathlib import Path

import jsonschema
import pytest
import yaml

from colocgrpo_operator.api import JobSpecError, generate_crd, parse_job
from colocgrpo_operator.api.crd import cel_rule, crd_yaml, structural_problems
from colocgrpo_training.rules import RULES

REPO = Path(__file__).resolve().parents[2]
COMMITTED = REPO / "charts/colocgrpo-operator/crds/colocgrpojobs.colocgrpo.io.yaml"


@pytest.fixture(scope="module")
def crd() -> dict:
    return generate_crd()


@pytest.fixture(scope="module")
def schema(crd) -> dict:
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def test_committed_crd_is_the_generated_one():
    assert COMMITTED.read_text() == crd_yaml(), "run `make crd` and commit the result"
    assert yaml.safe_load(COMMITTED.read_text()) == generate_crd()


def test_committed_crd_chart_template_is_the_generated_one():
    template = REPO / "charts/colocgrpo-crds/templates/colocgrpojobs.colocgrpo.io.yaml"
    assert template.read_text() == crd_yaml(helm_template=True), "run `make crd` and commit the result"
    crd = yaml.safe_load(template.read_text())
    assert crd["metadata"].pop("annotations") == {"helm.sh/resource-policy": "keep"}
    assert crd == generate_crd()


def test_identity_and_subresources(crd):
    spec = crd["spec"]
    assert crd["metadata"]["name"] == "colocgrpojobs.colocgrpo.io"
    assert spec["scope"] == "Namespaced"
    assert spec["names"]["shortNames"] == ["cgj"]
    assert spec["names"]["kind"] == "ColocGRPOJob" and spec["names"]["plural"] == "colocgrpojobs"
    (version,) = spec["versions"]
    assert version["name"] == "v1alpha1" and version["served"] and version["storage"]
    assert version["subresources"] == {"status": {}}
    assert [c["name"] for c in version["additionalPrinterColumns"]] == [
        "Phase",
        "Nodes",
        "GPUs",
        "TP",
        "Step",
        "Reward",
        "Restarts",
        "Age",
        "Reason",
    ]
    # Only the Reason column waits for `-o wide`.
    assert [c["name"] for c in version["additionalPrinterColumns"] if c.get("priority")] == ["Reason"]


def test_conditions_are_a_list_map_of_metav1_shaped_items(schema):
    conditions = schema["properties"]["status"]["properties"]["conditions"]
    assert conditions["x-kubernetes-list-type"] == "map"
    assert conditions["x-kubernetes-list-map-keys"] == ["type"]
    item = conditions["items"]
    assert item["required"] == ["type", "status", "reason", "message", "lastTransitionTime"]
    # metav1.Condition's own bounds and reason pattern.
    reason = item["properties"]["reason"]
    assert (reason["minLength"], reason["maxLength"]) == (1, 1024)
    assert reason["pattern"] == "^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"
    assert item["properties"]["message"]["maxLength"] == 32768
    assert item["properties"]["lastTransitionTime"]["format"] == "date-time"


def test_schema_is_structural(schema):
    assert structural_problems(schema) == []


def test_structural_checker_catches_a_bad_schema():
    assert structural_problems({"type": "object", "properties": {"x": {"description": "no type"}}}) == [".x: no type"]


def _walk(node, path=""):
    yield path, node
    for name, sub in (node.get("properties") or {}).items():
        yield from _walk(sub, f"{path}.{name}")
    if isinstance(node.get("additionalProperties"), dict):
        yield from _walk(node["additionalProperties"], f"{path}[*]")
    if isinstance(node.get("items"), dict):
        yield from _walk(node["items"], f"{path}[]")


def test_status_schema_is_closed_and_metrics_are_numbers(schema):
    status = schema["properties"]["status"]
    for path, node in _walk(status, ".status"):
        assert not node.get("x-kubernetes-preserve-unknown-fields"), path
        assert "default" not in node, f"{path}: the operator and trainer own status; no API-server defaults"
    metrics = status["properties"]["progress"]["properties"]["metrics"]
    assert metrics["type"] == "object" and metrics["additionalProperties"] == {"type": "number"}
    assert status["properties"]["phase"]["enum"] == [
        "Pending",
        "Queued",
        "Suspended",
        "Starting",
        "Running",
        "Restarting",
        "Succeeded",
        "Failed",
    ]
    condition_types = status["properties"]["conditions"]["items"]["properties"]["type"]["enum"]
    assert set(condition_types) == {
        "SpecValid",
        "Queued",
        "Suspended",
        "Running",
        "Stalled",
        "Progressing",
        "Succeeded",
        "Failed",
        "PlanWarning",
    }


def test_free_form_only_where_kubernetes_types_pass_through(schema):
    from colocgrpo_operator.api.trainer_args import OWNED_KEYS, REFUSED_KEYS, RENAMED_KEYS, grpo_config_fields

    free = {path for path, node in _walk(schema) if node.get("x-kubernetes-preserve-unknown-fields")}
    # trainerArgs names each GRPOConfig argument no typed field sets (any value); other keys are unknown fields.
    trainer_args = {path for path in free if path.startswith(".spec.trainerArgs.")}
    allowed = grpo_config_fields() - set(OWNED_KEYS) - set(REFUSED_KEYS) - set(RENAMED_KEYS)
    assert trainer_args == {f".spec.trainerArgs.{key}" for key in allowed}
    assert "additionalProperties" not in schema["properties"]["spec"]["properties"]["trainerArgs"]
    assert free - trainer_args == {
        ".spec.scheduling.affinity.nodeAffinity",
        ".spec.scheduling.affinity.podAffinity",
        ".spec.scheduling.affinity.podAntiAffinity",
        ".spec.podTemplate.env[].valueFrom",
        ".spec.podTemplate.volumes[]",
        ".spec.podTemplate.volumeMounts[]",
    }
    tolerations = schema["properties"]["spec"]["properties"]["scheduling"]["properties"]["tolerations"]["items"]
    assert set(tolerations["properties"]) == {"key", "operator", "value", "effect", "tolerationSeconds"}
    assert len(tolerations["x-kubernetes-validations"]) == 3


def test_every_string_and_list_is_bounded_for_cel_cost(schema):
    for path, node in _walk(schema):
        if node.get("type") == "string" and "enum" not in node:
            assert "maxLength" in node or node.get("format") == "date-time" or path.endswith(("apiVersion", "kind")), (
                path
            )
        if node.get("type") == "array":
            assert "maxItems" in node, path


def test_bounds_in_openapi_v3_0_form(schema):
    vllm = schema["properties"]["spec"]["properties"]["vllm"]["properties"]
    util = vllm["gpuMemoryUtilization"]
    assert (util["minimum"], util["exclusiveMinimum"], util["maximum"], util["exclusiveMaximum"]) == (0, True, 1, True)
    nodes = schema["properties"]["spec"]["properties"]["resources"]["properties"]["nodes"]
    assert (nodes["minimum"], nodes["maximum"]) == (1, 4096)
    gpus = schema["properties"]["spec"]["properties"]["resources"]["properties"]["gpusPerNode"]
    assert (gpus["minimum"], gpus["maximum"]) == (0, 64)


def test_cel_rules_cover_the_cross_field_contract(schema):
    spec_rules = " ".join(r["rule"] for r in schema["properties"]["spec"]["x-kubernetes-validations"])
    assert (
        "self.resources.gpusPerNode : 1) % (" in spec_rules and "self.vllm.tensorParallelSize : 1) == 0" in spec_rules
    )
    # Every rule of the table that CEL can say is in the CRD, on the spec or on each item of its list.
    tolerations = schema["properties"]["spec"]["properties"]["scheduling"]["properties"]["tolerations"]["items"]
    generated = schema["properties"]["spec"]["x-kubernetes-validations"] + tolerations["x-kubernetes-validations"]
    assert [cel_rule(rule) for rule in RULES if rule.cel is not None] == generated
    root_rules = schema["x-kubernetes-validations"]
    paths = [r.get("fieldPath") for r in root_rules]
    assert paths.count(".metadata.name") == 2
    immutable = {r["fieldPath"] for r in root_rules if "oldSelf" in r["rule"]}
    # trainerArgs holds untyped values, which CEL cannot declare: no CEL rule may touch it,
    # or the API server refuses the whole CRD (parse_job checks its keys instead).
    spec_fields = set(schema["properties"]["spec"]["properties"]) - {"trainerArgs"}
    assert immutable == {f".spec.{f}" for f in spec_fields}
    assert not any("trainerArgs" in r["rule"] for r in root_rules)
    run_rule = next(r["rule"] for r in root_rules if r.get("fieldPath") == ".spec.runPolicy")
    assert "suspend" not in run_rule and "ttlSecondsAfterFinished" not in run_rule and "maxRestarts" in run_rule
    assert "x-kubernetes-validations" not in schema["properties"]["spec"]["properties"]["trainerArgs"]


def _openapi_validator(schema: dict) -> jsonschema.Draft4Validator:
    # OpenAPI 3.0's numeric bounds are Draft 4's; x-kubernetes-* keywords are ignored.
    return jsonschema.Draft4Validator(schema)


@pytest.mark.parametrize("example", sorted((REPO / "examples").glob("*.yaml")), ids=lambda p: p.name)
def test_examples_pass_model_and_crd_schema(example, schema):
    obj = yaml.safe_load(example.read_text())
    parse_job(obj)
    errors = list(_openapi_validator(schema).iter_errors(obj))
    assert errors == []


def test_crd_schema_and_model_reject_the_same_single_field_errors(schema):
    base = yaml.safe_load((REPO / "examples/seed-qwen14b-tp4.yaml").read_text())
    cases = {
        "spec.vllm.gpuMemoryUtilization": ("vllm", "gpuMemoryUtilization", 1.0),
        "spec.resources.nodes": ("resources", "nodes", 0),
        "spec.deepspeed.zeroStage": ("deepspeed", "zeroStage", 4),
        "spec.vllm.sleepPolicy": ("vllm", "sleepPolicy", "sometimes"),
    }
    for path, (section, field, value) in cases.items():
        obj = yaml.safe_load(yaml.safe_dump(base))
        obj["spec"].setdefault(section, {})[field] = value
        with pytest.raises(JobSpecError) as caught:
            parse_job(obj)
        assert path in dict(caught.value.errors)
        assert list(_openapi_validator(schema).iter_errors(obj)), f"CRD schema accepts bad {path}"
